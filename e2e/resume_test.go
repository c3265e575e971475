package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"distflash/ckpt"
	"distflash/evaluate"
	"distflash/train"
)

// runBin runs the real binary with train arguments (configs/tiny.toml, 1 MiB of data, 8
// steps) plus args, in the environment env, and returns its combined output.
func runBin(t *testing.T, env []string, args ...string) (string, error) {
	t.Helper()
	base := []string{"train", "--config", "configs/tiny.toml", "--progress=false",
		"--set", "data.max_bytes=1048576", "--set", "data.batch_size=2", "--set", "training.steps=8",
		"--set", "training.warmup_steps=2"}
	cmd := exec.Command(buildBinary(t), append(base, args...)...)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// mustRun is runBin that fails the test on an error.
func mustRun(t *testing.T, args ...string) string {
	t.Helper()
	out, err := runBin(t, nil, args...)
	if err != nil {
		t.Fatalf("distflash %v: %v\n%s", args, err, out)
	}
	return out
}

// stateOf reads the weights and AdamW moments of a checkpoint.
func stateOf(t *testing.T, path string) map[string][]float32 {
	t.Helper()
	c, err := ckpt.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	out := map[string][]float32{}
	for _, name := range train.StateTensors {
		if out[name], err = c.ReadTensor(name); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

// sameState reports the first difference between two checkpoints' tensors, bit for bit.
func sameState(a, b map[string][]float32) error {
	for _, name := range train.StateTensors {
		x, y := a[name], b[name]
		if len(x) != len(y) {
			return fmt.Errorf("%s: %d vs %d elements", name, len(x), len(y))
		}
		for i := range x {
			if math.Float32bits(x[i]) != math.Float32bits(y[i]) {
				return fmt.Errorf("%s[%d]: %v vs %v", name, i, x[i], y[i])
			}
		}
	}
	return nil
}

// lossesOf reads the per-step losses of a run directory.
func lossesOf(t *testing.T, runDir string) []float64 {
	t.Helper()
	var out []float64
	for _, m := range readMetrics(t, filepath.Join(runDir, "metrics.jsonl")) {
		out = append(out, m.Loss)
	}
	return out
}

// TestResumeIsExact: 8 steps straight and 4 steps + checkpoint + a new process that resumes
// and runs 4 more give bit-identical weights, AdamW moments and losses. Checked for one
// worker in fp32 and for 2 FSDP ranks in fp16 (sharded state, loss scaler in the state).
func TestResumeIsExact(t *testing.T) {
	for _, world := range [][]string{
		nil,
		{"--set", "parallelism.world_size=2", "--set", "parallelism.sequence_parallel_degree=2",
			"--set", "parallelism.fsdp=true", "--set", "training.mixed_precision=fp16"},
	} {
		t.Run(fmt.Sprint(len(world) > 0), func(t *testing.T) {
			straight, split := t.TempDir(), t.TempDir()
			mustRun(t, append(world, "--set", "run.output_dir="+straight, "--set", "checkpoint.interval=4")...)
			out := mustRun(t, append(world, "--set", "run.output_dir="+split, "--set", "checkpoint.interval=4", "--stop-after", "4")...)
			if !strings.Contains(out, "stopped after step 4 of 8") {
				t.Fatalf("first half: %s", out)
			}
			out = mustRun(t, append(world, "--set", "run.output_dir="+split, "--set", "checkpoint.interval=4", "--resume", "auto")...)
			if !strings.Contains(out, "resume: step 4 from") {
				t.Fatalf("second half did not resume: %s", out)
			}
			a, b := filepath.Join(straight, "tiny"), filepath.Join(split, "tiny")
			if err := sameState(stateOf(t, filepath.Join(a, "step-000008")), stateOf(t, filepath.Join(b, "step-000008"))); err != nil {
				t.Errorf("step 8 straight vs resumed: %v", err)
			}
			la, lb := lossesOf(t, a), lossesOf(t, b)
			if len(la) != 8 || len(lb) != 8 {
				t.Fatalf("%d and %d metric lines, want 8", len(la), len(lb))
			}
			for i := range la {
				if la[i] != lb[i] {
					t.Errorf("step %d: loss %v straight, %v resumed", i+1, la[i], lb[i])
				}
			}
		})
	}
}

// TestResumeReshards saves with 4 FSDP ranks and resumes on 1 rank without FSDP and on 2
// FSDP ranks: every rank reads the element ranges it needs from the 4 shard files, and the
// loss curve continues as the 4-rank run's does (to summation-order tolerance).
func TestResumeReshards(t *testing.T) {
	four := []string{"--set", "parallelism.world_size=4", "--set", "parallelism.sequence_parallel_degree=4", "--set", "parallelism.fsdp=true"}
	ref := t.TempDir()
	mustRun(t, append(four, "--set", "run.output_dir="+ref)...)
	want := lossesOf(t, filepath.Join(ref, "tiny"))
	for _, world := range [][]string{
		nil,
		{"--set", "parallelism.world_size=2", "--set", "parallelism.sequence_parallel_degree=2", "--set", "parallelism.fsdp=true"},
	} {
		dir := t.TempDir()
		mustRun(t, append(four, "--set", "run.output_dir="+dir, "--stop-after", "4")...)
		out := mustRun(t, append(world, "--set", "run.output_dir="+dir, "--resume", "auto")...)
		if !strings.Contains(out, "saved by 4 ranks") {
			t.Errorf("resume does not say it re-shards: %s", out)
		}
		got := lossesOf(t, filepath.Join(dir, "tiny"))
		for i := range want {
			if d := math.Abs(got[i]-want[i]) / want[i]; d > 1e-6 {
				t.Errorf("%v step %d: loss %.8f, 4 ranks %.8f", world, i+1, got[i], want[i])
			}
		}
	}
}

// TestKillDuringSave kills the real process (SIGKILL, from inside, at a chosen point) while it
// saves step 4, for every stage of a save. The previous checkpoint stays `latest` until the
// new one is complete, both load, and resuming finishes the run with exactly the weights of
// an uninterrupted run.
func TestKillDuringSave(t *testing.T) {
	ref := t.TempDir()
	mustRun(t, "--set", "run.output_dir="+ref, "--set", "checkpoint.interval=2")
	want := stateOf(t, filepath.Join(ref, "tiny", "step-000008"))
	stages := []string{"shard written", "sidecars read", "manifest tmp", "manifest", "dir renamed",
		"run dir synced", "latest tmp", "latest renamed", "latest durable", "pruned"}
	for i, stage := range stages {
		t.Run(stage, func(t *testing.T) {
			dir := t.TempDir()
			run := filepath.Join(dir, "tiny")
			mustRun(t, "--set", "run.output_dir="+dir, "--set", "checkpoint.interval=2", "--stop-after", "2")
			out, err := runBin(t, []string{ckpt.KillAtEnv + "=" + stage}, "--set", "run.output_dir="+dir,
				"--set", "checkpoint.interval=2", "--resume", "auto")
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
				t.Fatalf("process was not killed at %q: %v\n%s", stage, err, out)
			}
			path, skipped, err := ckpt.Resolve(run, "auto")
			if err != nil || len(skipped) > 0 {
				t.Fatalf("after a kill at %q: %v (skipped %v)", stage, err, skipped)
			}
			wantStep := "step-000002"
			if i >= 7 { // from "latest renamed" on, the new checkpoint is the latest
				wantStep = "step-000004"
			}
			if filepath.Base(path) != wantStep {
				t.Errorf("after a kill at %q: latest intact checkpoint %s, want %s", stage, filepath.Base(path), wantStep)
			}
			mustRun(t, "--set", "run.output_dir="+dir, "--set", "checkpoint.interval=2", "--resume", "auto")
			if err := sameState(want, stateOf(t, filepath.Join(run, "step-000008"))); err != nil {
				t.Errorf("run killed at %q and resumed: %v", stage, err)
			}
		})
	}
}

// TestResumeDamage: a damaged newest checkpoint is named and skipped by --resume auto, which
// says so and continues from the one before; naming it explicitly is an error that names
// the file; a checkpoint of another model shape is refused with the differing keys.
func TestResumeDamage(t *testing.T) {
	dir := t.TempDir()
	run := filepath.Join(dir, "tiny")
	mustRun(t, "--set", "run.output_dir="+dir, "--set", "checkpoint.interval=2", "--stop-after", "4")
	shard := filepath.Join(run, "step-000004", "rank-00000.zst")
	b, err := os.ReadFile(shard)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)/2] ^= 0x10
	if err := os.WriteFile(shard, b, 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := runBin(t, nil, "--set", "run.output_dir="+dir, "--set", "checkpoint.interval=2", "--resume", "step-000004",
		"--stop-after", "5")
	if err == nil || !strings.Contains(out, "rank-00000.zst") {
		t.Errorf("explicit damaged checkpoint: %v\n%s", err, out)
	}
	out = mustRun(t, "--set", "run.output_dir="+dir, "--set", "checkpoint.interval=2", "--resume", "auto", "--stop-after", "5")
	if !strings.Contains(out, "skipping damaged checkpoint") || !strings.Contains(out, "rank-00000.zst") ||
		!strings.Contains(out, "resume: step 2 from") {
		t.Errorf("auto resume over a damaged latest:\n%s", out)
	}
	out, err = runBin(t, nil, "--set", "run.output_dir="+dir, "--set", "model.dim=96", "--resume", "auto")
	if err == nil || !strings.Contains(out, "model.dim") {
		t.Errorf("resume with another model shape: %v\n%s", err, out)
	}
}

// TestEvalDuringTrainingAndOfCheckpoint: eval.interval evaluates on data.eval during training
// (logged, and in metrics.jsonl), and `distflash eval` of the checkpoint saved at that step
// gives the same loss, from the checkpoint's own weights, through the real binary.
func TestEvalDuringTrainingAndOfCheckpoint(t *testing.T) {
	dir := t.TempDir()
	out := mustRun(t, "--set", "run.output_dir="+dir, "--set", "checkpoint.interval=4", "--set", "eval.interval=4",
		"--set", "data.eval=$GOROOT/src/strings", "--set", "eval.samples=3")
	if !strings.Contains(out, "eval step 4: loss") || !strings.Contains(out, "eval step 8: loss") {
		t.Fatalf("no eval lines in the log:\n%s", out)
	}
	ms := readMetrics(t, filepath.Join(dir, "tiny", "metrics.jsonl"))
	if ms[3].EvalLoss == 0 || ms[7].EvalLoss == 0 || ms[4].EvalLoss != 0 {
		t.Fatalf("eval_loss in metrics at steps 4 and 8 only: %v %v %v", ms[3].EvalLoss, ms[4].EvalLoss, ms[7].EvalLoss)
	}
	res := filepath.Join(dir, "eval.json")
	cmd := exec.Command(buildBinary(t), "eval", "--model", filepath.Join(dir, "tiny", "step-000004"),
		"--data", "$GOROOT/src/strings", "--samples", "3", "--out", res)
	b, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("eval of the checkpoint: %v\n%s", err, b)
	}
	var r evaluate.Result
	raw, err := os.ReadFile(res)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, &r); err != nil {
		t.Fatal(err)
	}
	if math.Abs(r.Loss-ms[3].EvalLoss) > 1e-9*ms[3].EvalLoss {
		t.Errorf("eval of step-000004: loss %.9f, eval during training at step 4: %.9f", r.Loss, ms[3].EvalLoss)
	}
}
