package parallel

import (
	"fmt"

	"distflash/parallel/transport"
)

// Dims are the parallel dimensions of a world, as torchtitan's ParallelDims: World ranks
// form DP data-parallel replicas of SP sequence-parallel ranks each, rank = replica·SP +
// position in the replica's sequence group; inside a sequence group the hybrid splits the
// ranks into Ulysses groups of U consecutive ranks (parallel/hybrid.go), joined by the
// schedule Attention. Every command that builds ranks (train, eval, generate) and plan read
// the dimensions from here, never from the config's numbers one by one.
type Dims struct {
	World     int    // ranks in all (parallelism.world_size)
	SP        int    // ranks sharing one sequence (parallelism.sequence_parallel_degree)
	Ulysses   int    // ranks of a Ulysses group inside a sequence group; 1: none (parallelism.ulysses_degree)
	Attention string // the schedule over a sequence group (parallelism.attention)
}

// NewDims checks and returns the dimensions of a world of world ranks, sp of them sharing each
// sequence, in Ulysses groups of u (0 or 1: none), under the schedule attention.
func NewDims(world, sp, u int, attention string) (Dims, error) {
	u = max(u, 1)
	d := Dims{World: world, SP: sp, Ulysses: u, Attention: attention}
	switch {
	case world < 1 || sp < 1:
		return Dims{}, fmt.Errorf("parallel: a world of %d ranks with %d sharing each sequence: both must be at least 1", world, sp)
	case world%sp != 0:
		return Dims{}, fmt.Errorf("parallel: a world of %d ranks does not split into sequence groups of %d", world, sp)
	case sp%u != 0:
		return Dims{}, fmt.Errorf("parallel: %d sequence-parallel ranks do not split into Ulysses groups of %d", sp, u)
	}
	if _, err := LayoutOf(attention); err != nil {
		return Dims{}, err
	}
	return d, nil
}

// DP is the number of data-parallel replicas: World / SP.
func (d Dims) DP() int { return d.World / d.SP }

// Replica is the data-parallel replica of rank: which sequences of a batch it works on.
func (d Dims) Replica(rank int) int { return rank / d.SP }

// SPRank is rank's position in its sequence group.
func (d Dims) SPRank(rank int) int { return rank % d.SP }

// Layout is how a sequence's tokens are spread over a sequence group: the schedule's layout,
// or all of them on the one rank when SP is 1.
func (d Dims) Layout() Layout {
	if d.SP == 1 {
		return Contiguous
	}
	l, err := LayoutOf(d.Attention)
	if err != nil {
		panic(err) // NewDims checked the schedule
	}
	return l
}

// Divisor is what a sequence's length must be a multiple of to split over the sequence group.
func (d Dims) Divisor() int { return d.Layout().Divisor(d.SP) }

// Padded is the length n rounded up to a multiple of Divisor, as a sequence of n tokens is
// padded to be split over the sequence group.
func (d Dims) Padded(n int) int {
	k := d.Divisor()
	return (n + k - 1) / k * k
}

// Positions returns the global positions rank holds of a sequence of T tokens (T a multiple of
// Divisor), in the order the rank holds them.
func (d Dims) Positions(T, rank int) ([]int32, error) {
	return d.Layout().Positions(T, d.SP, d.SPRank(rank))
}

// BalanceGroups is how many parts document balancing evens the attention work over: the
// sequence group's ranks, or under the hybrid its Ulysses groups (inside one the all-to-all
// splits the work by head).
func (d Dims) BalanceGroups() int {
	if d.Ulysses > 1 && d.Attention != "ulysses" {
		return d.SP / d.Ulysses
	}
	return d.SP
}

// SequenceGroup splits off the sequence group of c's rank (c a communicator of the whole
// world, whose rank numbers are this world's): ranks of one replica, ranked by position. With
// one replica it is c itself. It is collective: every rank of c calls it.
func (d Dims) SequenceGroup(c transport.Comm) transport.Comm {
	if d.DP() == 1 {
		return c
	}
	return c.Split(d.Replica(c.Rank()), d.SPRank(c.Rank()), "sp.split")
}

// ReplicaGroup splits off the ranks that hold the same position of every replica's sequences
// (one per replica, ranked by replica): the group across which data-parallel results are
// gathered. With one replica it is a group of one. It is collective: every rank of c calls it.
func (d Dims) ReplicaGroup(c transport.Comm) transport.Comm {
	return c.Split(d.SPRank(c.Rank()), d.Replica(c.Rank()), "dp.split")
}

// String describes the dimensions: "4 ranks: 2 replicas × 2 sequence-parallel (ring)".
func (d Dims) String() string {
	s := fmt.Sprintf("%d ranks", d.World)
	if d.World == 1 {
		s = "1 rank"
	}
	switch {
	case d.SP == 1:
		return s
	case d.DP() > 1:
		s += fmt.Sprintf(": %d replicas × %d sequence-parallel", d.DP(), d.SP)
	default:
		s += ": sequence-parallel"
	}
	if d.Ulysses > 1 && d.Attention != "ulysses" {
		return s + fmt.Sprintf(" (%s between Ulysses groups of %d)", d.Attention, d.Ulysses)
	}
	return s + fmt.Sprintf(" (%s)", d.Attention)
}
