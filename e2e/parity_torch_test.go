package e2e

import (
	"bufio"
	"encoding/json"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// torchPython is an interpreter with PyTorch: $DISTFLASH_TORCH_PYTHON, else the virtual
// environment scripts/install_torch.sh makes ($DISTFLASH_TORCH_VENV, ~/.cache/distflash/torch).
// Without one the test skips; under CI (CI set), where .ci/run installs it, it fails.
func torchPython(t *testing.T) string {
	t.Helper()
	py := os.Getenv("DISTFLASH_TORCH_PYTHON")
	if py == "" {
		venv := os.Getenv("DISTFLASH_TORCH_VENV")
		if venv == "" {
			if c, err := os.UserCacheDir(); err == nil {
				venv = filepath.Join(c, "distflash", "torch")
			}
		}
		py = filepath.Join(venv, "bin", "python")
	}
	if err := exec.Command(py, "-c", "import torch").Run(); err != nil {
		msg := "no PyTorch (" + py + ": " + err.Error() + "): scripts/install_torch.sh installs it"
		if os.Getenv("CI") != "" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	return py
}

// torchCurve is what bench/torch_train.py prints.
type torchCurve struct {
	Steps    []int     `json:"steps"`
	Loss     []float64 `json:"loss"`
	GradNorm []float64 `json:"grad_norm"`
	LR       []float64 `json:"lr"`
}

// TestTrainsLikePyTorch: distflash and PyTorch (bench/torch_train.py) train the same model from
// the same weights on the same sequences with the same recipe (the trace of DISTFLASH_TRACE:
// distflash's step-0 weights and each step's batch), and their losses agree step by step for 20
// steps: within 1e-5 relative in fp32, and in bf16 within 0.01 nats, the band in which bf16
// trains like fp32 (docs/training.md#mixed-precision). The torch script also checks that its
// optim.Schedule gives distflash's learning rate at every step.
//
// The recipe is the default run's but for lr 1e-3 with 5 steps of warmup (tiny model, batch 8 ×
// 128 tokens of the Go tree). At the default 3e-3 the fp32 curves agree to 1e-7 for the first
// steps and then drift apart: Adam's update of a gradient within rounding of zero is ±lr
// whatever its size, so the two programs' rounding differences grow into 1e-4 by step 20 for
// some seeds (run.seed 1); at 1e-3 five seeds stayed under 1.7e-7. Measured: fp32 gap 1.3e-7
// relative, bf16 2.9e-3 nats (7.3e-4 relative); 11 s on 2 cores.
func TestTrainsLikePyTorch(t *testing.T) {
	py := torchPython(t)
	for _, prec := range []string{"fp32", "bf16"} {
		t.Run(prec, func(t *testing.T) {
			dir := t.TempDir()
			trace := filepath.Join(dir, "trace")
			cmd := command("train", "--config", "configs/tiny.toml", "--progress=false", "--set", "run.output_dir="+dir,
				"--set", "training.steps=20", "--set", "training.lr=1e-3", "--set", "training.warmup_steps=5",
				"--set", "data.max_bytes=1000000", "--set", "training.mixed_precision="+prec, "--set", "run.tensorboard=false")
			cmd.Env = append(os.Environ(), "DISTFLASH_TRACE="+trace)
			if _, stderr, err := runCmd(t, cmd); err != nil {
				t.Fatalf("train: %v\n%s", err, stderr)
			}
			ours := readLosses(t, filepath.Join(dir, "tiny", "metrics.jsonl"))
			out, err := exec.Command(py, "bench/torch_train.py", "--trace", trace, "--threads", "2").Output()
			if err != nil {
				var stderr []byte
				if ee, ok := err.(*exec.ExitError); ok {
					stderr = ee.Stderr
				}
				t.Fatalf("bench/torch_train.py: %v\n%s", err, stderr)
			}
			lines := strings.Split(strings.TrimSpace(string(out)), "\n")
			var theirs torchCurve
			if err := json.Unmarshal([]byte(lines[len(lines)-1]), &theirs); err != nil {
				t.Fatalf("bench/torch_train.py's record: %v\n%s", err, out)
			}
			if len(theirs.Loss) != 20 || len(ours) != 20 {
				t.Fatalf("PyTorch ran %d steps and distflash %d, want 20 each", len(theirs.Loss), len(ours))
			}
			worstRel, worstAbs := 0.0, 0.0
			for i, l := range theirs.Loss {
				d := math.Abs(l - ours[i])
				worstRel, worstAbs = max(worstRel, d/math.Abs(ours[i])), max(worstAbs, d)
			}
			t.Logf("%s: 20 steps, loss %.4f → %.4f; largest gap %.3g relative, %.3g nats", prec, ours[0], ours[19], worstRel, worstAbs)
			if prec == "fp32" && !(worstRel <= 1e-5) {
				t.Errorf("fp32: the losses differ by up to %.3g relative, want ≤ 1e-5\ndistflash %v\nPyTorch   %v", worstRel, ours, theirs.Loss)
			}
			if prec == "bf16" && !(worstAbs <= 0.01) {
				t.Errorf("bf16: the losses differ by up to %.3g nats, want ≤ 0.01 (the bf16 band)\ndistflash %v\nPyTorch   %v", worstAbs, ours, theirs.Loss)
			}
		})
	}
}

// readLosses is the loss of each step of a metrics.jsonl, in order.
func readLosses(t *testing.T, path string) []float64 {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []float64
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var m struct {
			Loss float64 `json:"loss"`
		}
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		out = append(out, m.Loss)
	}
	return out
}
