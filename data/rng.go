package data

import "math/bits"

// Domains keep the random streams of different uses apart, so the file order and the window
// order drawn from one seed are unrelated.
const (
	domainFiles  uint64 = 0x66696c6573 // "files"
	domainWindow uint64 = 0x77696e646f // "windo"
	domainMix    uint64 = 0x6d6978     // "mix": which source a mixture's sequence comes from
)

// rng is SplitMix64 (Steele, Lea & Flood 2014): tiny, fast, fully specified, and good enough
// to shuffle. It is defined here, rather than taken from math/rand/v2, so that the sequence a
// seed gives (and with it exact resume of a Loader) never depends on the Go release.
type rng struct{ s uint64 }

// mix64 is the SplitMix64 output function, a bijective 64-bit hash.
func mix64(z uint64) uint64 {
	z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
	z = (z ^ z>>27) * 0x94d049bb133111eb
	return z ^ z>>31
}

// newRNG returns the generator for (seed, domain, index): a pure function of the three.
func newRNG(seed, domain, index uint64) *rng {
	s := mix64(seed + 0x9e3779b97f4a7c15)
	s = mix64(s ^ domain)
	s = mix64(s ^ index)
	return &rng{s: s}
}

func (r *rng) uint64() uint64 {
	r.s += 0x9e3779b97f4a7c15
	return mix64(r.s)
}

// float64 returns a uniform value in [0, 1) with 53 random bits.
func (r *rng) float64() float64 {
	return float64(r.uint64()>>11) / (1 << 53)
}

// intn returns a uniform value in [0, n), n > 0, by Lemire's multiply-and-reject method.
func (r *rng) intn(n int) int {
	un := uint64(n)
	hi, lo := bits.Mul64(r.uint64(), un)
	if lo < un {
		thresh := -un % un
		for lo < thresh {
			hi, lo = bits.Mul64(r.uint64(), un)
		}
	}
	return int(hi)
}

// shuffle permutes n elements by Fisher–Yates, calling swap(i, j) for each exchange.
func (r *rng) shuffle(n int, swap func(i, j int)) {
	for i := n - 1; i > 0; i-- {
		swap(i, r.intn(i+1))
	}
}

// permutation returns a uniformly random permutation of [0, n).
func (r *rng) permutation(n int) []int {
	p := make([]int, n)
	for i := range p {
		p[i] = i
	}
	r.shuffle(n, func(i, j int) { p[i], p[j] = p[j], p[i] })
	return p
}
