package kernels

import (
	"fmt"
	"math"
	"strings"
	"time"
)

// The per-op profile (train --profile): the work of a step cut into op classes (each GEMM by
// its role in the model, attention, RMSNorm, RoPE, SwiGLU, residual adds, the loss, casts, the
// optimizer, communication) and phases, each with its time on the backend's own clock, its
// calls, the bytes it must move and the FLOPs it must do, and its ratio to its floor: the time
// those bytes take at the measured memory bandwidth, or those FLOPs at the measured GEMM rate.
//
// The caller brackets each backend call with Begin and End (the model knows which GEMM is
// which); an OpProfile records nothing outside BeginStep … EndStep, and a nil *OpProfile
// records nothing at all, so an unprofiled step costs a nil check per op. Time comes from an
// OpTimer: CUDA events recorded on the backend's stream (the host does not wait for them until
// EndStep), the wall clock on the CPU backend (whose calls return when their work is done), a
// fake in tests. What the device spends outside every bracket in a step (waiting for the host
// to queue the next op, or work nobody bracketed) is the step's gap.

// OpClass is what an op does.
type OpClass uint8

// The op classes, in the order of the table.
const (
	OpGemmQ      OpClass = iota // the query projection Wq
	OpGemmK                     // the key projection Wk
	OpGemmV                     // the value projection Wv
	OpGemmO                     // the attention output projection Wo
	OpGemmGate                  // the MLP's gate projection
	OpGemmUp                    // the MLP's up projection
	OpGemmDown                  // the MLP's down projection
	OpGemmHead                  // the output head
	OpGemmQKV                   // the fused query, key and value projection [Wq|Wk|Wv] (the 16-bit step)
	OpGemmGateUp                // the fused gate and up projection [Wgate|Wup] (the 16-bit step)
	OpAttention                 // attention (a schedule's blocks and exchanges included)
	OpRMSNorm                   // RMSNorm
	OpAddRMSNorm                // the residual add fused with the next RMSNorm (AddRMSNorm)
	OpRoPE                      // the rotary embedding of queries and keys (its inverse in the backward)
	OpSwiGLU                    // the SwiGLU activation
	OpResidual                  // residual adds
	OpLoss                      // cross-entropy over the logits (and their gradient)
	OpEmbedding                 // the input embedding (its gradient in the backward)
	OpCast                      // 16-bit copies: kept activations, the weights' compute copy
	OpZero                      // clearing gradient buffers
	OpOptimizer                 // the AdamW update
	OpComm                      // communication between ranks (collectives, FSDP gathers)
	numOpClasses
)

var opClassNames = [numOpClasses]string{"gemm.q", "gemm.k", "gemm.v", "gemm.o", "gemm.gate", "gemm.up",
	"gemm.down", "gemm.head", "gemm.qkv", "gemm.gate+up", "attention", "rmsnorm", "add+rmsnorm", "rope", "swiglu", "residual", "loss",
	"embedding", "cast", "zero", "optimizer", "comm"}

func (c OpClass) String() string {
	if c < numOpClasses {
		return opClassNames[c]
	}
	return fmt.Sprintf("OpClass(%d)", uint8(c))
}

// computeBound reports whether the class's floor counts FLOPs at the GEMM rate (GEMMs and
// attention, on tensor cores) besides bytes at the memory bandwidth.
func (c OpClass) computeBound() bool { return c <= OpAttention }

// Phase is the part of a step an op runs in.
type Phase uint8

const (
	PhaseForward   Phase = iota // the forward pass
	PhaseRecompute              // the backward's recomputation of what the checkpoint policy did not keep
	PhaseBackward               // the backward pass
	PhaseStep                   // around the passes: the optimizer, the weights' refresh, the step's statistics
	numPhases
)

var phaseNames = [numPhases]string{"fwd", "recompute", "bwd", "step"}

func (p Phase) String() string {
	if p < numPhases {
		return phaseNames[p]
	}
	return fmt.Sprintf("Phase(%d)", uint8(p))
}

// OpCost is what an op must move and compute: the bytes of each operand read once and each
// result written once (an accumulated result is read and written), as the Backend's float32
// buffers hold them, and its floating-point operations.
type OpCost struct {
	Bytes, FLOPs int64
}

// Plus is the sum of two costs.
func (c OpCost) Plus(d OpCost) OpCost { return OpCost{c.Bytes + d.Bytes, c.FLOPs + d.FLOPs} }

// The costs of the Backend's methods, for the sizes their calls take.

// MatMulCost is MatMul's: 2mnk FLOPs; A, B and C (read too when beta is not 0).
func MatMulCost(m, n, k int, beta float32) OpCost {
	c := int64(m)*int64(n) + int64(m)*int64(k) + int64(k)*int64(n)
	if beta != 0 {
		c += int64(m) * int64(n)
	}
	return OpCost{4 * c, 2 * int64(m) * int64(n) * int64(k)}
}

// RMSNormCost is RMSNorm's: x in, out and rstd out, w; 4 FLOPs an element.
func RMSNormCost(rows, dim int) OpCost {
	e := int64(rows) * int64(dim)
	return OpCost{4 * (2*e + int64(dim) + int64(rows)), 4 * e}
}

// RMSNormBackwardCost is RMSNormBackward's: dout and x in, dx accumulated, dw accumulated, w
// and rstd; 10 FLOPs an element.
func RMSNormBackwardCost(rows, dim int) OpCost {
	e := int64(rows) * int64(dim)
	return OpCost{4 * (4*e + 3*int64(dim) + int64(rows)), 10 * e}
}

// AddRMSNormCost is AddRMSNorm's: a and b in, their sum and its norm out, w and rstd.
func AddRMSNormCost(rows, dim int) OpCost {
	e := int64(rows) * int64(dim)
	return OpCost{4 * (4*e + int64(dim) + int64(rows)), 5 * e}
}

// RoPECost is RoPE's on tokens·heads·headDim values, turned in place (and the positions).
func RoPECost(tokens, heads, headDim int) OpCost {
	e := int64(tokens) * int64(heads) * int64(headDim)
	return OpCost{4 * (2*e + int64(tokens)), 3 * e}
}

// SwiGLUCost is SwiGLU's on n elements: gate and up in, out.
func SwiGLUCost(n int) OpCost { return OpCost{12 * int64(n), 5 * int64(n)} }

// SwiGLUBackwardCost is SwiGLUBackward's: dout, gate and up in, dgate and dup out.
func SwiGLUBackwardCost(n int) OpCost { return OpCost{20 * int64(n), 10 * int64(n)} }

// SwiGLUBackwardActCost is SwiGLUBackwardAct's: dout, gate and up in, act, dgate and dup out.
func SwiGLUBackwardActCost(n int) OpCost { return OpCost{24 * int64(n), 12 * int64(n)} }

// AddCost is Add's on n elements.
func AddCost(n int) OpCost { return OpCost{12 * int64(n), int64(n)} }

// ZeroCost is Zero's on n elements.
func ZeroCost(n int) OpCost { return OpCost{4 * int64(n), 0} }

// HalfCost is PackHalf's or UnpackHalf's on n values: 4 bytes each on one side, 2 on the other.
func HalfCost(n int) OpCost { return OpCost{6 * int64(n), int64(n)} }

// EmbeddingCost is Embedding's (backward false: rows of the table copied out) or
// EmbeddingBackward's (dout in, rows of the table accumulated).
func EmbeddingCost(tokens, dim int, backward bool) OpCost {
	e := int64(tokens) * int64(dim)
	if backward {
		return OpCost{4 * (3*e + int64(tokens)), e}
	}
	return OpCost{4 * (2*e + int64(tokens)), 0}
}

// CrossEntropyCost is CrossEntropy's on rows of vocab logits (grad: dlogits written).
func CrossEntropyCost(rows, vocab int, grad bool) OpCost {
	e := int64(rows) * int64(vocab)
	c := OpCost{4 * (e + 3*int64(rows)), 3 * e}
	if grad {
		c.Bytes += 4 * e
		c.FLOPs += 2 * e
	}
	return c
}

// AdamWCost is AdamW's on n parameters: p, g, m, v in, p, m, v out; 17 FLOPs each.
func AdamWCost(n int) OpCost { return OpCost{28 * int64(n), 17 * int64(n)} }

// AttnCost is the bytes of attention over s (q, k, v in, o and lse out; backward: q, k, v, o,
// dO and lse in, dq, dk, dv accumulated) with the FLOPs the caller read from the backend's
// Counters (the scores it computed).
func AttnCost(s AttnShape, backward bool, flops int64) OpCost {
	q, kv, st := int64(s.NQ)*int64(s.Heads*s.HeadDim), int64(s.NK)*int64(s.KVHeads*s.HeadDim), int64(s.NQ)*int64(s.Heads)
	if backward {
		return OpCost{4 * (3*q + 2*kv + st + 2*q + 4*kv), flops}
	}
	return OpCost{4 * (2*q + 2*kv + st), flops}
}

// OpTimer is a backend's clock for the per-op profile.
type OpTimer interface {
	// Mark records the point the backend's queue of work has reached (everything queued
	// before it) and returns its number, counted from 0 after Reset. It does not wait for the
	// device.
	Mark() int
	// Times waits until every mark is reached and returns the time of each, in seconds after
	// mark 0.
	Times() []float64
	// Reset forgets the marks.
	Reset()
}

// TimerOf returns the clock of be: its own when it has one (the CUDA backend's events),
// else the host's wall clock, right for a backend whose calls return when their work is done.
func TimerOf(be Backend) OpTimer {
	if t, ok := be.(interface{ NewOpTimer() OpTimer }); ok {
		return t.NewOpTimer()
	}
	return &hostTimer{}
}

// hostTimer is the wall clock.
type hostTimer struct{ marks []time.Time }

func (h *hostTimer) Mark() int {
	h.marks = append(h.marks, time.Now())
	return len(h.marks) - 1
}

func (h *hostTimer) Times() []float64 {
	out := make([]float64, len(h.marks))
	for i, t := range h.marks {
		out[i] = t.Sub(h.marks[0]).Seconds()
	}
	return out
}

func (h *hostTimer) Reset() { h.marks = h.marks[:0] }

// TickTimer is an OpTimer for tests: its clock reads Tick·i at mark i after a Reset, so every
// op bracketed between two marks lasts one tick, and so does every gap between two ops.
type TickTimer struct {
	Tick   float64
	n      int
	marked int
}

// NewTickTimer returns a TickTimer of tick seconds.
func NewTickTimer(tick float64) *TickTimer { return &TickTimer{Tick: tick} }

// Mark implements OpTimer.
func (f *TickTimer) Mark() int {
	f.n++
	f.marked++
	return f.n - 1
}

// Times implements OpTimer.
func (f *TickTimer) Times() []float64 {
	t := make([]float64, f.n)
	for i := range t {
		t[i] = f.Tick * float64(i)
	}
	return t
}

// Reset implements OpTimer.
func (f *TickTimer) Reset() { f.n = 0 }

// Marked is the number of marks since the timer was made (Reset does not clear it).
func (f *TickTimer) Marked() int { return f.marked }

// Ceilings are what an op's floor divides by: the memory bandwidth (bytes/s) and the GEMM rate
// (FLOP/s of a GEMM on 16-bit operands, as Calibrate measures it), with the GPU's catalogue
// peak beside them for reference.
type Ceilings struct {
	BytesPerSec float64 `json:"bytes_per_s"`
	FLOPsPerSec float64 `json:"gemm_flops_per_s"`
	// Source says where they come from: "measured" (Calibrate) or what else the caller says.
	Source string `json:"source"`
	// GEMM describes the product the GEMM rate was measured on (Calibrate), e.g. "4096³ bf16".
	GEMM string `json:"gemm,omitempty"`
	// PeakFLOPsPerSec is the device's dense bf16 tensor-core peak from NVIDIA's catalogue
	// (CataloguePeak), 0 when the device is not in it; PeakName names the catalogue's entry.
	// The floors do not use it: it says how far the measured GEMM rate is from the data sheet.
	PeakFLOPsPerSec float64 `json:"catalogue_bf16_flops_per_s,omitempty"`
	PeakName        string  `json:"catalogue_device,omitempty"`
}

// gpuPeaks are NVIDIA's data-sheet dense bf16 tensor-core peaks (float32 accumulation, no
// sparsity) of the GPUs by a substring of the name the driver gives (cuDeviceGetName), first
// match wins: the more specific names first. The H200 NVL, whose peak is lower, is listed as
// not named, so that the H200's entry is not taken for it; the H100 NVL and the L40 (not S)
// match no entry.
var gpuPeaks = []struct {
	match, name string
	flops       float64
}{
	{"GH200", "GH200", 989e12},
	{"H200 NVL", "", 0},
	{"H200", "H200", 989e12},
	{"H100 SXM", "H100 SXM", 989e12},
	{"H100 80GB HBM3", "H100 SXM", 989e12},
	{"H100 PCIe", "H100 PCIe", 756e12},
	{"A100", "A100", 312e12},
	{"L40S", "L40S", 362e12},
	{"RTX 4090", "RTX 4090", 165e12},
}

// CataloguePeak returns the dense bf16 peak (FLOP/s) of the GPU the driver names device (e.g.
// "NVIDIA H100 80GB HBM3") and the catalogue's name for it, or 0 and "" for a device the
// catalogue does not name.
func CataloguePeak(device string) (name string, flops float64) {
	for _, g := range gpuPeaks {
		if strings.Contains(device, g.match) {
			return g.name, g.flops
		}
	}
	return "", 0
}

// Floor is the least time an op of class c with cost x takes under the ceilings: its bytes at
// the bandwidth, and, for GEMMs and attention, its FLOPs at the GEMM rate if that is longer.
// 0 when the ceilings are not known.
func (c Ceilings) Floor(class OpClass, x OpCost) float64 {
	var f float64
	if c.BytesPerSec > 0 {
		f = float64(x.Bytes) / c.BytesPerSec
	}
	if class.computeBound() && c.FLOPsPerSec > 0 {
		f = max(f, float64(x.FLOPs)/c.FLOPsPerSec)
	}
	return f
}

// Calibration sizes the measurement of Calibrate.
type Calibration struct {
	CopyElems int // float32 elements of each of the copy's two buffers (its bytes are read and written)
	GEMM      int // m = n = k of the product timed
	Reps      int // repetitions of each; the fastest counts
}

// The CPU's copy buffers: each at least 4 times the last-level cache, so that the copy streams
// from memory as a large op's operands do, and no less than calibMinCopy nor more than
// calibMaxCopy bytes.
const (
	calibMinCopy = 128 << 20
	calibMaxCopy = 512 << 20
)

// CalibrationFor is the measurement for be: 2×128 MiB copies and 4096³ products on a GPU (whose
// L2 cache is tens of MiB); on the CPU, copies of two buffers each 4 times the last-level cache
// (LastLevelCache; 128 to 512 MiB) and 512³ products.
func CalibrationFor(be Backend) Calibration {
	if _, ok := be.(interface{ NewOpTimer() OpTimer }); ok {
		return Calibration{CopyElems: 32 << 20, GEMM: 4096, Reps: 5}
	}
	return Calibration{CopyElems: int(min(max(4*LastLevelCache(), calibMinCopy), calibMaxCopy) / 4), GEMM: 512, Reps: 3}
}

// Calibrate measures be's ceilings with t: the bandwidth of Copy (its bytes read and written)
// and the rate of a GEMM on 16-bit operands (MatMulHalf: A·Bᵀ, A, B and C packed in be's
// MatMul precision when it is FP16, else BF16; the rate of native 16-bit cuBLAS on a GPU, not of
// MatMul's float32 storage), the fastest of k.Reps runs of each; and it names the device's
// catalogue peak (CataloguePeak) when be names its GPU. The copy buffers and the GEMM operands
// are written first, with values that are not 0: memory the process has never written may all
// be one shared page of zeros, which a copy reads from the cache (and a tensor core's power
// draw, so its clock, depends on the data).
func Calibrate(be Backend, t OpTimer, k Calibration) Ceilings {
	src, dst := be.Alloc(k.CopyElems), be.Alloc(k.CopyElems)
	fill(be, src)
	be.Zero(dst)
	p := BF16
	if be.MatMulPrecision() == FP16 {
		p = FP16
	}
	n2 := k.GEMM * k.GEMM
	a, b, c := be.Alloc((n2+1)/2), be.Alloc((n2+1)/2), be.Alloc((n2+1)/2)
	w := be.Alloc(n2)
	fill(be, w)           // 1 … 251
	be.Scale(w, 1.0/1024) // at most 0.25: k products of them stay far inside fp16's range
	be.PackHalf(a, w, p)
	be.PackHalf(b, w, p)
	gemm := func() { be.MatMulHalf(c, a, b, k.GEMM, k.GEMM, k.GEMM, false, true, 0, p, true) }
	t.Reset()
	be.Copy(dst, src) // warm up: first use of the buffers, the GEMM's algorithm
	gemm()
	t.Mark()
	for range k.Reps {
		be.Copy(dst, src)
		t.Mark()
	}
	for range k.Reps {
		gemm()
		t.Mark()
	}
	times := t.Times()
	t.Reset()
	best := func(from int) float64 {
		d := math.Inf(1)
		for i := from; i < from+k.Reps; i++ {
			d = min(d, times[i+1]-times[i])
		}
		return d
	}
	cp, mm := best(0), best(k.Reps)
	out := Ceilings{Source: "measured", GEMM: fmt.Sprintf("%d³ %v", k.GEMM, p)}
	if d, ok := be.(interface{ DeviceName() string }); ok {
		out.PeakName, out.PeakFLOPsPerSec = CataloguePeak(d.DeviceName())
	}
	if cp > 0 {
		out.BytesPerSec = 8 * float64(k.CopyElems) / cp
	}
	if mm > 0 {
		out.FLOPsPerSec = 2 * math.Pow(float64(k.GEMM), 3) / mm
	}
	return out
}

// fill writes every element of b with values that are not 0, a chunk of 1M at a time (no
// host copy of the whole buffer).
func fill(be Backend, b Buf) {
	chunk := make([]float32, min(b.Len(), 1<<20))
	for i := range chunk {
		chunk[i] = 1 + float32(i%251)
	}
	for off := 0; off < b.Len(); off += len(chunk) {
		n := min(len(chunk), b.Len()-off)
		be.Upload(be.Slice(b, off, n), chunk[:n])
	}
}

// OpProfile records the ops of the steps it is told about and aggregates them per class and
// phase. Its methods are for one goroutine (a rank's); a nil *OpProfile records nothing.
type OpProfile struct {
	timer    OpTimer
	ceil     Ceilings
	inStep   bool
	depth    int // open brackets; only the outermost is recorded
	spans    []opSpan
	steps    int
	total    float64 // seconds of the steps, on the timer's clock
	gaps     float64 // seconds of the steps outside every op
	stats    [numOpClasses][numPhases]opStat
	firstMrk int // the step's first mark
}

type opSpan struct {
	class      OpClass
	phase      Phase
	begin, end int // marks
	cost       OpCost
}

type opStat struct {
	calls        int64
	seconds      float64
	cost         OpCost
	floorSeconds float64
}

// NewOpProfile returns a profile timed by t whose floors divide by c.
func NewOpProfile(t OpTimer, c Ceilings) *OpProfile { return &OpProfile{timer: t, ceil: c} }

// BeginStep starts a profiled step: ops are recorded until EndStep.
func (p *OpProfile) BeginStep() {
	if p == nil || p.inStep {
		return
	}
	p.timer.Reset()
	p.spans, p.depth = p.spans[:0], 0
	p.firstMrk = p.timer.Mark()
	p.inStep = true
}

// Begin opens an op of class c in phase ph. Brackets nest; only the outermost is recorded (a
// schedule's exchanges inside attention are attention's time).
func (p *OpProfile) Begin(c OpClass, ph Phase) {
	if p == nil || !p.inStep {
		return
	}
	p.depth++
	if p.depth == 1 {
		p.spans = append(p.spans, opSpan{class: c, phase: ph, begin: p.timer.Mark()})
	}
}

// End closes the innermost open op; x is its cost (the outermost op's is kept).
func (p *OpProfile) End(x OpCost) {
	if p == nil || !p.inStep || p.depth == 0 {
		return
	}
	p.depth--
	if p.depth == 0 {
		s := &p.spans[len(p.spans)-1]
		s.end, s.cost = p.timer.Mark(), x
	}
}

// Active reports whether ops are being recorded (inside a profiled step): a caller may skip
// working out a cost that would not be used.
func (p *OpProfile) Active() bool { return p != nil && p.inStep }

// EndStep ends the step: it waits for the timer's marks (the one wait for the device a
// profiled step adds) and adds the step's ops into the profile.
func (p *OpProfile) EndStep() {
	if p == nil || !p.inStep {
		return
	}
	last := p.timer.Mark()
	times := p.timer.Times()
	p.inStep = false
	step := times[last] - times[p.firstMrk]
	inside := 0.0
	for _, s := range p.spans {
		if s.end <= s.begin { // left open (a panic unwound through it): not counted
			continue
		}
		d := times[s.end] - times[s.begin]
		st := &p.stats[s.class][s.phase]
		st.calls++
		st.seconds += d
		st.cost = st.cost.Plus(s.cost)
		st.floorSeconds += p.ceil.Floor(s.class, s.cost)
		inside += d
	}
	p.steps++
	p.total += step
	p.gaps += max(step-inside, 0)
	p.timer.Reset()
}

// Steps is the number of steps recorded.
func (p *OpProfile) Steps() int { return p.steps }

// OpRow is one op class in one phase, per profiled step (the mean of the steps).
type OpRow struct {
	Op    string  `json:"op"`
	Phase string  `json:"phase"`
	Calls float64 `json:"calls"`
	// Seconds on the backend's clock.
	Seconds float64 `json:"seconds"`
	Bytes   float64 `json:"bytes"`
	FLOPs   float64 `json:"flops"`
	// FloorSeconds is the ceilings' least time for these bytes and FLOPs (Ceilings.Floor), and
	// Ratio Seconds / FloorSeconds: 0, and absent from JSON, when there is no floor (no
	// ceilings known, or an op that moves no bytes, as a single rank's collectives).
	FloorSeconds float64 `json:"floor_seconds"`
	Ratio        float64 `json:"ratio,omitempty"`
}

// OpTable is the per-op profile of the recorded steps.
type OpTable struct {
	Device string   `json:"device"`
	Steps  int      `json:"steps"`
	Ceil   Ceilings `json:"ceilings"`
	// StepSeconds is the mean time of a step on the backend's clock, from its first mark to
	// its last; GapSeconds the part of it outside every op.
	StepSeconds float64 `json:"step_seconds"`
	GapSeconds  float64 `json:"gap_seconds"`
	Rows        []OpRow `json:"ops"`
}

// Table returns the profile per class and phase (the classes in their order, phases within),
// with the gaps as the last row ("gaps", phase "step"); device names the backend.
func (p *OpProfile) Table(device string) OpTable {
	t := OpTable{Device: device, Steps: p.steps, Ceil: p.ceil}
	if p.steps == 0 {
		return t
	}
	n := float64(p.steps)
	t.StepSeconds, t.GapSeconds = p.total/n, p.gaps/n
	for c := range numOpClasses {
		for ph := range numPhases {
			s := p.stats[c][ph]
			if s.calls == 0 {
				continue
			}
			r := OpRow{Op: c.String(), Phase: ph.String(), Calls: float64(s.calls) / n, Seconds: s.seconds / n,
				Bytes: float64(s.cost.Bytes) / n, FLOPs: float64(s.cost.FLOPs) / n, FloorSeconds: s.floorSeconds / n}
			if r.FloorSeconds > 0 {
				r.Ratio = r.Seconds / r.FloorSeconds
			}
			t.Rows = append(t.Rows, r)
		}
	}
	t.Rows = append(t.Rows, OpRow{Op: "gaps", Phase: "step", Seconds: t.GapSeconds})
	return t
}

// Text writes the table for people: one line per class and phase, per step.
func (t OpTable) Text() string {
	var b strings.Builder
	fmt.Fprintf(&b, "per-op profile of %d steps on %s: %.3f ms a step on the device's clock, %.3f ms of it outside every op (gaps)\n",
		t.Steps, t.Device, 1e3*t.StepSeconds, 1e3*t.GapSeconds)
	if t.Ceil.BytesPerSec > 0 || t.Ceil.FLOPsPerSec > 0 {
		fmt.Fprintf(&b, "floors (%s): bytes at %.4g GB/s, GEMM and attention FLOPs at %.4g TFLOP/s", t.Ceil.Source,
			t.Ceil.BytesPerSec/1e9, t.Ceil.FLOPsPerSec/1e12)
		if t.Ceil.GEMM != "" {
			fmt.Fprintf(&b, " (a %s GEMM)", t.Ceil.GEMM)
		}
		b.WriteString("\n")
	}
	if t.Ceil.PeakFLOPsPerSec > 0 {
		fmt.Fprintf(&b, "catalogue: %s, dense bf16 peak %.4g TFLOP/s (the measured GEMM rate is %.0f%% of it)\n", t.Ceil.PeakName,
			t.Ceil.PeakFLOPsPerSec/1e12, 100*t.Ceil.FLOPsPerSec/t.Ceil.PeakFLOPsPerSec)
	}
	fmt.Fprintf(&b, "%-12s %-9s %7s %10s %6s %10s %11s %8s %8s %9s %7s\n", "op", "phase", "calls", "ms/step", "share",
		"MB/step", "GFLOP/step", "GB/s", "TFLOP/s", "floor ms", "×floor")
	var calls, secs, bytes, flops, floor float64
	for _, r := range t.Rows {
		share := 0.0
		if t.StepSeconds > 0 {
			share = 100 * r.Seconds / t.StepSeconds
		}
		if r.Op == "gaps" {
			fmt.Fprintf(&b, "%-12s %-9s %7s %10.3f %5.1f%%\n", r.Op, r.Phase, "", 1e3*r.Seconds, share)
			continue
		}
		calls, secs, bytes, flops, floor = calls+r.Calls, secs+r.Seconds, bytes+r.Bytes, flops+r.FLOPs, floor+r.FloorSeconds
		fmt.Fprintf(&b, "%-12s %-9s %7.0f %10.3f %5.1f%% %10.1f %11.3f %8s %8s %9s %7s\n", r.Op, r.Phase, r.Calls,
			1e3*r.Seconds, share, r.Bytes/1e6, r.FLOPs/1e9, rate(r.Bytes, r.Seconds, 1e9), rate(r.FLOPs, r.Seconds, 1e12),
			optMs(r.FloorSeconds), optRatio(r.Ratio))
	}
	ratio := 0.0
	if floor > 0 {
		ratio = secs / floor
	}
	fmt.Fprintf(&b, "%-12s %-9s %7.0f %10.3f %5.1f%% %10.1f %11.3f %8s %8s %9s %7s\n", "ops", "all", calls, 1e3*secs,
		100*secs/max(t.StepSeconds, 1e-300), bytes/1e6, flops/1e9, rate(bytes, secs, 1e9), rate(flops, secs, 1e12),
		optMs(floor), optRatio(ratio))
	return b.String()
}

func rate(x, secs, unit float64) string {
	if secs <= 0 || x == 0 {
		return "-"
	}
	return fmt.Sprintf("%.4g", x/secs/unit)
}

func optMs(s float64) string {
	if s <= 0 {
		return "-"
	}
	return fmt.Sprintf("%.3f", 1e3*s)
}

func optRatio(r float64) string {
	if r <= 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f", r)
}
