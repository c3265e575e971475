package data

import (
	"fmt"
	"hash/fnv"
	"math"
	"slices"
)

// A Mixture yields batches whose sequences come from several sources, each sequence from one
// source drawn by weight: the blended datasets of Megatron-LM, the data mixtures of torchtitan
// and OLMo, here with this package's seeded generator so that the sequence of draws is a pure
// function of the seed.
//
// Sequence n of the run (counting from 0 over all batches) comes from the source i whose
// cumulative share of the normalized weights first exceeds a uniform draw u_n in [0, 1), u_n
// the first value of the generator for (seed, "mix", n). Each source is its own Loader of
// windows (a permutation per epoch, seeded by the run's seed and the source's name), and a
// drawn source gives its next window; a source whose windows are spent starts its next
// epoch, so a small source with a large weight is repeated, and Epochs counts how often. A
// draw depends on n alone, not on what was drawn before, so the position is the count of
// sequences drawn and each source's Loader position (MixtureState): restoring it continues
// exactly, without replaying the draws.
//
// A mixture of one source is that source's Loader: the same batches in the same order, for
// any weight.
type Mixture struct {
	names   []string
	cum     []float64 // cumulative normalized weights; the last is exactly 1
	loaders []*Loader
	drawn   []int64 // sequences drawn from each source
	next    int64   // sequences drawn in all: the index of the next draw
	seed    uint64
	t, b    int
}

// MixSource is one source of a Mixture: its name (unique, for logs, metrics and the saved
// position), its weight (> 0; weights are relative, they need not sum to 1) and its token
// stream (LoadTokens), which the Mixture keeps and which must not be modified afterwards.
type MixSource struct {
	Name   string
	Weight float64
	Tokens []int32
}

// MixtureState is a Mixture's position, small and JSON-encodable for checkpoints: the
// sequences drawn in all, and each source's draws and Loader position.
type MixtureState struct {
	Drawn   int64         `json:"drawn"`
	Sources []SourceState `json:"sources"`
}

// SourceState is one source's part of a MixtureState.
type SourceState struct {
	Name   string      `json:"name"`
	Drawn  int64       `json:"drawn"` // sequences drawn from the source
	Loader LoaderState `json:"loader"`
}

// NewMixture returns a Mixture of sources yielding batches of batchSize sequences of seqLen
// tokens, its draws and window orders from seed. A single source is read as NewLoader reads
// its stream (it must hold one batch, and its window order is seed's); in a mixture each
// source must hold one window (seqLen+1 tokens) and its window order comes from seed and its
// name, so that adding a source leaves the others' orders as they were.
func NewMixture(sources []MixSource, seqLen, batchSize int, seed uint64) (*Mixture, error) {
	if len(sources) == 0 {
		return nil, fmt.Errorf("data: a mixture needs at least one source")
	}
	m := &Mixture{seed: seed, t: seqLen, b: batchSize, drawn: make([]int64, len(sources))}
	total := 0.0
	for i, s := range sources {
		if slices.Contains(m.names, s.Name) {
			return nil, fmt.Errorf("data: sources %d and %d are both named %q: each source needs its own name", slices.Index(m.names, s.Name)+1, i+1, s.Name)
		}
		if !(s.Weight > 0) || math.IsInf(s.Weight, 0) {
			return nil, fmt.Errorf("data: source %q: weight %v: must be a finite number > 0", s.Name, s.Weight)
		}
		m.names = append(m.names, s.Name)
		total += s.Weight
	}
	acc := 0.0
	for _, s := range sources {
		acc += s.Weight
		m.cum = append(m.cum, acc/total)
	}
	m.cum[len(m.cum)-1] = 1
	if len(sources) == 1 {
		l, err := NewLoader(sources[0].Tokens, seqLen, batchSize, seed)
		if err != nil {
			return nil, err
		}
		m.loaders = []*Loader{l}
		return m, nil
	}
	if batchSize <= 0 {
		return nil, fmt.Errorf("data: batch_size = %d: must be > 0", batchSize)
	}
	for _, s := range sources {
		if len(s.Tokens) < seqLen+1 {
			return nil, fmt.Errorf("data: source %q: %d tokens are too few for one sequence of seq_len %d (it needs %d, one more for the last target)",
				s.Name, len(s.Tokens), seqLen, seqLen+1)
		}
		l, err := NewLoader(s.Tokens, seqLen, 1, SourceSeed(seed, s.Name))
		if err != nil {
			return nil, fmt.Errorf("data: source %q: %w", s.Name, err)
		}
		m.loaders = append(m.loaders, l)
	}
	return m, nil
}

// SourceSeed is the seed of the window order of the source named name in a mixture of
// several sources drawn with seed.
func SourceSeed(seed uint64, name string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(name))
	return newRNG(seed, domainMix, h.Sum64()).uint64()
}

// SetBoundary makes Next pack documents, as Loader.SetBoundary does, in every source.
func (m *Mixture) SetBoundary(boundary int32) {
	for _, l := range m.loaders {
		l.SetBoundary(boundary)
	}
}

// Names returns the sources' names, in the order of Batch.Sources' indices.
func (m *Mixture) Names() []string { return m.names }

// Weights returns the sources' weights, normalized to sum to 1.
func (m *Mixture) Weights() []float64 {
	w := make([]float64, len(m.cum))
	prev := 0.0
	for i, c := range m.cum {
		w[i], prev = c-prev, c
	}
	return w
}

// Windows returns each source's windows (sequences) per epoch.
func (m *Mixture) Windows() []int {
	out := make([]int, len(m.loaders))
	for i, l := range m.loaders {
		out[i] = l.Windows()
	}
	return out
}

// Drawn returns how many sequences have come from each source.
func (m *Mixture) Drawn() []int64 { return slices.Clone(m.drawn) }

// Epochs returns how many times each source's windows have all been drawn: its completed
// epochs (a source is repeated from its next epoch on).
func (m *Mixture) Epochs() []int64 {
	out := make([]int64, len(m.loaders))
	for i, l := range m.loaders {
		out[i] = l.epoch
	}
	return out
}

// draw returns the source of sequence n.
func (m *Mixture) draw(n int64) int {
	if len(m.cum) == 1 {
		return 0
	}
	u := newRNG(m.seed, domainMix, uint64(n)).float64()
	i, _ := slices.BinarySearchFunc(m.cum, u, func(c, u float64) int {
		if c <= u {
			return -1
		}
		return 1
	})
	return min(i, len(m.cum)-1)
}

// Next returns the next batch: batchSize sequences, each the next window of the source drawn
// for it, with Sources saying which. Its slices are newly allocated.
func (m *Mixture) Next() Batch {
	T, B := m.t, m.b
	bt := Batch{B: B, T: T, Inputs: make([]int32, B*T), Targets: make([]int32, B*T), Windows: make([]int, B), Sources: make([]int, B)}
	if m.loaders[0].docs {
		bt.DocStart = make([]int32, B*T)
	}
	for i := range B {
		s := m.draw(m.next)
		m.next++
		m.drawn[s]++
		bt.Sources[i] = s
		m.loaders[s].fill(&bt, i)
	}
	return bt
}

// State returns the mixture's position; Restore(State()) on a mixture of the same sources,
// seqLen and seed continues exactly where this one is.
func (m *Mixture) State() MixtureState {
	st := MixtureState{Drawn: m.next}
	for i, l := range m.loaders {
		st.Sources = append(st.Sources, SourceState{Name: m.names[i], Drawn: m.drawn[i], Loader: l.State()})
	}
	return st
}

// Restore moves the mixture to s, so that Next yields exactly what the mixture s was taken
// from yielded after it. The sources must be the same, by name and in order, each source's
// Loader state must restore (Loader.Restore: its seed and windows), and the draws must add up.
func (m *Mixture) Restore(s MixtureState) error {
	var names []string
	for _, src := range s.Sources {
		names = append(names, src.Name)
	}
	if !slices.Equal(names, m.names) {
		return fmt.Errorf("data: restore mixture state: it was saved with the sources %q, but this mixture has %q", names, m.names)
	}
	var sum int64
	for _, src := range s.Sources {
		if src.Drawn < 0 {
			return fmt.Errorf("data: restore mixture state: source %q: %d sequences drawn", src.Name, src.Drawn)
		}
		sum += src.Drawn
	}
	if sum != s.Drawn {
		return fmt.Errorf("data: restore mixture state: %d sequences drawn in all, but the sources' draws add up to %d", s.Drawn, sum)
	}
	for i, src := range s.Sources {
		if err := m.loaders[i].Restore(src.Loader); err != nil {
			if len(m.loaders) > 1 {
				return fmt.Errorf("source %q: %w", src.Name, err)
			}
			return err
		}
		m.drawn[i] = src.Drawn
	}
	m.next = s.Drawn
	return nil
}

// RestoreLoader moves a mixture of one source to the Loader state s (a checkpoint of a run
// with one source keeps its position so, as it always has).
func (m *Mixture) RestoreLoader(s LoaderState) error {
	if len(m.loaders) != 1 {
		return fmt.Errorf("data: restore loader state: the checkpoint's data position is of one source, and this run mixes %d sources", len(m.loaders))
	}
	if err := m.loaders[0].Restore(s); err != nil {
		return err
	}
	l := m.loaders[0]
	m.next = l.epoch*int64(l.n) + int64(l.index)
	m.drawn[0] = m.next
	return nil
}
