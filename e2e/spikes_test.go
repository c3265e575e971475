package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
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
	const T, windows = 64, 300
	line := []byte("the quick brown fox jumps over the lazy dog; ")
	text := bytes.Repeat(line, (windows*T+1)/len(line)+1)[:windows*T+1]
	path := filepath.Join(dir, "data.txt")
	if err := os.WriteFile(path, text, 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := spikeConfig(t, path)
	loader, err := train.NewLoader(cfg, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	var w int
	for range at {
		w = loader.Next().Windows[0]
	}
	// window w reads bytes wT … wT+T−1 and predicts wT+1 … wT+T; its neighbours predict wT
	// (w−1's last target) and read wT+T: the random bytes stay strictly inside, so that only
	// step `at` sees them (with them at wT, window w−1's step spiked too, by 4× on a CPU whose Go
	// math uses FMA)
	rng := rand.New(rand.NewPCG(7, 7))
	for i := w*T + 1; i < w*T+T; i++ {
		text[i] = byte(33 + rng.IntN(94))
	}
	if err := os.WriteFile(path, text, 0o644); err != nil {
		t.Fatal(err)
	}
	return path, w
}

// spikeSets are the run of the spike tests: the default model on spikeData, batch 2 × 64, 150
// steps.
var spikeSets = []string{"data.seq_len=64", "data.batch_size=2", "training.steps=150", "training.warmup_steps=10",
	"run.log_interval=0", "data.max_bytes=0"}

func spikeConfig(t *testing.T, data string) config.Config {
	t.Helper()
	cfg := config.Default()
	for _, s := range append([]string{"data.train=" + data}, spikeSets...) {
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
		args := []string{"train", "--progress=false", "--set", "run.output_dir=" + dir, "--set", "run.name=" + name, "--set", "data.train=" + data}
		for _, s := range append(spikeSets, more...) {
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
