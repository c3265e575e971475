package train

import (
	"bytes"
	"fmt"
	"io"
	"math"
	"strings"
	"sync"
	"testing"

	"distflash/config"
	"distflash/kernels"
	"distflash/model"
	"distflash/plan"
	"distflash/world"
)

// syncRecorder is a backend that records, in order, the calls that make the host wait for the
// device (Download, SumSquares, AllFinite), the products (MatMul, MatMulHalf) and GradStats.
type syncRecorder struct {
	kernels.Backend
	mu     sync.Mutex
	events []string
}

func (s *syncRecorder) note(e string) {
	s.mu.Lock()
	s.events = append(s.events, e)
	s.mu.Unlock()
}

func (s *syncRecorder) Download(dst []float32, b kernels.Buf) {
	s.note("download")
	s.Backend.Download(dst, b)
}

func (s *syncRecorder) SumSquares(b kernels.Buf) float64 {
	s.note("sumsquares")
	return s.Backend.SumSquares(b)
}

func (s *syncRecorder) AllFinite(b kernels.Buf) bool {
	s.note("allfinite")
	return s.Backend.AllFinite(b)
}

func (s *syncRecorder) GradStats(dst, g kernels.Buf) {
	s.note("gradstats")
	s.Backend.GradStats(dst, g)
}

func (s *syncRecorder) MatMul(c, a, b kernels.Buf, m, n, k int, transA, transB bool, beta float32) {
	s.note("gemm")
	s.Backend.MatMul(c, a, b, m, n, k, transA, transB, beta)
}

func (s *syncRecorder) MatMulHalf(c, a, b kernels.Buf, m, n, k int, transA, transB bool, beta float32, p kernels.Precision, cHalf bool) {
	s.note("gemm")
	s.Backend.MatMulHalf(c, a, b, m, n, k, transA, transB, beta, p, cHalf)
}

// take returns the events since the last take.
func (s *syncRecorder) take() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.events
	s.events = nil
	return e
}

// TestOneSyncPerStep (issue 41, changes 4 and 6): a step on a device (the CPU posing as one:
// device.kind = "cpu-device") makes the host wait for it only after its last product is
// queued: no SumSquares, no AllFinite (GradStats writes Σg² and finiteness into the
// statistics on the device, once a step), and every Download (the losses, once, and the
// gathered statistics) after the step's last GEMM; in fp32 and bf16, with one micro-batch and
// two. The losses stay on the device until then (model.Model.DeferLoss).
func TestOneSyncPerStep(t *testing.T) {
	for _, sets := range [][]string{
		{"training.mixed_precision=fp32"},
		{"training.mixed_precision=bf16"},
		{"training.mixed_precision=bf16", "data.batch_size=1", "training.grad_accum_steps=2"},
	} {
		name := strings.Join(sets, " ")
		cfg, err := config.Load("../configs/tiny.toml", append([]string{"data.max_bytes=1048576", "data.batch_size=2",
			"device.kind=cpu-device", "run.output_dir=" + t.TempDir()}, sets...))
		if err != nil {
			t.Fatal(err)
		}
		w, err := world.Launch(&cfg, io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		rec := &syncRecorder{}
		w.Wrap = func(be kernels.Backend) kernels.Backend { rec.Backend = be; return rec }
		tr, err := newTrainerOn(cfg, io.Discard, w)
		if err != nil {
			t.Fatal(err)
		}
		rec.take()
		for s := 0; s < 3; s++ {
			if _, err := tr.step(s); err != nil {
				t.Fatal(err)
			}
			ev := rec.take()
			count := map[string]int{}
			lastGEMM, firstDownload := -1, -1
			for i, e := range ev {
				count[e]++
				if e == "gemm" {
					lastGEMM = i
				}
				if e == "download" && firstDownload < 0 {
					firstDownload = i
				}
			}
			if count["sumsquares"] != 0 || count["allfinite"] != 0 || count["gradstats"] != 1 {
				t.Errorf("%s step %d: %d SumSquares, %d AllFinite, %d GradStats: want 0, 0 and 1", name, s+1, count["sumsquares"], count["allfinite"], count["gradstats"])
			}
			if count["gemm"] == 0 || firstDownload < lastGEMM {
				t.Errorf("%s step %d: a Download at event %d before the last GEMM at %d of %d events (%d downloads)",
					name, s+1, firstDownload, lastGEMM, len(ev), count["download"])
			}
			if count["download"] != 2 {
				t.Errorf("%s step %d: %d downloads, want 2 (the losses, the statistics)", name, s+1, count["download"])
			}
		}
	}
}

// TestStepStatsAsBefore: the step's statistics gathered from the device (GradStats into the
// statistics buffer, the losses taken once) are those SumSquares and AllFinite give on the
// same gradients: the gradient norm bit for bit (Σg² carried as two float32, hi and lo), and a
// gradient made NaN on rank 1 flags the step on every rank (fp16: skipped); on 2 ranks without
// FSDP (sequence- or data-parallel: every rank holds the whole summed gradient, so rank 0's
// Σg² alone counts, and the norm stays rank 0's) and with FSDP (each rank's share summed, so
// the NaN reaches the norm).
func TestStepStatsAsBefore(t *testing.T) {
	for _, sets := range [][]string{
		{"parallelism.world_size=2", "parallelism.sequence_parallel_degree=2"},
		{"parallelism.world_size=2", "parallelism.sequence_parallel_degree=2", "parallelism.fsdp=true"},
		{"parallelism.world_size=2", "parallelism.sequence_parallel_degree=1"},
	} {
		name := strings.Join(sets, " ")
		cfg, err := config.Load("../configs/tiny.toml", append([]string{"data.max_bytes=1048576", "data.batch_size=2",
			"training.mixed_precision=fp16", "run.output_dir=" + t.TempDir()}, sets...))
		if err != nil {
			t.Fatal(err)
		}
		tr, err := newTrainer(cfg, io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		want := make([]float64, tr.size()) // each rank's Σg², as SumSquares sees it before the update
		var bad [2]bool
		tr.beforeUpdate = func(step int, r *rank) {
			if step == 2 && r.ID == 1 {
				host := make([]float32, r.Grads.Len())
				r.Backend.Download(host, r.Grads)
				host[len(host)/3] = float32(math.NaN())
				r.Backend.Upload(r.Grads, host)
			}
			want[r.ID] = r.Backend.SumSquares(r.Grads)
			bad[r.ID] = !r.Backend.AllFinite(r.Grads)
		}
		for s := 0; s < 3; s++ {
			m, err := tr.step(s)
			if err != nil {
				t.Fatal(err)
			}
			sumsq := want[0]
			if cfg.Parallelism.FSDP {
				sumsq = 0
				for _, v := range want {
					hi := float32(v)
					sumsq += float64(hi) + float64(float32(v-float64(hi)))
				}
			} else {
				hi := float32(sumsq)
				sumsq = float64(hi) + float64(float32(sumsq-float64(hi)))
			}
			norm := math.Sqrt(sumsq) / m.LossScale
			if s < 2 && (m.GradNorm != norm || m.Skipped) {
				t.Errorf("%s step %d: grad norm %v, want %v (skipped %v)", name, s+1, m.GradNorm, norm, m.Skipped)
			}
			if s == 2 && (!m.Skipped || !bad[1] || bad[0] || cfg.Parallelism.FSDP != math.IsNaN(m.GradNorm) || !cfg.Parallelism.FSDP && m.GradNorm != norm) {
				t.Errorf("%s step 3, a NaN gradient on rank 1: skipped %v, grad norm %v (rank 0's %v)", name, m.Skipped, m.GradNorm, norm)
			}
			if m.Tokens != cfg.TokensPerStep() || !(m.Loss > 0) {
				t.Errorf("%s step %d: loss %v over %d tokens", name, s+1, m.Loss, m.Tokens)
			}
		}
	}
}

// TestHalfCopyFollowsTheUpdate (issue 41, change 4): after bf16 steps the 16-bit compute copy
// the model computes with is the fp32 master weights rounded to bf16, bit for bit, whether
// the optimizer wrote it in its update (a cast store with one packed buffer: Rank.Half) or a
// refresh followed the update.
func TestHalfCopyFollowsTheUpdate(t *testing.T) {
	_, tr := trainSteps(t, 3, "training.mixed_precision=bf16")
	r := tr.ranks[0]
	be := r.Backend
	if r.Cast == nil {
		t.Fatal("no cast store under bf16")
	}
	t.Logf("the optimizer writes the copy in its update: %v", r.Half() != nil)
	layout := r.Model.Layout
	for u, unit := range layout.Units() {
		master := be.Slice(r.Params, unit.Off, unit.N)
		want := be.Alloc(unit.N)
		packed := be.Alloc((unit.N + 1) / 2)
		be.PackHalf(packed, master, kernels.BF16)
		be.UnpackHalf(want, packed, kernels.BF16)
		got := r.Cast.Params(u)
		a, b := make([]float32, unit.N), make([]float32, unit.N)
		be.Download(a, got)
		be.Download(b, want)
		for i := range a {
			if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
				t.Fatalf("unit %d value %d: the copy holds %v, the master rounded %v", u, i, a[i], b[i])
			}
		}
	}
}

// TestResumeKeepsTheChoice: a resumed run keeps what the run it resumes chose for what the
// config leaves to the device, where that still fits (its models take it), and says so; where
// it does not fit, the new choice stands and the message says what the old one needs; a
// checkpoint without a record, or a config that leaves nothing, changes nothing.
func TestResumeKeepsTheChoice(t *testing.T) {
	cfg, err := config.Load("../configs/tiny.toml", []string{"data.max_bytes=1048576", "data.batch_size=2", "run.output_dir=" + t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	tr, err := newTrainer(cfg, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if tr.choice.Policy != "none" || !tr.choice.Fits {
		t.Fatalf("tiny on this machine chose %+v, want none", tr.choice)
	}
	var out bytes.Buffer
	if err := tr.resumeChoice(nil, &out); err != nil || out.Len() != 0 {
		t.Errorf("no record: %v %q", err, out.String())
	}
	if err := tr.resumeChoice(&plan.Candidate{Policy: "layer", MLPTile: 128, LossChunk: 0}, &out); err != nil {
		t.Fatal(err)
	}
	m := tr.ranks[0].Model
	if m.Policy != model.CheckpointLayer || m.MLPTile != 128 || m.LossChunk != 0 || tr.choice.Policy != "layer" ||
		!strings.Contains(out.String(), "as the resumed run ran") || !strings.Contains(out.String(), "checkpoint.activation layer, training.mlp_tile 128 tokens") {
		t.Errorf("a record that fits: policy %v tile %d chunk %d; %q", m.Policy, m.MLPTile, m.LossChunk, out.String())
	}
	if _, err := tr.step(0); err != nil { // the models size their buffers for what they took
		t.Fatal(err)
	}
	out.Reset()
	tr.choice = plan.Choose(cfg, 1e6) // a machine of 1 MB: nothing fits, so layer
	tr.memory = 1e6
	if err := tr.resumeChoice(&plan.Candidate{Policy: "none"}, &out); err != nil {
		t.Fatal(err)
	}
	if tr.choice.Policy != "layer" || !strings.Contains(out.String(), "resume: the resumed run ran checkpoint.activation none") ||
		!strings.Contains(out.String(), fmt.Sprintf("of the %.1f GB here", tr.choice.Budget/1e9)) {
		t.Errorf("a record that does not fit: %+v; %q", tr.choice.Candidate, out.String())
	}
}
