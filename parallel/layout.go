package parallel

import "fmt"

// Layout is how the T tokens of a sequence are split across P sequence-parallel ranks. Every
// rank holds T/P tokens; attention masks come from the tokens' global positions, so the one
// attention primitive serves every layout.
type Layout int

const (
	// Contiguous gives rank r the tokens [r·T/P, (r+1)·T/P) (DistFlashAttn §3.1, ring, Burst,
	// Ulysses).
	Contiguous Layout = iota
	// ZigZag cuts the sequence into 2P chunks and gives rank r chunks r and 2P−1−r, so every
	// rank has the same causal work (Megatron / TransformerEngine context parallelism,
	// ring-flash-attention's zigzag).
	ZigZag
	// Cyclic gives rank r the tokens r, r+P, r+2P, … (Attention2D §3.2, "cyclic 1D distribution").
	Cyclic
)

var layoutNames = []string{"contiguous", "zigzag", "cyclic"}

// String names the layout.
func (l Layout) String() string { return layoutNames[l] }

// Divisor is what T must be a multiple of for the layout on P ranks.
func (l Layout) Divisor(P int) int {
	if l == ZigZag {
		return 2 * P
	}
	return P
}

// Positions returns the global positions of the tokens rank holds, in the order the rank holds
// them, when a sequence of T tokens is split over P ranks.
func (l Layout) Positions(T, P, rank int) ([]int32, error) {
	if P < 1 || rank < 0 || rank >= P {
		return nil, fmt.Errorf("parallel: rank %d of %d", rank, P)
	}
	if d := l.Divisor(P); T <= 0 || T%d != 0 {
		return nil, fmt.Errorf("parallel: a sequence of %d tokens cannot be split %s over %d ranks: data.seq_len must be a positive multiple of %d", T, l, P, d)
	}
	n := T / P
	pos := make([]int32, 0, n)
	switch l {
	case Contiguous:
		for i := 0; i < n; i++ {
			pos = append(pos, int32(rank*n+i))
		}
	case ZigZag:
		c := T / (2 * P)
		for _, chunk := range []int{rank, 2*P - 1 - rank} {
			for i := 0; i < c; i++ {
				pos = append(pos, int32(chunk*c+i))
			}
		}
	case Cyclic:
		for i := 0; i < n; i++ {
			pos = append(pos, int32(rank+i*P))
		}
	}
	return pos, nil
}

// MustPositions is Positions for arguments already validated; it panics on error.
func (l Layout) MustPositions(T, P, rank int) []int32 {
	p, err := l.Positions(T, P, rank)
	if err != nil {
		panic(err)
	}
	return p
}

// Shard picks, from B sequences of T values per token (width values each, [B·T·width]), the
// tokens at positions pos of every sequence: [B·len(pos)·width].
func Shard[E any](x []E, B, T, width int, pos []int32) []E {
	out := make([]E, 0, B*len(pos)*width)
	for b := 0; b < B; b++ {
		for _, p := range pos {
			off := (b*T + int(p)) * width
			out = append(out, x[off:off+width]...)
		}
	}
	return out
}

// Unshard writes a rank's shard (as made by Shard) back into its places in full.
func Unshard[E any](full, shard []E, B, T, width int, pos []int32) {
	n := len(pos)
	for b := 0; b < B; b++ {
		for i, p := range pos {
			copy(full[(b*T+int(p))*width:(b*T+int(p)+1)*width], shard[(b*n+i)*width:(b*n+i+1)*width])
		}
	}
}
