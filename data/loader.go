package data

import (
	"fmt"
	"math"
)

// Batch is B sequences of T tokens each, row-major: Inputs[b*T+t] is token t of sequence b
// and Targets[b*T+t] the token that follows it in the stream.
type Batch struct {
	B, T    int
	Inputs  []int32
	Targets []int32
	// DocStart, set when the loader packs documents (Loader.SetBoundary), is for every token
	// the position within its sequence at which the token's document starts: a document starts
	// at each boundary token, and at position 0 a document goes on from the previous window
	// (DocStarts). Nil otherwise: each sequence is one document.
	DocStart []int32
	// Windows are where the sequences came from: sequence b is window Windows[b] of the
	// stream, its tokens Windows[b]·T .. Windows[b]·T+T (the Loader's numbering). Nil for a
	// batch no Loader made.
	Windows []int
	// Sources, set by a Mixture, is for every sequence the index of the source it came from
	// (Mixture.Names); its window is that source's window. Nil for a Loader's batch.
	Sources []int
}

// DocStarts sets start[t] to the position at which the document of token t of seq starts:
// the last t' ≤ t with seq[t'] == boundary, or 0 when there is none (the document began in
// an earlier window and goes on here). The boundary token is a document's first token, so
// the last token of a document has it as its target and every input predicts a token of
// its own document or the next document's boundary.
func DocStarts(start, seq []int32, boundary int32) {
	s := int32(0)
	for t, id := range seq {
		if id == boundary {
			s = int32(t)
		}
		start[t] = s
	}
}

// LoaderState is a Loader's position: the epoch and the index within that epoch's window
// order of the next window to yield, the seed of the order, and the number of windows per
// epoch (a guard that the state is restored onto the same data; 0 skips the check). It is
// small and JSON-encodable, for checkpoints.
type LoaderState struct {
	Epoch   int64  `json:"epoch"`
	Index   int64  `json:"index"`
	Seed    uint64 `json:"seed"`
	Windows int64  `json:"windows,omitempty"`
}

// Loader yields batches of fixed-length sequences from a token stream.
//
// The stream is packed into windows of T+1 tokens with stride T: window w is
// tokens[w*T : w*T+T+1], its first T tokens the inputs and its last T the targets. Windows
// do not overlap in their targets, and every token but the first is a target exactly once
// per epoch; consecutive windows share one token, the last target of one being the first
// input of the next, so no next-token transition of the stream is lost. The tokens after
// the last whole window (fewer than T) are not used.
//
// Each epoch visits every window exactly once, in a permutation that is a pure function of
// (seed, epoch). A batch is the next B windows of that order; when the windows per epoch are
// not a multiple of B, a batch runs on into the next epoch's order, so no window is dropped
// or repeated. A Loader is not safe for concurrent use.
type Loader struct {
	tokens []int32
	t, b   int
	n      int // windows per epoch
	seed   uint64
	epoch  int64
	index  int   // position in perm of the next window
	perm   []int // window order of epoch
	bound  int32 // document boundary token (SetBoundary); docs reports whether it is set
	docs   bool
}

// SetBoundary makes Next pack documents: every batch carries DocStart, with a document
// starting at each boundary token (data.DocumentBoundary). The windows and their order do
// not change, so the loader's state means the same with or without it.
func (l *Loader) SetBoundary(boundary int32) {
	l.bound, l.docs = boundary, true
}

// NewLoader returns a Loader over tokens (which it keeps and which must not be modified
// afterwards) yielding batches of batchSize sequences of seqLen tokens, ordered by seed. The
// stream must hold at least one batch: batchSize*seqLen+1 tokens.
func NewLoader(tokens []int32, seqLen, batchSize int, seed uint64) (*Loader, error) {
	if seqLen <= 0 {
		return nil, fmt.Errorf("data: seq_len = %d: must be > 0", seqLen)
	}
	if batchSize <= 0 {
		return nil, fmt.Errorf("data: batch_size = %d: must be > 0", batchSize)
	}
	if int64(seqLen) > (math.MaxInt-1)/int64(batchSize) {
		return nil, fmt.Errorf("data: batch_size %d × seq_len %d tokens overflows", batchSize, seqLen)
	}
	if need := batchSize*seqLen + 1; len(tokens) < need {
		return nil, fmt.Errorf("data: %d tokens are too few for one batch: batch_size %d × seq_len %d needs %d tokens (one more than the sequences hold, for the last target)",
			len(tokens), batchSize, seqLen, need)
	}
	l := &Loader{tokens: tokens, t: seqLen, b: batchSize, n: (len(tokens) - 1) / seqLen, seed: seed}
	l.perm = l.order(0)
	return l, nil
}

// order returns the window order of epoch e.
func (l *Loader) order(e int64) []int {
	return newRNG(l.seed, domainWindow, uint64(e)).permutation(l.n)
}

// Windows returns the number of windows (sequences) per epoch.
func (l *Loader) Windows() int { return l.n }

// Next returns the next batch. Its slices are newly allocated, so batches stay valid after
// later calls.
func (l *Loader) Next() Batch {
	T := l.t
	bt := Batch{B: l.b, T: T, Inputs: make([]int32, l.b*T), Targets: make([]int32, l.b*T), Windows: make([]int, l.b)}
	if l.docs {
		bt.DocStart = make([]int32, l.b*T)
	}
	for i := 0; i < l.b; i++ {
		l.fill(&bt, i)
	}
	return bt
}

// fill puts the next window of the order into sequence i of bt (whose slices are allocated)
// and moves on, into the next epoch's order after the last window of one.
func (l *Loader) fill(bt *Batch, i int) {
	T := l.t
	bt.Windows[i] = l.perm[l.index]
	start := bt.Windows[i] * T
	copy(bt.Inputs[i*T:(i+1)*T], l.tokens[start:start+T])
	copy(bt.Targets[i*T:(i+1)*T], l.tokens[start+1:start+T+1])
	if bt.DocStart != nil {
		DocStarts(bt.DocStart[i*T:(i+1)*T], bt.Inputs[i*T:(i+1)*T], l.bound)
	}
	l.index++
	if l.index == l.n {
		l.epoch++
		l.index = 0
		l.perm = l.order(l.epoch)
	}
}

// State returns the loader's position; Restore(State()) on a loader over the same tokens,
// seqLen and seed continues exactly where this one is.
func (l *Loader) State() LoaderState {
	return LoaderState{Epoch: l.epoch, Index: int64(l.index), Seed: l.seed, Windows: int64(l.n)}
}

// Restore moves the loader to s, so that Next yields exactly what the loader s was taken
// from yielded after it. It costs one permutation of the windows, not a replay. The seed
// must be the loader's own, the window count (when set) must match, and the index must lie
// in [0, Windows]; Windows is read as the start of the next epoch.
func (l *Loader) Restore(s LoaderState) error {
	if s.Seed != l.seed {
		return fmt.Errorf("data: restore loader state: seed %d, but this loader's seed is %d", s.Seed, l.seed)
	}
	if s.Windows != 0 && s.Windows != int64(l.n) {
		return fmt.Errorf("data: restore loader state: it was saved with %d windows per epoch, but this loader has %d (different data or seq_len)", s.Windows, l.n)
	}
	if s.Epoch < 0 || s.Index < 0 || s.Index > int64(l.n) {
		return fmt.Errorf("data: restore loader state: epoch %d index %d: want epoch >= 0 and 0 <= index <= %d", s.Epoch, s.Index, l.n)
	}
	if s.Index == int64(l.n) {
		if s.Epoch == math.MaxInt64 {
			return fmt.Errorf("data: restore loader state: epoch %d overflows", s.Epoch)
		}
		s.Epoch, s.Index = s.Epoch+1, 0
	}
	if s.Epoch != l.epoch {
		l.perm = l.order(s.Epoch)
	}
	l.epoch, l.index = s.Epoch, int(s.Index)
	return nil
}

// Split holds the last evalFraction of tokens out for evaluation: eval is the tail of
// floor(len(tokens)*evalFraction) tokens, train the rest. A fraction at or below 0 (or NaN)
// gives no eval tokens, one at or above 1 gives them all. Both share tokens' storage; train's
// capacity ends where eval begins, so appending to train never overwrites eval.
func Split(tokens []int32, evalFraction float64) (train, eval []int32) {
	n := 0
	switch {
	case evalFraction >= 1:
		n = len(tokens)
	case evalFraction > 0:
		n = int(float64(len(tokens)) * evalFraction)
	}
	cut := len(tokens) - n
	return tokens[:cut:cut], tokens[cut:]
}
