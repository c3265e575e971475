package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"distflash/config"
	"distflash/train"
)

// spikeData writes a text file a user could make: one sentence repeated (a model learns it to a
// loss near 0.05 in 100 steps), but for one window of 64 random printable bytes, placed where
// the loader takes it at step `at` (as the first sequence of that step's batch of 2). It returns
// the file and the window.
func spikeData(t *testing.T, dir string, at int) (string, int) {
	t.Helper()
	path := filepath.Join(dir, "data.txt")
	ws := plantSpikes(t, path, 300, spikeSets, at)
	return path, ws[0]
}

// plantSpikes writes the repeated sentence of spikeData into path, windows windows of 64
// tokens long, with a window of random bytes where the loader of the spike runs with sets
// takes it at each step of at (the first sequence of the step's batch). It returns the
// windows.
func plantSpikes(t *testing.T, path string, windows int, sets []string, at ...int) []int {
	t.Helper()
	const T = 64
	line := []byte("the quick brown fox jumps over the lazy dog; ")
	text := bytes.Repeat(line, (windows*T+1)/len(line)+1)[:windows*T+1]
	if err := os.WriteFile(path, text, 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := spikeConfig(t, path, sets)
	loader, err := train.NewLoader(cfg, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	var ws []int
	rng := rand.New(rand.NewPCG(7, 7))
	for step := 1; len(ws) < len(at); step++ {
		w := loader.Next().Windows[0]
		if !slices.Contains(at, step) {
			continue
		}
		// window w reads bytes wT … wT+T−1 and predicts wT+1 … wT+T; its neighbours predict
		// wT (w−1's last target) and read wT+T: the random bytes stay strictly inside, so
		// that only step `at` sees them (with them at wT, window w−1's step spiked too, by 4×
		// on a CPU whose Go math uses FMA)
		for i := w*T + 1; i < w*T+T; i++ {
			text[i] = byte(33 + rng.IntN(94))
		}
		ws = append(ws, w)
	}
	if err := os.WriteFile(path, text, 0o644); err != nil {
		t.Fatal(err)
	}
	return ws
}

// spikeSets are the run of the spike tests: the default model on spikeData, batch 2 × 64, 150
// steps.
var spikeSets = []string{"data.seq_len=64", "data.batch_size=2", "training.steps=150", "training.warmup_steps=10",
	"run.log_interval=0", "data.max_bytes=0"}

func spikeConfig(t *testing.T, data string, sets []string) config.Config {
	t.Helper()
	cfg := config.Default()
	for _, s := range append([]string{"data.train=" + data}, sets...) {
		if err := cfg.Set(s); err != nil {
			t.Fatal(err)
		}
	}
	return cfg
}

// spikeRow is what a metrics.jsonl line says of spikes.
type spikeRow struct {
	Step      int     `json:"step"`
	Loss      float64 `json:"loss"`
	LossSpike bool    `json:"loss_spike"`
	NormSpike bool    `json:"grad_norm_spike"`
	Median    float64 `json:"loss_median"`
	Skipped   bool    `json:"spike_skipped"`
	Windows   []int   `json:"windows"`
}

// spikeRun trains run name under dir on data with sets (section.key=value, or a flag such as
// --stop-after=N) and returns its stdout, stderr and metrics.jsonl.
func spikeRun(t *testing.T, dir, name, data string, sets ...string) (string, string, []spikeRow) {
	t.Helper()
	args := []string{"train", "--progress=false", "--set", "run.output_dir=" + dir, "--set", "run.name=" + name, "--set", "data.train=" + data}
	for _, s := range sets {
		if strings.HasPrefix(s, "--") { // a flag (--stop-after=N, --resume=auto)
			args = append(args, s)
		} else {
			args = append(args, "--set", s)
		}
	}
	stdout, stderr := succeed(t, args...)
	b, err := os.ReadFile(filepath.Join(dir, name, "metrics.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	var rows []spikeRow
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		var r spikeRow
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatal(err)
		}
		rows = append(rows, r)
	}
	return stdout, stderr, rows
}

// TestSpikesReportedAndSkipped: a run on text with one window of random bytes among a repeated
// sentence (spikeData) reports a loss spike and a gradient-norm spike at the step that took the
// window, and at no other step: in the log (the step, the values against the median, the
// window and its tokens), in metrics.jsonl (loss_spike, grad_norm_spike, loss_median,
// windows), in the TensorBoard events (spikes/loss, spikes/grad_norm) and in the end line. With
// training.skip_spikes = true that step's update is skipped and no other: the losses are the
// same as without up to and including that step, and differ after it.
func TestSpikesReportedAndSkipped(t *testing.T) {
	const at = 100
	dir := t.TempDir()
	data, w := spikeData(t, dir, at)
	run := func(name string, more ...string) (string, string, []spikeRow) {
		return spikeRun(t, dir, name, data, append(slices.Clone(spikeSets), more...)...)
	}
	stdout, stderr, plain := run("plain")
	want := fmt.Sprintf("step %d: loss spike: loss ", at)
	if n := strings.Count(stderr, " spike: "); n != 2 || !strings.Contains(stderr, want) ||
		!strings.Contains(stderr, fmt.Sprintf("window %d (tokens %d..%d)", w, w*64, w*64+64)) ||
		!strings.Contains(stderr, "gradient-norm spike: grad_norm") || !strings.Contains(stderr, "update applied") {
		t.Errorf("the log does not report one loss and gradient-norm spike at step %d in window %d:\n%s", at, w, stderr)
	}
	if !strings.Contains(stdout, fmt.Sprintf("spikes: 1 of the loss, 1 of the gradient norm (steps %d), 0 updates skipped", at)) {
		t.Errorf("the end line does not count the spike:\n%s", stdout)
	}
	for _, r := range plain {
		spiked := r.LossSpike || r.NormSpike
		switch {
		case r.Step == at && (!r.LossSpike || !r.NormSpike || r.Skipped || len(r.Windows) != 2 || r.Windows[0] != w || !(r.Loss > 10*r.Median)):
			t.Errorf("step %d in metrics.jsonl: %+v, want a loss and a gradient-norm spike in window %d, not skipped", at, r, w)
		case r.Step != at && (spiked || r.Skipped || r.Windows != nil):
			t.Errorf("step %d in metrics.jsonl: %+v, want no spike", r.Step, r)
		}
	}
	events, _ := filepath.Glob(filepath.Join(dir, "plain", train.TensorBoardDir, "*"))
	var tb []byte
	for _, e := range events {
		b, _ := os.ReadFile(e)
		tb = append(tb, b...)
	}
	if !bytes.Contains(tb, []byte("spikes/loss")) || !bytes.Contains(tb, []byte("spikes/grad_norm")) || bytes.Contains(tb, []byte("spikes/skipped")) {
		t.Errorf("the TensorBoard events of %v lack spikes/loss or spikes/grad_norm, or have spikes/skipped", events)
	}

	stdout, stderr, skip := run("skip", "training.skip_spikes=true")
	if !strings.Contains(stderr, fmt.Sprintf("step %d: loss spike", at)) || !strings.Contains(stderr, "update skipped (training.skip_spikes)") {
		t.Errorf("the log does not say step %d's update was skipped:\n%s", at, stderr)
	}
	if !strings.Contains(stdout, fmt.Sprintf("(steps %d), 1 updates skipped", at)) {
		t.Errorf("the end line does not count the skipped update:\n%s", stdout)
	}
	for i, r := range skip {
		if r.Skipped != (r.Step == at) {
			t.Errorf("step %d: spike_skipped %v, want it at step %d only", r.Step, r.Skipped, at)
		}
		if same := r.Loss == plain[i].Loss; same != (r.Step <= at) {
			t.Errorf("step %d: loss %v with skip_spikes, %v without: want equal up to step %d and different after", r.Step, r.Loss, plain[i].Loss, at)
		}
	}

	// Stopped 3 steps before the spike and resumed, the run decides as the one that never
	// stopped: the recent steps the medians are taken over are in the checkpoint, so the same
	// step is reported and skipped, and the losses after it are the uninterrupted run's bit
	// for bit. A model.init changed on resume (it draws only a fresh model) changes nothing.
	run("resumed", "training.skip_spikes=true", "--stop-after=97")
	stdout, stderr, resumed := run("resumed", "training.skip_spikes=true", "model.init=torchtitan", "--resume=auto")
	if !strings.Contains(stderr, fmt.Sprintf("step %d: loss spike", at)) || !strings.Contains(stdout, fmt.Sprintf("(steps %d), 1 updates skipped", at)) {
		t.Errorf("resumed 3 steps before it, the run does not report and skip the spike at step %d:\n%s\n%s", at, stderr, stdout)
	}
	if len(resumed) != len(skip) {
		t.Fatalf("the resumed run's metrics.jsonl has %d steps, the uninterrupted %d", len(resumed), len(skip))
	}
	for i, r := range resumed {
		if r.Loss != skip[i].Loss || r.Skipped != skip[i].Skipped || r.LossSpike != skip[i].LossSpike || r.NormSpike != skip[i].NormSpike {
			t.Errorf("step %d resumed: %+v, uninterrupted: %+v", r.Step, r, skip[i])
		}
	}
}

// longSpikeSets are the run of TestSpikeSkipsBounded: 300 steps over 600 windows of the
// sentence (one pass over them), batch 2 × 64, skip_spikes on. Late in it (steps 150–190 on
// a 2-core EPYC) the gradient norm of ordinary batches rises to 10–20× the median of the 32
// steps before, and falls back.
var longSpikeSets = []string{"data.seq_len=64", "data.batch_size=2", "training.steps=300", "training.warmup_steps=10",
	"run.log_interval=0", "data.max_bytes=0", "run.tensorboard=false", "training.skip_spikes=true"}

// TestSpikeSkipsBounded: training.skip_spikes skips the update of a batch that spikes the loss,
// and no ordinary batch. On the repeated sentence with nothing planted (longSpikeSets) the
// gradient norm of ordinary batches spikes late in the run, their updates are applied, and
// the end line counts 0 skipped with the bounds; with one window of random bytes planted at
// step 250, that step alone is skipped. With a run of 6 planted steps (230–235) and 2 more
// (260, 270) under skip_spikes_max_consecutive = 3 and skip_spikes_max_total = 4, steps 230–232
// are skipped and 233 on applied (said, once the run passes the bound), 260 is skipped and
// reaches the total (said once), 270 is applied (said), and the end line says 4 of at most 3 in
// a row, 4 in all.
func TestSpikeSkipsBounded(t *testing.T) {
	slow(t, "train's TestSpikeSkipRule checks the rule and its bounds on synthetic runs, TestSpikesReportedAndSkipped a planted spike skipped through the binary")
	dir := t.TempDir()
	skipped := func(rows []spikeRow) []int {
		var s []int
		for _, r := range rows {
			if r.Skipped {
				s = append(s, r.Step)
			}
		}
		return s
	}

	data := filepath.Join(dir, "ordinary.txt")
	plantSpikes(t, data, 600, longSpikeSets)
	stdout, stderr, rows := spikeRun(t, dir, "ordinary", data, longSpikeSets...)
	if s := skipped(rows); len(s) > 0 || strings.Contains(stderr, "update skipped") {
		t.Errorf("nothing planted, skip_spikes skipped the updates of ordinary batches at steps %v:\n%s", s, stderr)
	}
	if !strings.Contains(stderr, "gradient-norm spike: grad_norm") || !strings.Contains(stderr, "update applied (training.skip_spikes skips loss spikes, not a gradient norm alone)") {
		t.Errorf("no gradient-norm spike of an ordinary batch reported and applied (the run this test needs):\n%s", stderr)
	}
	if !strings.Contains(stdout, "0 updates skipped (training.skip_spikes: at most 4 in a row, 20 in all)") {
		t.Errorf("the end line does not say 0 updates skipped and the bounds:\n%s", stdout)
	}

	data = filepath.Join(dir, "one.txt")
	plantSpikes(t, data, 600, longSpikeSets, 250)
	stdout, stderr, rows = spikeRun(t, dir, "one", data, longSpikeSets...)
	if s := skipped(rows); !slices.Equal(s, []int{250}) || !strings.Contains(stderr, "step 250: loss spike") {
		t.Errorf("one window planted at step 250: skipped %v, want [250]:\n%s", s, stderr)
	}
	if !strings.Contains(stdout, "1 updates skipped (training.skip_spikes: at most 4 in a row, 20 in all)") {
		t.Errorf("the end line does not say 1 update skipped and the bounds:\n%s", stdout)
	}

	data = filepath.Join(dir, "bounded.txt")
	plantSpikes(t, data, 600, longSpikeSets, 230, 231, 232, 233, 234, 235, 260, 270)
	stdout, stderr, rows = spikeRun(t, dir, "bounded", data, append(slices.Clone(longSpikeSets),
		"training.skip_spikes_max_consecutive=3", "training.skip_spikes_max_total=4")...)
	if s := skipped(rows); !slices.Equal(s, []int{230, 231, 232, 260}) {
		t.Errorf("skipped %v, want [230 231 232 260]:\n%s", s, stderr)
	}
	for _, want := range []string{
		"update applied: the loss has spiked 4 steps in a row, more than training.skip_spikes_max_consecutive = 3",
		"update applied: the loss has spiked 6 steps in a row, more than training.skip_spikes_max_consecutive = 3",
		"training.skip_spikes: 4 updates skipped, training.skip_spikes_max_total = 4: no more are skipped in this run",
		"step 270: loss spike",
		"update applied: 4 updates were skipped already, training.skip_spikes_max_total = 4",
	} {
		if !strings.Contains(stderr, want) {
			t.Errorf("the log does not say %q:\n%s", want, stderr)
		}
	}
	if n := strings.Count(stderr, "no more are skipped"); n != 1 {
		t.Errorf("the total reached is said %d times, want once:\n%s", n, stderr)
	}
	if !strings.Contains(stdout, "4 updates skipped (training.skip_spikes: at most 3 in a row, 4 in all)") {
		t.Errorf("the end line does not say 4 updates skipped and the bounds:\n%s", stdout)
	}
}
