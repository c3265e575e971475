package kernels

// Building blocks of the CPU attention: the SGEMM microkernel (gemm.go) applied to tiles that
// the attention packs itself, single-threaded, so that a score tile, its softmax and its
// product with V stay in the cache of the core that owns them and no call pays the
// set-up of sgemm.
//
// A packed operand is a sequence of panels of w lanes (rows of op(A) with w = MR, columns of
// op(B) with w = NR) over kc steps of k: element (lane l, step p) sits at
// dst[(l/w)·w·kc + p·w + l%w]; lanes past the end are zero.

// packLanes packs lanes elements whose (lane l, step p) element is src[l·ld + p] (a lane is a
// contiguous row of src, as the rows of Q in Q·Kᵀ).
func packLanes(dst, src []float32, ld, lanes, kc, w int) {
	for l0 := 0; l0 < lanes; l0 += w {
		d := dst[l0*kc : (l0+w)*kc]
		rows := min(w, lanes-l0)
		s := src[l0*ld:]
		done := 0
		if rows == w {
			done = gemmPackTAsm(d, s, ld, kc, w, w)
		}
		for i := 0; i < w; i++ {
			if i >= rows {
				for p := done; p < kc; p++ {
					d[p*w+i] = 0
				}
				continue
			}
			for p, v := range s[i*ld+done : i*ld+kc] {
				d[(done+p)*w+i] = v
			}
		}
	}
}

// packSteps packs lanes elements whose (lane l, step p) element is src[p·ld + l] (a step is a
// contiguous row of src, as the rows of V in P·V).
func packSteps(dst, src []float32, ld, lanes, kc, w int) {
	for l0 := 0; l0 < lanes; l0 += w {
		d := dst[l0*kc : (l0+w)*kc]
		cols := min(w, lanes-l0)
		s := src[l0:]
		if cols == w && gemmPackRowsAsm(d, s, ld, kc, w) {
			continue
		}
		for p := 0; p < kc; p++ {
			r := d[p*w : p*w+w]
			copy(r, s[p*ld:p*ld+cols])
			clear(r[cols:])
		}
	}
}

// tileMul sets C = alpha·A·B + beta·C for packed A (rows lanes) and B (cols lanes) over kc
// steps, with the microkernel's arithmetic; C is rows×cols with row stride ldc. Whole
// MR×NR tiles go straight to C, the edges through a scratch tile.
func tileMul(impl *gemmImpl, a, b []float32, kc int, c []float32, ldc, rows, cols int, alpha, beta float32) {
	mr, nr := impl.mr, impl.nr
	var tmp [gemmMaxTile]float32
	for j := 0; j < cols; j += nr {
		bp := &b[j*kc]
		nc := min(nr, cols-j)
		for i := 0; i < rows; i += mr {
			ap := &a[i*kc]
			nm := min(mr, rows-i)
			if nm == mr && nc == nr {
				impl.kernel(kc, ap, bp, &c[i*ldc+j], ldc, alpha, beta)
				continue
			}
			impl.kernel(kc, ap, bp, &tmp[0], nr, 1, 0)
			gemmEpilogue(tmp[:], nr, c[i*ldc+j:], ldc, nm, nc, alpha, beta)
		}
	}
}

// roundUp returns n rounded up to a multiple of m.
func roundUp(n, m int) int { return (n + m - 1) / m * m }
