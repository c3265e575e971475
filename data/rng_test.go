package data

import (
	"slices"
	"testing"
)

// TestRNGPinned pins the generator's output: exact resume of a Loader across builds depends
// on these sequences never changing.
func TestRNGPinned(t *testing.T) {
	r := newRNG(1, domainWindow, 0)
	if a, b := r.uint64(), r.uint64(); a != 9871825825257504236 || b != 3162362961109716194 {
		t.Errorf("newRNG(1, window, 0) gave %d %d", a, b)
	}
	tests := []struct {
		seed, domain, index uint64
		want                []int
	}{
		{1337, domainWindow, 3, []int{7, 1, 3, 6, 9, 4, 0, 5, 8, 2}},
		{0, domainFiles, 0, []int{9, 6, 1, 0, 3, 5, 8, 7, 4, 2}},
	}
	for _, tt := range tests {
		if got := newRNG(tt.seed, tt.domain, tt.index).permutation(10); !slices.Equal(got, tt.want) {
			t.Errorf("permutation(seed %d, domain %#x, index %d) = %v, want %v", tt.seed, tt.domain, tt.index, got, tt.want)
		}
	}
}

// TestRNGUniform checks intn's range and that a shuffle puts each element first about
// equally often.
func TestRNGUniform(t *testing.T) {
	for _, n := range []int{1, 2, 3, 7, 1000, 1<<62 + 1} {
		r := newRNG(uint64(n), 0, 0)
		for range 1000 {
			if v := r.intn(n); v < 0 || v >= n {
				t.Fatalf("intn(%d) = %d", n, v)
			}
		}
	}
	const n, trials = 8, 80000
	var first [n]int
	for i := range trials {
		first[newRNG(42, 0, uint64(i)).permutation(n)[0]]++
	}
	for v, c := range first {
		// Expected 10000, standard deviation about 94: 6 sigma.
		if c < trials/n-560 || c > trials/n+560 {
			t.Errorf("element %d came first %d times in %d shuffles, want about %d", v, c, trials, trials/n)
		}
	}
}
