package parallel

import (
	"slices"
	"strings"
	"testing"

	"distflash/parallel/transport"
)

// TestDims: the maps of rank to replica and sequence position, the padded lengths, the
// positions (the layout's), the groups document balancing evens out, and the refusals of a
// world that does not split.
func TestDims(t *testing.T) {
	for _, tc := range []struct {
		world, sp, u int
		attn         string
		dp, div, bal int
		str          string
	}{
		{1, 1, 1, "distflash", 1, 1, 1, "1 rank"},
		{4, 4, 1, "ring", 1, 4, 4, "4 ranks: sequence-parallel (ring)"},
		{8, 4, 1, "zigzag", 2, 8, 4, "8 ranks: 2 replicas × 4 sequence-parallel (zigzag)"},
		{8, 8, 2, "ring", 1, 8, 4, "8 ranks: sequence-parallel (ring between Ulysses groups of 2)"},
		{4, 2, 0, "ulysses", 2, 2, 2, "4 ranks: 2 replicas × 2 sequence-parallel (ulysses)"},
		{6, 1, 1, "ring", 6, 1, 1, "6 ranks"},
	} {
		d, err := NewDims(tc.world, tc.sp, tc.u, tc.attn)
		if err != nil {
			t.Fatalf("%+v: %v", tc, err)
		}
		if d.DP() != tc.dp || d.Divisor() != tc.div || d.BalanceGroups() != tc.bal || d.String() != tc.str {
			t.Errorf("%+v: dp %d divisor %d balance %d %q", tc, d.DP(), d.Divisor(), d.BalanceGroups(), d.String())
		}
		if got := d.Padded(13); got%tc.div != 0 || got < 13 || got >= 13+tc.div {
			t.Errorf("%+v: Padded(13) = %d", tc, got)
		}
		for r := range tc.world {
			if d.Replica(r)*tc.sp+d.SPRank(r) != r {
				t.Errorf("%+v: rank %d is replica %d position %d", tc, r, d.Replica(r), d.SPRank(r))
			}
			T := 4 * tc.div
			got, err := d.Positions(T, r)
			if err != nil {
				t.Fatal(err)
			}
			want, _ := d.Layout().Positions(T, tc.sp, r%tc.sp)
			if !slices.Equal(got, want) {
				t.Errorf("%+v rank %d: positions %v, want the layout's %v", tc, r, got, want)
			}
		}
	}
	for _, tc := range []struct {
		world, sp, u int
		attn, want   string
	}{
		{6, 4, 1, "ring", "does not split into sequence groups of 4"},
		{8, 4, 3, "ring", "do not split into Ulysses groups of 3"},
		{0, 1, 1, "ring", "must be at least 1"},
		{2, 2, 1, "spiral", "spiral"},
	} {
		if _, err := NewDims(tc.world, tc.sp, tc.u, tc.attn); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want an error saying %q", tc, err, tc.want)
		}
	}
}

// TestDimsGroups: the sequence group of a rank holds its replica's ranks in position order,
// and the replica group the ranks of its position in replica order (a world of 2 × 3).
func TestDimsGroups(t *testing.T) {
	d, err := NewDims(6, 3, 1, "ring")
	if err != nil {
		t.Fatal(err)
	}
	err = transport.NewWorld(6).Run(func(c transport.Comm) error {
		r := c.Rank()
		seq, rep := d.SequenceGroup(c), d.ReplicaGroup(c)
		if seq.Size() != 3 || seq.Rank() != d.SPRank(r) || rep.Size() != 2 || rep.Rank() != d.Replica(r) {
			t.Errorf("rank %d: sequence group rank %d of %d, replica group rank %d of %d", r, seq.Rank(), seq.Size(), rep.Rank(), rep.Size())
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
