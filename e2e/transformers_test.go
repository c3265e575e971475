package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// The tests of this file hold distflash to transformers itself on RoPE: the directories of
// weights/testdata/hfrope were written by transformers' save_pretrained (5.24.0, whose
// config.json has "rope_parameters"; 4.57.6, whose has top-level "rope_theta" and
// "rope_scaling") with rope_theta 500000 and every rope_type distflash implements, and
// expected.json holds the loss transformers computes on each, and on distflash's exports of
// three of them (scripts/transformers_fixtures.py writes them all; no Python runs here).

const hfropeFixtures = "weights/testdata/hfrope"

type hfropeExpected struct {
	Samples int                         `json:"samples"`
	SeqLen  int                         `json:"seq_len"`
	Models  map[string]hfropeLoss       `json:"models"`
	Exports map[string]hfropeExportLoss `json:"exports"`
}

type hfropeLoss struct {
	Loss    float64 `json:"loss"`
	Tokens  int64   `json:"tokens"`
	Samples int     `json:"samples"` // the documents with a token to predict
	Form    string  `json:"form"`    // rope_parameters (transformers 5) or rope_scaling (4)
	// The loss with the RoPE settings dropped (theta 10000, no scaling), and with the scaling
	// alone dropped: what a reader that ignores them would get.
	LossTheta10000 float64 `json:"loss_theta_10000_no_scaling"`
	LossNoScaling  float64 `json:"loss_no_scaling"`
}

type hfropeExportLoss struct {
	hfropeLoss
	LossTransformers4 float64 `json:"loss_transformers_4"` // the same export read by transformers 4.57.6
	From              string  `json:"from"`
}

func readHFRope(t *testing.T) hfropeExpected {
	t.Helper()
	var e hfropeExpected
	readJSON(t, filepath.Join(hfropeFixtures, "expected.json"), &e)
	if len(e.Models) != 7 || len(e.Exports) != 3 {
		t.Fatalf("expected.json: %d models and %d exports, want 7 and 3 (regenerate: scripts/transformers_fixtures.py)", len(e.Models), len(e.Exports))
	}
	return e
}

// TestEvalMatchesTransformers: `eval` of every directory transformers wrote gives
// transformers' loss, on one rank and on four, within tolPyTorch (1e-5 relative; measured
// ≤ 1.2e-8, distflash's float32 against transformers' float64). The fixtures were drawn so
// that reading the RoPE wrongly moves the loss by far more: expected.json records, for each,
// the loss with rope_theta 10000 and no scaling (what a reader blind to rope_parameters
// gets; ≥ 2.6e-3 away) and with the scaling alone dropped (≥ 8.0e-4 away), and this test
// checks they stay ≥ 50× the tolerance away. distflash's exports of three of them evaluate
// to the loss transformers 5.24.0 and 4.57.6 both computed from the exported files.
func TestEvalMatchesTransformers(t *testing.T) {
	e := readHFRope(t)
	type dirLoss struct {
		dir  string
		want hfropeLoss
	}
	var dirs []dirLoss
	for _, name := range slices.Sorted(func(y func(string) bool) {
		for k := range e.Models {
			if !y(k) {
				return
			}
		}
	}) {
		want := e.Models[name]
		for _, other := range []float64{want.LossTheta10000, want.LossNoScaling} {
			if other != 0 && relDiff(other, want.Loss) < 50*tolPyTorch {
				t.Errorf("%s: the loss of a misread RoPE, %v, is within 50× the tolerance of %v: the fixture cannot tell them apart", name, other, want.Loss)
			}
		}
		dirs = append(dirs, dirLoss{filepath.Join(hfropeFixtures, name), want})
	}
	for name, x := range e.Exports {
		if relDiff(x.LossTransformers4, x.Loss) > 1e-9 {
			t.Errorf("export/%s: transformers 4 computed %v, 5 %v: the export means two things", name, x.LossTransformers4, x.Loss)
		}
		dirs = append(dirs, dirLoss{filepath.Join(hfropeFixtures, "export", name), x.hfropeLoss})
	}
	for _, d := range dirs {
		for _, P := range []int{1, 4} {
			t.Run(fmt.Sprintf("%s/P%d", strings.TrimPrefix(d.dir, hfropeFixtures+"/"), P), func(t *testing.T) {
				r := evalReportOf(t, d.dir, e.SeqLen, "--set", fmt.Sprintf("parallelism.world_size=%d", P),
					"--set", fmt.Sprintf("parallelism.sequence_parallel_degree=%d", P))
				if r.Tokens != d.want.Tokens || r.Samples != d.want.Samples {
					t.Errorf("%d tokens of %d samples; transformers %d of %d", r.Tokens, r.Samples, d.want.Tokens, d.want.Samples)
				}
				if diff := relDiff(r.Loss, d.want.Loss); diff > tolPyTorch {
					t.Errorf("loss %.9f, transformers %.9f (rel diff %.2e > %g)", r.Loss, d.want.Loss, diff, tolPyTorch)
				} else {
					t.Logf("loss %.9f, transformers %.9f (rel diff %.2e)", r.Loss, d.want.Loss, diff)
				}
			})
		}
	}
}

// TestExportOfTransformersModel: `train --init-from` of a directory transformers 5 wrote (its
// RoPE in rope_parameters), then `export`, writes the config.json that transformers 5.24.0 and
// 4.57.6 read back to the same loss (the committed export's, byte for byte: the top-level
// rope_theta and rope_scaling both releases read), and the export (in f32) evaluates to its
// checkpoint's loss exactly.
func TestExportOfTransformersModel(t *testing.T) {
	for name := range readHFRope(t).Exports {
		t.Run(name, func(t *testing.T) {
			runs := t.TempDir()
			// As scripts/transformers_fixtures.py trains it.
			if _, stderr, err := cli(t, "train", "--config", "configs/tiny.toml", "--progress=false",
				"--init-from", filepath.Join(hfropeFixtures, name),
				"--set", "run.name="+name, "--set", "run.output_dir="+runs,
				"--set", "data.train=scripts/reference.py", "--set", "data.max_bytes=0",
				"--set", "data.seq_len=64", "--set", "data.batch_size=2",
				"--set", "training.steps=2", "--set", "training.warmup_steps=1",
				"--set", "checkpoint.interval=2"); err != nil {
				t.Fatalf("train: %v\n%s", err, stderr)
			}
			out := filepath.Join(t.TempDir(), "hf")
			exportTo(t, "--model", filepath.Join(runs, name), "--dtype", "bf16", "--out", out)
			got, err := os.ReadFile(filepath.Join(out, "config.json"))
			if err != nil {
				t.Fatal(err)
			}
			want, err := os.ReadFile(filepath.Join(hfropeFixtures, "export", name, "config.json"))
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("config.json:\n%s\nthe export transformers read:\n%s", got, want)
			}
			var m map[string]json.RawMessage
			if err := json.Unmarshal(got, &m); err != nil {
				t.Fatal(err)
			}
			if _, ok := m["rope_parameters"]; ok {
				t.Errorf("config.json has rope_parameters, which transformers 4 does not read")
			}
			// The same checkpoint in f32 evaluates to its loss exactly: the exported RoPE is
			// the one it trained with.
			f32 := filepath.Join(t.TempDir(), "hf")
			exportTo(t, "--model", filepath.Join(runs, name), "--out", f32)
			ckpt := evalReportOf(t, filepath.Join(runs, name), 128)
			exp := evalReportOf(t, f32, 128)
			if exp.Loss != ckpt.Loss || exp.Tokens != ckpt.Tokens {
				t.Errorf("export: loss %v over %d tokens; the checkpoint %v over %d", exp.Loss, exp.Tokens, ckpt.Loss, ckpt.Tokens)
			}
		})
	}
}

// TestEvalRefusesAmbiguousRope: a config.json whose two RoPE forms disagree, or that asks for
// RoPE distflash does not implement, is refused through the binary naming the keys and
// values; a string hidden_size is one error, not three; nothing is written.
func TestEvalRefusesAmbiguousRope(t *testing.T) {
	for _, tc := range []struct {
		name string
		set  map[string]string
		want []string
		n    int // the errors the message holds
	}{
		{"theta in both forms", map[string]string{"rope_theta": "10000.0"},
			[]string{"config.json", "rope_theta = 10000.0 and rope_parameters.rope_theta = 500000.0 disagree"}, 1},
		{"scaling in both forms", map[string]string{"rope_scaling": `{"rope_type": "linear", "factor": 4.0}`},
			[]string{"config.json", "rope_parameters = {", `"rope_type":"llama3"`, `rope_scaling = {"rope_type":"linear","factor":4.0} disagree`}, 1},
		{"partial rotary", map[string]string{"partial_rotary_factor": "0.5"},
			[]string{"config.json", "partial_rotary_factor = 0.5", "not implemented"}, 1},
		{"rope type", map[string]string{"rope_parameters": `{"rope_type": "longrope", "rope_theta": 10000.0, "short_factor": [1], "long_factor": [1], "original_max_position_embeddings": 32}`},
			[]string{"config.json", `rope_parameters.rope_type = "longrope": not implemented`}, 1},
		{"rope key", map[string]string{"rope_parameters": `{"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "mscale": 1.0}`},
			[]string{"config.json", `rope_parameters.mscale = 1.0: not implemented for rope_type "yarn"`}, 1},
		{"string hidden_size", map[string]string{"hidden_size": `"32"`},
			[]string{"config.json", `hidden_size = "32": want an integer`}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			src := filepath.Join(hfropeFixtures, "llama3")
			for _, f := range []string{"config.json", "model.safetensors"} {
				b, err := os.ReadFile(filepath.Join(src, f))
				if err != nil {
					t.Fatal(err)
				}
				if f == "config.json" {
					var m map[string]json.RawMessage
					if err := json.Unmarshal(b, &m); err != nil {
						t.Fatal(err)
					}
					for k, v := range tc.set {
						m[k] = json.RawMessage(v)
					}
					b, _ = json.Marshal(m)
				}
				if err := os.WriteFile(filepath.Join(dir, f), b, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			out := filepath.Join(t.TempDir(), "e.json")
			_, _, err := cli(t, "eval", "--model", dir, "--data", hfDocs, "--seq-len", "128", "--out", out)
			if err == nil {
				t.Fatal("no error")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
			if n := strings.Count(err.Error(), "config.json:"); n != tc.n {
				t.Errorf("%d errors, want %d: %v", n, tc.n, err)
			}
			if _, err := os.Stat(out); !os.IsNotExist(err) {
				t.Errorf("%s written (%v)", out, err)
			}
		})
	}
}
