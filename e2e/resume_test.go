package e2e

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The tests of this file check that a run stopped and resumed, in a new process, is the run
// that never stopped: bit for bit on the same world, to summation order on another (the
// checkpoint re-sharded), and that resume names what is damaged or changed.

// runBin runs the real binary with train arguments (configs/tiny.toml, 1 MiB of data, 8
// steps) plus args, in this process's environment plus env, and returns its combined output.
func runBin(t *testing.T, env []string, args ...string) (string, error) {
	t.Helper()
	base := []string{"train", "--config", "configs/tiny.toml", "--progress=false",
		"--set", "data.max_bytes=1048576", "--set", "data.batch_size=2", "--set", "training.steps=8",
		"--set", "training.warmup_steps=2"}
	cmd := command(append(base, args...)...)
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

// TestResumeIsExact: 8 steps straight and 4 steps + checkpoint + a new process that resumes
// and runs 4 more give bit-identical weights, AdamW moments and losses. Checked for one
// worker in fp32 and for 2 FSDP ranks in fp16 (sharded state, loss scaler in the state).
func TestResumeIsExact(t *testing.T) {
	slow(t, "TestInitFromResume and TestTrainInterrupt resume through the binary, the first bit for bit")
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
	slow(t, "ckpt's TestReshard reads 4 ranks' shards for other world sizes")
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

// TestResumeDamage: a damaged newest checkpoint is named and skipped by --resume auto, which
// says so and continues from the one before; naming it explicitly is an error that names
// the file; a checkpoint of another model shape is refused with the differing keys.
func TestResumeDamage(t *testing.T) {
	slow(t, "ckpt's TestDamage names and skips each damage, and TestEvalFallsBackPastDamagedLatest skips a damaged latest through the binary")
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

// TestResumeNamesWhatExists: --resume naming a checkpoint that does not exist (the docs once
// named step-000100 of a run that had none) is refused with the checkpoints the run directory
// holds and which is `latest`, whether it is named by its path or by its name alone, and a
// directory that does not exist is said not to, instead of a raw stat (issue 33, item 12).
func TestResumeNamesWhatExists(t *testing.T) {
	dir := t.TempDir()
	run := filepath.Join(dir, "tiny")
	mustSucceed(t, smallRun(dir, "--set", "training.steps=4", "--set", "checkpoint.interval=2")...)
	holds := run + " holds step-000004, step-000002; `latest` is step-000004 (--resume auto takes the newest intact one)"
	for _, c := range []struct{ spec, want string }{
		{filepath.Join(run, "step-000100"), filepath.Join(run, "step-000100") + " does not exist: " + holds},
		{"step-000100", filepath.Join(run, "step-000100") + " does not exist: " + holds},
		{filepath.Join(dir, "other", "step-000100"), filepath.Join(dir, "other", "step-000100") + " does not exist: " + filepath.Join(dir, "other") + " does not exist"},
	} {
		_, _, err := cli(t, smallRun(dir, "--resume", c.spec)...)
		if err == nil || !strings.HasSuffix(err.Error(), c.want) {
			t.Errorf("--resume %s: %v, want %q", c.spec, err, c.want)
		}
	}
}

// TestResumeSaysWhatChanged: every changed key is printed old → new with what it does; a key
// that cannot continue the same training is refused by name.
func TestResumeSaysWhatChanged(t *testing.T) {
	slow(t, "ckpt's TestCheckConfig finds each changed key and refuses a changed model by name")
	dir := t.TempDir()
	mustSucceed(t, smallRun(dir, "--set", "training.steps=4", "--stop-after", "2")...)
	out := mustSucceed(t, smallRun(dir, "--set", "training.steps=4", "--resume", "auto", "--set", "training.lr=0.001",
		"--set", "checkpoint.keep=2", "--set", "parallelism.world_size=2", "--set", "parallelism.sequence_parallel_degree=2", "--stop-after", "3")...)
	for _, want := range []string{
		"resume: training.lr: 0.003 → 0.001 (WARNING: the continuation is not the same run",
		"resume: checkpoint.keep: 3 → 2 (no effect on the training)",
		"resume: parallelism.sequence_parallel_degree: 1 → 2 (the same training, equal up to floating-point rounding)",
		"resume: parallelism.world_size: 1 → 2 (the same training, equal up to floating-point rounding)",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("resume output lacks %q:\n%s", want, out)
		}
	}
	out = mustSucceed(t, smallRun(dir, "--set", "training.steps=4", "--resume", "auto", "--set", "parallelism.world_size=2", "--stop-after", "4")...)
	if !strings.Contains(out, "parallelism.sequence_parallel_degree: 2 → 1 (WARNING") || !strings.Contains(out, "2 data-parallel replicas, was 1") {
		t.Errorf("a change of data-parallel replicas is not warned about:\n%s", out)
	}
	for _, key := range []string{"data.seq_len=64", "run.seed=7", "model.ffn_dim=64"} {
		mustFail(t, smallRun(dir, "--set", "training.steps=8", "--resume", "auto", "--set", key),
			strings.Split(key, "=")[0]+" changed")
	}
}

// TestInitFromResume: a run started with --init-from, stopped at step 2 and resumed with
// the same --init-from and --resume auto, ends bit-identical to the run that never stopped
// (the checkpoint's weights, moments and data position replace the source's).
func TestInitFromResume(t *testing.T) {
	const src = "weights/testdata/hf/llama-sharded"
	straight, split := t.TempDir(), t.TempDir()
	args := func(dir string, extra ...string) []string {
		a := append([]string{"train", "--config", "configs/tiny.toml", "--progress=false", "--init-from", src}, initBase(dir)...)
		return append(a, append([]string{"--set", "training.steps=4", "--set", "checkpoint.interval=2"}, extra...)...)
	}
	for _, a := range [][]string{args(straight), args(split, "--stop-after", "2"), args(split, "--resume", "auto")} {
		if _, stderr, err := cli(t, a...); err != nil {
			t.Fatalf("%v: %v\n%s", a, err, stderr)
		}
	}
	if err := sameState(stateOf(t, filepath.Join(straight, "tiny", "step-000004")), stateOf(t, filepath.Join(split, "tiny", "step-000004"))); err != nil {
		t.Errorf("straight vs stopped at 2 and resumed: %v", err)
	}
	if a, b := lossesOf(t, filepath.Join(straight, "tiny")), lossesOf(t, filepath.Join(split, "tiny")); fmt.Sprint(a) != fmt.Sprint(b) || len(a) != 4 {
		t.Errorf("losses %v and %v", a, b)
	}
}
