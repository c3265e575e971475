package main

import (
	"fmt"
	"path/filepath"
	"testing"

	"distflash/parallel"
)

// stagingCases are the worlds the device-staging tests train: every schedule on 4
// sequence-parallel ranks, the Ulysses × ring hybrid, and FSDP over 2 replicas of 2.
func stagingCases() [][]string {
	var cases [][]string
	for _, name := range parallel.Names() {
		cases = append(cases, []string{"parallelism.world_size=4", "parallelism.sequence_parallel_degree=4", "parallelism.attention=" + name})
	}
	return append(cases,
		[]string{"parallelism.world_size=4", "parallelism.sequence_parallel_degree=4", "parallelism.attention=ring", "parallelism.ulysses_degree=2"},
		[]string{"parallelism.world_size=4", "parallelism.sequence_parallel_degree=2", "parallelism.fsdp=true"})
}

// TestDeviceStagingTrainsLikeHost: ranks whose buffers are not host memory (device.kind =
// "cpu-device": only Upload and Download move them, so every exchange goes through
// transport.Staged's host copies, as a GPU rank's does) train bit for bit as the host path,
// every schedule, the hybrid and FSDP, and their attention sends the same bytes.
func TestDeviceStagingTrainsLikeHost(t *testing.T) {
	for _, c := range stagingCases() {
		t.Run(fmt.Sprint(c[1:]), func(t *testing.T) {
			host, dev := t.TempDir(), t.TempDir()
			for _, d := range []struct{ dir, kind string }{{host, "cpu"}, {dev, "cpu-device"}} {
				args := smallRun(d.dir, "--set", "training.steps=4", "--set", "device.kind="+d.kind)
				for _, s := range c {
					args = append(args, "--set", s)
				}
				mustSucceed(t, args...)
			}
			a := readMetrics(t, filepath.Join(host, "tiny", "metrics.jsonl"))
			b := readMetrics(t, filepath.Join(dev, "tiny", "metrics.jsonl"))
			for i := range a {
				if a[i].Loss != b[i].Loss || a[i].GradNorm != b[i].GradNorm || a[i].AttnBytes != b[i].AttnBytes {
					t.Errorf("step %d: host loss %v grad_norm %v attn_bytes %d; staged %v %v %d",
						a[i].Step, a[i].Loss, a[i].GradNorm, a[i].AttnBytes, b[i].Loss, b[i].GradNorm, b[i].AttnBytes)
				}
			}
			if err := sameState(stateOf(t, filepath.Join(host, "tiny")), stateOf(t, filepath.Join(dev, "tiny"))); err != nil {
				t.Errorf("the checkpoints' state differs: %v", err)
			}
		})
	}
}
