package parallel

import (
	"fmt"
	"math"
	"slices"
	"sort"

	"distflash/kernels"
	"distflash/model"
	"distflash/parallel/transport"
)

// Schedule is a sequence-parallel attention: one rank's part of causal attention over a
// sequence split across the ranks of a communicator. It is a model.Attention, so the model
// runs unchanged on any schedule.
type Schedule interface {
	model.Attention
	// Name is the parallelism.attention value.
	Name() string
	// Layout is how the schedule needs the tokens split across ranks.
	Layout() Layout
}

// Options tune a schedule.
type Options struct {
	// Overlap prefetches the next block (K/V, or Q for Burst's backward) while the current one
	// computes (parallelism.overlap_comm).
	Overlap bool
	// UlyssesDegree, when above 1, runs the schedule between groups of this many consecutive
	// ranks joined by a Ulysses all-to-all (parallelism.ulysses_degree, hybrid.go); it must
	// divide the ranks. 0 and 1 are off; with the ulysses schedule it changes nothing.
	UlyssesDegree int
}

// constructor builds a schedule for one rank.
type constructor func(c transport.Comm, be kernels.Backend, opt Options) Schedule

// checker reports why a schedule cannot run heads h on P ranks, or nil.
type checker func(h model.Heads, P int) error

var schedules = map[string]struct {
	make  constructor
	check checker
}{}

// register adds a schedule; each schedule's file registers itself in init.
func register(name string, make constructor, check checker) {
	schedules[name] = struct {
		make  constructor
		check checker
	}{make, check}
}

// layouts is the token layout each schedule needs: the one place that decides how a batch's
// tokens and positions are split across ranks (Layout.Positions, Shard).
var layouts = map[string]Layout{
	"ring": Contiguous, "distflash": Contiguous, "burst": Contiguous, "ulysses": Contiguous,
	"zigzag": ZigZag, "attn2d": Cyclic,
}

// LayoutOf returns the token layout of schedule name.
func LayoutOf(name string) (Layout, error) {
	l, ok := layouts[name]
	if !ok {
		return 0, fmt.Errorf("parallel: parallelism.attention = %q: want one of %v", name, Names())
	}
	return l, nil
}

// Names lists the registered schedules.
func Names() []string {
	var n []string
	for k := range schedules {
		n = append(n, k)
	}
	sort.Strings(n)
	return n
}

// Check reports whether schedule name can run attention with heads h on P ranks, with an
// error that says why not (for example Ulysses with a head count P does not divide).
func Check(name string, h model.Heads, P int) error {
	s, ok := schedules[name]
	if !ok {
		return fmt.Errorf("parallel: parallelism.attention = %q: want one of %v", name, Names())
	}
	if s.check == nil {
		return nil
	}
	return s.check(h, P)
}

// NewAttention returns this rank's instance of schedule name on communicator c.
func NewAttention(name string, c transport.Comm, be kernels.Backend, opt Options) (Schedule, error) {
	s, ok := schedules[name]
	if !ok {
		return nil, fmt.Errorf("parallel: parallelism.attention = %q: want one of %v", name, Names())
	}
	if opt.UlyssesDegree > 1 {
		if err := checkHybridShape(name, c.Size(), opt.UlyssesDegree); err != nil {
			return nil, err
		}
		if name != "ulysses" {
			return newHybrid(name, opt.UlyssesDegree, c, be, opt)
		}
	}
	return s.make(c, be, opt), nil
}

// blockShape is the attention-primitive shape of queries at qPos against keys at kPos, masked
// by the documents of seq when it has them. Every rank holds the whole sequence's document
// starts (model.Seq.DocStart) and the window, so no document ids travel with the blocks.
func blockShape(qPos, kPos []int32, seq model.Seq, h model.Heads) kernels.AttnShape {
	return kernels.AttnShape{NQ: len(qPos), NK: len(kPos), Heads: h.N, KVHeads: h.KV, HeadDim: h.Dim,
		Causal: true, Scale: float32(1 / math.Sqrt(float64(h.Dim))), QPos: qPos, KPos: kPos,
		QStart: seq.Starts(qPos)}
}

// newState allocates an empty partial result for n queries.
func newState(be kernels.Backend, n int, h model.Heads) kernels.AttnState {
	s := kernels.AttnState{O: be.Alloc(n * h.N * h.Dim), M: be.Alloc(n * h.N), L: be.Alloc(n * h.N)}
	be.AttnInit(s)
	return s
}

// visibleDoc reports whether any key at kPos is visible to any query at qPos under the causal
// mask and the documents of seq. Schedules skip the blocks for which it is false: they would
// compute nothing. A block that only the document mask hides is counted on be
// (Counters.AttnDocSkipped).
func visibleDoc(be kernels.Backend, qPos, kPos []int32, seq model.Seq) bool {
	if !visible(qPos, kPos) {
		return false
	}
	if !seq.Masked() || docVisible(qPos, kPos, seq) {
		return true
	}
	be.Counters().AttnDocSkipped.Add(1)
	return false
}

// pairVisible reports whether any key at kPos is visible to any query at qPos under the causal
// mask and the starts of seq (documents, a sliding window): visibleDoc without counting, for
// deciding what to send. Every rank holds every rank's positions and the whole sequence's
// starts, so sender and receiver decide alike.
func pairVisible(qPos, kPos []int32, seq model.Seq) bool {
	return visible(qPos, kPos) && (!seq.Masked() || docVisible(qPos, kPos, seq))
}

// docVisible reports whether some key position kp and query position qp satisfy
// seq.Start(qp) <= kp <= qp.
func docVisible(qPos, kPos []int32, seq model.Seq) bool {
	ks := slices.Clone(kPos)
	slices.Sort(ks)
	for _, qp := range qPos {
		i, _ := slices.BinarySearch(ks, seq.Start(qp)) // first key at or after the document start
		if i < len(ks) && ks[i] <= qp {
			return true
		}
	}
	return false
}

// visible reports whether any key at kPos is visible to any query at qPos under the causal
// mask (some query position ≥ some key position).
func visible(qPos, kPos []int32) bool {
	if len(qPos) == 0 || len(kPos) == 0 {
		return false
	}
	qmax, kmin := qPos[0], kPos[0]
	for _, p := range qPos {
		qmax = max(qmax, p)
	}
	for _, p := range kPos {
		kmin = min(kmin, p)
	}
	return qmax >= kmin
}
