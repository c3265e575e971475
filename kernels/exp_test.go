package kernels

import (
	"math"
	"testing"
)

// ulpErr returns |got − want| in units of the float32 spacing at want (for a subnormal or
// zero want, the subnormal spacing 2^-149).
func ulpErr(got float32, want float64) float64 {
	if w32 := float32(want); math.IsInf(float64(w32), 0) || math.IsInf(float64(got), 0) {
		if got == w32 { // results beyond MaxFloat32 must round to +Inf exactly as float32(want)
			return 0
		}
		return math.Inf(1)
	}
	ulp := math.Ldexp(1, -149)
	if a := math.Abs(want); a >= math.SmallestNonzeroFloat32*(1<<23) { // normal: 2^(e−23)
		_, e := math.Frexp(a)
		ulp = math.Ldexp(1, e-1-23)
	}
	return math.Abs(float64(got)-want) / ulp
}

// expInputs returns every stride-th float32 in [-106, 90] plus the edges: -Inf, +Inf, ±0,
// large negatives, the overflow threshold and the subnormal-result range in detail.
func expInputs(stride uint32) []float32 {
	var x []float32
	for b := uint32(0); b <= math.Float32bits(90); b += stride { // [0, 90]
		x = append(x, math.Float32frombits(b))
	}
	for b := uint32(0x80000000); b <= math.Float32bits(-106); b += stride { // [-106, -0]
		x = append(x, math.Float32frombits(b))
	}
	for v := float32(-104); v <= -86; v += 1.0 / 4096 { // subnormal results and their edge
		x = append(x, v)
	}
	inf := float32(math.Inf(1))
	x = append(x, -inf, inf, 0, float32(math.Copysign(0, -1)), -math.MaxFloat32, -1e30, -1e10,
		-200, 88.72283, 88.72284, 88.7229, 100, math.MaxFloat32, -103.97, -103.972, -87.3365,
		math.SmallestNonzeroFloat32, -math.SmallestNonzeroFloat32)
	return x
}

// TestExpAccuracy checks every exponential kernel against math.Exp over the whole float32
// range: at most expMaxULP ulps on normal results, one subnormal step on subnormal ones,
// exact 0 below the subnormal range and for -Inf, exact +Inf above ln(MaxFloat32), NaN for NaN.
func TestExpAccuracy(t *testing.T) {
	x := expInputs(199)
	for _, impl := range expImpls() {
		t.Run(impl.name, func(t *testing.T) {
			got := make([]float32, len(x))
			impl.fn(got, x, 0)
			worst, at := 0.0, float32(0)
			for i, v := range x {
				want := math.Exp(float64(v))
				e := ulpErr(got[i], want)
				if want < math.SmallestNonzeroFloat32*(1<<23) { // subnormal or zero result
					if e > 1 {
						t.Fatalf("exp(%g) = %g, want %g (subnormal result, %.2f steps off)", v, got[i], want, e)
					}
					continue
				}
				if e > worst {
					worst, at = e, v
				}
			}
			t.Logf("%s: max error %.3f ulp at x = %g over %d inputs", impl.name, worst, at, len(x))
			if worst > expMaxULP {
				t.Errorf("%s: max error %.3f ulp at x = %g, want ≤ %g", impl.name, worst, at, expMaxULP)
			}
			special := []float32{float32(math.Inf(-1)), -1e30, -105, -104}
			out := make([]float32, len(special))
			impl.fn(out, special, 0)
			for i, v := range out {
				if v != 0 {
					t.Errorf("exp(%g) = %g, want 0", special[i], v)
				}
			}
			nan := []float32{float32(math.NaN()), 89, float32(math.Inf(1))}
			impl.fn(out[:3], nan, 0)
			if out[0] == out[0] || !math.IsInf(float64(out[1]), 1) || !math.IsInf(float64(out[2]), 1) {
				t.Errorf("exp(NaN, 89, +Inf) = %v, want NaN, +Inf, +Inf", out[:3])
			}
		})
	}
}

// TestExpShiftSum checks the shift and the returned sum at every length up to 70 (vector
// bodies and padded tails), and that the assembly kernels agree bit for bit.
func TestExpShiftSum(t *testing.T) {
	impls := expImpls()
	for n := 0; n <= 70; n++ {
		src := make([]float32, n)
		for i := range src {
			src[i] = float32(i%13)*0.7 - 3
		}
		if n > 5 {
			src[5] = float32(math.Inf(-1)) // a masked score
		}
		var ref []float32
		for _, impl := range impls {
			dst := make([]float32, n+1)
			dst[n] = 42
			s := impl.fn(dst[:n], src, 1.5)
			if dst[n] != 42 {
				t.Fatalf("%s n=%d: wrote past the end", impl.name, n)
			}
			var want float64
			for i, v := range src {
				w := math.Exp(float64(v - 1.5))
				want += w
				if ulpErr(dst[i], w) > expMaxULP {
					t.Fatalf("%s n=%d: exp(%g-1.5) = %g, want %g", impl.name, n, v, dst[i], w)
				}
			}
			if math.Abs(float64(s)-want) > 1e-6*math.Max(want, 1) {
				t.Errorf("%s n=%d: sum %g, want %g", impl.name, n, s, want)
			}
			if impl.name == "go" {
				continue
			}
			if ref == nil {
				ref = dst
			} else {
				for i := range ref {
					if ref[i] != dst[i] {
						t.Fatalf("%s n=%d: element %d = %g, other kernel %g", impl.name, n, i, dst[i], ref[i])
					}
				}
			}
		}
	}
}

// TestRowMax checks rowMax at every length up to 70, with the maximum at each position.
func TestRowMax(t *testing.T) {
	for n := 0; n <= 70; n++ {
		for at := 0; at < max(n, 1); at++ {
			src := make([]float32, n)
			for i := range src {
				src[i] = -float32(i%7) - 1
			}
			want := negInf
			if n > 0 {
				src[at] = 3
				want = 3
			}
			if got := rowMax(src); got != want {
				t.Fatalf("n=%d max at %d: got %g", n, at, got)
			}
		}
	}
}

// TestDsRow checks dsRow against the Go loop bit for bit at every length up to 40.
func TestDsRow(t *testing.T) {
	for n := 0; n <= 40; n++ {
		p, dp := make([]float32, n), make([]float32, n+1)
		for i := range p {
			p[i], dp[i] = float32(i)*0.37-2, float32(i%5)*1.3+0.1
		}
		dp[n] = 42
		want := append([]float32(nil), dp[:n]...)
		dsRowGo(p, want, 0.77)
		dsRow(p, dp[:n], 0.77)
		for i := range want {
			if dp[i] != want[i] {
				t.Fatalf("n=%d: dp[%d] = %g, want %g", n, i, dp[i], want[i])
			}
		}
		if dp[n] != 42 {
			t.Fatalf("n=%d: wrote past the end", n)
		}
	}
}
