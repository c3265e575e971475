package e2e

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"distflash/evaluate"
)

// The tests of this file run every command that evaluates or generates (eval with the loss by
// position, eval --task passkey, generate) through the binary on the worlds train runs on: one
// rank, 4 in-process sequence-parallel ranks under each schedule and the hybrid, data-parallel
// replicas with FSDP, and device.kind = cpu-device (the CPU posing as a GPU, every exchange
// staged through host copies). Each world gives one rank's results; and a command refuses no
// device or world that train accepts. The same over MPI processes is in
// every_command_mpi_test.go.

// commandModel is a checkpoint of the tiny model after 8 steps, trained once for the tests of
// this file (in a directory of its own that outlives them, removed by TestMain's cleanup of
// the temporary directory).
var commandModel struct {
	once sync.Once
	dir  string
	err  string
}

// trainedTiny returns the run directory of commandModel.
func trainedTiny(t *testing.T) string {
	t.Helper()
	commandModel.once.Do(func() {
		dir, err := os.MkdirTemp("", "distflash-commands-")
		if err != nil {
			commandModel.err = err.Error()
			return
		}
		_, stderr, err := distflash(t, "train", "--progress=false", "--set", "training.steps=8", "--set", "data.max_bytes=262144",
			"--set", "run.output_dir="+dir, "--set", "run.name=src")
		if err != nil {
			commandModel.err = fmt.Sprintf("%v\n%s", err, stderr)
			return
		}
		commandModel.dir = filepath.Join(dir, "src")
	})
	if commandModel.err != "" {
		t.Fatalf("training the model the commands run on: %s", commandModel.err)
	}
	return commandModel.dir
}

// commandResults are the JSON results of the commands on one world.
type commandResults struct {
	eval     evaluate.Report
	passkey  evaluate.PasskeyReport
	generate struct {
		Samples []struct {
			Tokens []int32 `json:"tokens"`
		} `json:"samples"`
	}
}

// runCommands runs eval (--positions), eval --task passkey and generate of model with the
// settings sets, started by launch (the binary's path and args go after it: nil for the binary
// itself, or mpirun's argv), and reads their results.
func runCommands(t *testing.T, model string, launch []string, sets ...string) commandResults {
	t.Helper()
	dir := t.TempDir()
	var extra []string
	for _, s := range sets {
		extra = append(extra, "--set", s)
	}
	runs := []struct {
		out  string
		args []string
	}{
		{"eval.json", []string{"eval", "--model", model, "--samples", "6", "--seq-len", "128", "--positions", "--progress=false"}},
		{"passkey.json", []string{"eval", "--model", model, "--task", "passkey", "--lengths", "384", "--trials", "2", "--progress=false"}},
		{"generate.json", []string{"generate", "--model", model, "--prompt", "func main() {", "--max-new-tokens", "16", "--stream=false"}},
	}
	var res commandResults
	for i, r := range runs {
		out := filepath.Join(dir, r.out)
		argv := append(append(slices.Clone(r.args), "--out", out), extra...)
		var stderr string
		var err error
		if launch == nil {
			_, stderr, err = distflash(t, argv...)
		} else {
			cmd := command()
			cmd.Path, cmd.Args = launch[0], append(append(slices.Clone(launch), bin), argv...)
			_, stderr, err = runCmd(t, cmd)
		}
		if err != nil {
			t.Fatalf("%s %s: %v\n%s", r.args[0], strings.Join(sets, " "), err, tailOf(stderr, 30))
		}
		readJSON(t, out, []any{&res.eval, &res.passkey, &res.generate}[i])
	}
	return res
}

// compareCommands fails t where got is not one rank's want: the loss and every position
// bucket within 1e-5 relative (the schedules merge attention in float32 in another order; the
// losses are added in float64 in sample order on every world), the passkey answers and the
// greedy tokens equal.
func compareCommands(t *testing.T, got, want commandResults) {
	t.Helper()
	rel := func(a, b float64) float64 { return math.Abs(a-b) / math.Max(math.Abs(b), 1e-30) }
	if rel(got.eval.Loss, want.eval.Loss) > 1e-5 || got.eval.Tokens != want.eval.Tokens {
		t.Errorf("eval: loss %.9f over %d tokens, one rank %.9f over %d", got.eval.Loss, got.eval.Tokens, want.eval.Loss, want.eval.Tokens)
	}
	gp, wp := got.eval.Positions, want.eval.Positions
	if gp == nil || wp == nil || len(gp.Loss) != len(wp.Loss) {
		t.Fatalf("eval --positions: %v buckets, one rank %v", gp, wp)
	}
	for i := range wp.Loss {
		if !(math.IsNaN(gp.Loss[i]) && math.IsNaN(wp.Loss[i])) && rel(gp.Loss[i], wp.Loss[i]) > 1e-5 {
			t.Errorf("positions [%d, %d): %.9f, one rank %.9f", wp.Lo[i], wp.Hi[i], gp.Loss[i], wp.Loss[i])
		}
	}
	answers := func(r evaluate.PasskeyReport) string {
		var s []string
		for _, tr := range r.Passkey.Records {
			s = append(s, fmt.Sprintf("%q/%d", tr.Generated, tr.ForcedHit))
		}
		return strings.Join(s, " ")
	}
	if a, b := answers(got.passkey), answers(want.passkey); a != b || len(want.passkey.Passkey.Records) == 0 {
		t.Errorf("passkey: %s; one rank %s", a, b)
	}
	if len(got.generate.Samples) != 1 || len(want.generate.Samples) != 1 || !slices.Equal(got.generate.Samples[0].Tokens, want.generate.Samples[0].Tokens) {
		t.Errorf("generate: %+v; one rank %+v", got.generate, want.generate)
	}
}

// commandWorlds are the worlds of 4 ranks the commands run on, as --set values.
var commandWorlds = [][]string{
	{"parallelism.world_size=4", "parallelism.sequence_parallel_degree=4", "parallelism.attention=distflash"},
	{"parallelism.world_size=4", "parallelism.sequence_parallel_degree=4", "parallelism.attention=ring"},
	{"parallelism.world_size=4", "parallelism.sequence_parallel_degree=4", "parallelism.attention=zigzag"},
	{"parallelism.world_size=4", "parallelism.sequence_parallel_degree=4", "parallelism.attention=burst"},
	{"parallelism.world_size=4", "parallelism.sequence_parallel_degree=4", "parallelism.attention=ulysses"},
	{"parallelism.world_size=4", "parallelism.sequence_parallel_degree=4", "parallelism.attention=attn2d"},
	{"parallelism.world_size=4", "parallelism.sequence_parallel_degree=4", "parallelism.attention=ring", "parallelism.ulysses_degree=2"},
	{"parallelism.world_size=4", "parallelism.sequence_parallel_degree=2", "parallelism.attention=zigzag", "parallelism.fsdp=true"},
	{"parallelism.world_size=4", "parallelism.sequence_parallel_degree=4", "parallelism.attention=ring", "device.kind=cpu-device"},
}

// TestEveryCommandMatchesOneRank: eval, its loss by position, passkey and generate of one
// checkpoint on every world of commandWorlds, through the binary, give one rank's results.
func TestEveryCommandMatchesOneRank(t *testing.T) {
	model := trainedTiny(t)
	one := runCommands(t, model, nil)
	for i, w := range commandWorlds {
		t.Run(strings.Join(w, ","), func(t *testing.T) {
			if i > 1 {
				slow(t, "the first two worlds (distflash and ring over 4 ranks) run; package evaluate's TestEvaluatorWorlds runs every shape in process")
			}
			compareCommands(t, runCommands(t, model, nil, w...), one)
		})
	}
}

// TestEveryCommandRunsWhereTrainRuns: on every device kind and world that train accepts (a
// step of it passes), eval and generate run too; where train refuses (a sequence-parallel
// degree of 4 in a world of 1 rank, a device this build lacks), so do they, for the same
// reason (the message's last line).
func TestEveryCommandRunsWhereTrainRuns(t *testing.T) {
	model := trainedTiny(t)
	for _, kind := range []string{"cpu", "cpu-device", "cuda"} {
		for _, world := range [][]string{nil, commandWorlds[1], commandWorlds[7], {"parallelism.sequence_parallel_degree=4"}} {
			sets := append([]string{"device.kind=" + kind}, world...)
			var extra []string
			for _, s := range sets {
				extra = append(extra, "--set", s)
			}
			_, trainErr, trainFailed := distflash(t, append([]string{"train", "--progress=false", "--set", "training.steps=1",
				"--set", "data.max_bytes=65536", "--set", "run.output_dir=" + t.TempDir()}, extra...)...)
			for _, args := range [][]string{
				{"eval", "--model", model, "--samples", "2", "--seq-len", "64", "--progress=false", "--out", filepath.Join(t.TempDir(), "e.json")},
				{"generate", "--model", model, "--prompt", "x", "--max-new-tokens", "4", "--stream=false"},
			} {
				_, cmdErr, cmdFailed := distflash(t, append(args, extra...)...)
				switch {
				case trainFailed == nil && cmdFailed != nil:
					t.Errorf("%s refuses %v, which train accepts:\n%s", args[0], sets, tailOf(cmdErr, 5))
				case trainFailed != nil && cmdFailed == nil:
					t.Errorf("%s accepts %v, which train refuses:\n%s", args[0], sets, tailOf(trainErr, 5))
				case trainFailed != nil && !sameReason(reason(cmdErr), reason(trainErr)):
					t.Errorf("%v: train refuses with %q, %s with %q", sets, reason(trainErr), args[0], reason(cmdErr))
				}
			}
		}
	}
}

// reason is why a command refused: the last line of its error (a requirement the build lacks
// is a list whose items say it), without the command's name.
func reason(stderr string) string {
	msg, _ := errorMessage(stderr)
	lines := strings.Split(strings.TrimSpace(msg), "\n")
	last := strings.TrimPrefix(strings.TrimSpace(lines[len(lines)-1]), "- ")
	for _, p := range []string{"train: ", "eval: ", "generate: "} {
		last = strings.TrimPrefix(last, p)
	}
	return last
}

// sameReason reports whether two refusals say the same: one ends with the other (train names
// where the value came from first: the config file, a --set, the built-in defaults).
func sameReason(a, b string) bool { return strings.HasSuffix(a, b) || strings.HasSuffix(b, a) }

// tailOf is the last n lines of s.
func tailOf(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(len(lines)-n, 0):], "\n")
}

// TestEvalDuringTrainingOnTheRanks: evaluation and samples during training run on the training
// ranks (here 2 replicas × 2 zigzag ranks with FSDP, where no rank holds the whole model): the
// eval loss of step 4 is one rank's evaluation of the step-4 checkpoint within 1e-5 relative,
// the log says its time on the training ranks, metrics.jsonl has it (eval_s), and the sample
// is written to samples.jsonl.
func TestEvalDuringTrainingOnTheRanks(t *testing.T) {
	dir := t.TempDir()
	sets := []string{"parallelism.world_size=4", "parallelism.sequence_parallel_degree=2", "parallelism.attention=zigzag",
		"parallelism.fsdp=true", "training.steps=4", "checkpoint.interval=4", "eval.interval=4", "eval.sample_interval=4",
		"eval.sample_tokens=8", "data.eval=$GOROOT/src/strings", "eval.samples=3", "data.max_bytes=262144", "run.output_dir=" + dir}
	args := []string{"train", "--progress=false"}
	for _, s := range sets {
		args = append(args, "--set", s)
	}
	_, stderr := succeed(t, args...)
	if !strings.Contains(stderr, "eval step 4: loss") || !strings.Contains(stderr, "on the training ranks") || !strings.Contains(stderr, "sample step 4:") {
		t.Fatalf("no eval or sample lines in the log:\n%s", tailOf(stderr, 20))
	}
	ms := readMetrics(t, filepath.Join(dir, "tiny", "metrics.jsonl"))
	if len(ms) != 4 || ms[3].EvalLoss == 0 || ms[3].EvalSec <= 0 {
		t.Fatalf("metrics of step 4: eval_loss %v, eval_s %v", ms[len(ms)-1].EvalLoss, ms[len(ms)-1].EvalSec)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "tiny", "samples.jsonl")); err != nil || strings.Count(string(b), "\n") != 1 {
		t.Errorf("samples.jsonl: %v, %q", err, b)
	}
	out := filepath.Join(dir, "eval.json")
	succeed(t, "eval", "--model", filepath.Join(dir, "tiny", "step-000004"), "--data", "$GOROOT/src/strings", "--samples", "3", "--out", out)
	var r evaluate.Report
	readJSON(t, out, &r)
	if math.Abs(r.Loss-ms[3].EvalLoss) > 1e-5*ms[3].EvalLoss {
		t.Errorf("one rank's eval of step-000004: loss %.9f; during training on the ranks: %.9f", r.Loss, ms[3].EvalLoss)
	}
}
