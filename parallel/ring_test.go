package parallel

import (
	"fmt"
	"testing"

	"distflash/kernels"
	"distflash/model"
	"distflash/parallel/transport"
	"distflash/parallel/transport/transporttest"
)

// ringBytes is what every rank sends in one forward and one backward of the ring schedules
// (ring, zigzag), per call site. With n = T/P tokens per rank and B = n·KV·hd·4 bytes (one of
// k, v, dk, dv of a rank, fp32):
//
//	fwd.kv   2·(P−1)·B   k, v of one rank at each of the P−1 ring steps (vanilla: masked ones too)
//	bwd.kv   2·(P−1)·B   the same in the backward
//	bwd.dkv  2·P·B       a block's dk, dv accumulator at each of the P−1 steps, plus the last hop
//	                     home after step P−1 (0 when P = 1: nothing leaves the rank)
func ringBytes(name string, T, P int, h model.Heads) transport.Traffic {
	B := int64(T / P * h.KV * h.Dim * 4)
	tr := transport.Traffic{name + ".fwd.kv": 2 * int64(P-1) * B, name + ".bwd.kv": 2 * int64(P-1) * B}
	if P > 1 {
		tr[name+".bwd.dkv"] = 2 * int64(P) * B
	}
	return tr
}

// TestRingTraffic: the bytes every rank of ring and zigzag sends in a forward and a backward
// equal ringBytes exactly, for every P, head geometry and overlap setting.
func TestRingTraffic(t *testing.T) {
	const T = 48
	for _, name := range []string{"ring", "zigzag"} {
		for _, P := range []int{1, 2, 3, 4, 8} {
			for _, hn := range []string{"MHA", "GQA", "33H"} {
				for _, overlap := range []bool{false, true} {
					t.Run(fmt.Sprintf("%s/P%d/%s/overlap=%v", name, P, hn, overlap), func(t *testing.T) {
						h := testHeads[hn]
						got, err := newInputs(T, h, 7).run(name, P, Options{Overlap: overlap})
						if err != nil {
							t.Fatal(err)
						}
						want := ringBytes(name, T, P, h)
						for r, tr := range got.traffic {
							if err := transporttest.CheckTraffic(tr, want); err != nil {
								t.Errorf("rank %d: %v", r, err)
							}
						}
						if P == 4 && !overlap {
							tr := got.traffic[0]
							t.Logf("%s P=%d T=%d %s (H=%d KV=%d hd=%d): per rank per layer forward %d B, backward %d B (kv %d + dkv %d)",
								name, P, T, hn, h.N, h.KV, h.Dim, tr.Sum(name+".fwd."), tr.Sum(name+".bwd."),
								tr[name+".bwd.kv"], tr[name+".bwd.dkv"])
						}
					})
				}
			}
		}
	}
}

// ringIdle is the idle fraction 1 − Σ_r work_r / (P · max_r work_r) as a fraction num/den.
func ringIdle(work []int64) (num, den int64) {
	var sum, mx int64
	for _, w := range work {
		sum += w
		mx = max(mx, w)
	}
	P := int64(len(work))
	return P*mx - sum, P * mx
}

// TestRingWorkImbalance: in the vanilla ring, rank r computes r+1 blocks in forward and in
// backward (its own and those of the ranks before it; the later ones are masked and never
// called), so the idle fraction 1 − Σ work / (P · max work) is exactly the paper's
// (P²−P)/(2P²) (DistFlashAttn §3.2, Fig. 1(a)).
func TestRingWorkImbalance(t *testing.T) {
	h := testHeads["MHA"]
	t.Logf("%2s %-28s %9s %9s", "P", "forward blocks per rank", "idle", "(P²−P)/2P²")
	for P := 2; P <= 8; P++ {
		got, err := newInputs(6*P, h, uint64(P)).run("ring", P, Options{Overlap: true})
		if err != nil {
			t.Fatal(err)
		}
		var work []int64
		for r, w := range got.work {
			if w.AttnBlocks != int64(r+1) || w.AttnBackwards != int64(r+1) || w.AttnSkipped != 0 {
				t.Errorf("P=%d rank %d: %d forward, %d backward blocks, %d masked calls; want %d, %d, 0",
					P, r, w.AttnBlocks, w.AttnBackwards, w.AttnSkipped, r+1, r+1)
			}
			work = append(work, w.AttnBlocks)
		}
		num, den := ringIdle(work)
		// num/den = (P²−P)/(2P²), compared as integers
		if num*2*int64(P*P) != int64(P*P-P)*den {
			t.Errorf("P=%d: idle fraction %d/%d, want (P²−P)/(2P²) = %d/%d", P, num, den, P*P-P, 2*P*P)
		}
		t.Logf("%2d %-28s %9.4f %9.4f", P, fmt.Sprint(work), float64(num)/float64(den), float64(P*P-P)/float64(2*P*P))
	}
}

// TestZigZagWorkBalanced: with the zig-zag layout every rank makes the same 2P+1 forward and
// backward primitive calls (3 on its own block, 2 per received one) with the same FLOPs, so
// the idle fraction is 0. It also measures the alternative of calling the primitive on the
// whole local q against the whole received block and relying on the kernel's tile skipping
// (the same schedule with one chunk per rank): exact as well, but at small chunks (c = 3
// here, below the 64 × 128 tile) nothing is skipped and it computes P·n² scores per rank
// instead of (2P+1)·c² = (2P+1)·n²/4, ≈ 2× the work.
func TestZigZagWorkBalanced(t *testing.T) {
	h := testHeads["GQA"]
	t.Logf("%2s %9s %14s %16s %6s", "P", "calls", "split FLOPs", "whole-q FLOPs", "ratio")
	for P := 1; P <= 8; P++ {
		T := 6 * P // c = 3 tokens per chunk
		in := newInputs(T, h, uint64(P))
		got, err := in.run("zigzag", P, Options{})
		if err != nil {
			t.Fatal(err)
		}
		c := int64(T / (2 * P))
		wantFLOPs := 4 * int64(h.Dim*h.N) * int64(2*P+1) * c * c // one c×c tile per call
		var work []int64
		for r, w := range got.work {
			if w.AttnBlocks != int64(2*P+1) || w.AttnBackwards != int64(2*P+1) || w.AttnSkipped != 0 || w.AttnFwdFLOPs != wantFLOPs {
				t.Errorf("P=%d rank %d: %d forward, %d backward calls, %d masked, %d FLOPs; want %d, %d, 0, %d",
					P, r, w.AttnBlocks, w.AttnBackwards, w.AttnSkipped, w.AttnFwdFLOPs, 2*P+1, 2*P+1, wantFLOPs)
			}
			work = append(work, w.AttnFwdFLOPs)
		}
		if num, _ := ringIdle(work); num != 0 {
			t.Errorf("P=%d: unequal forward work %v", P, work)
		}

		whole, err := ringRunWith(in, P, func(cm transport.Comm, be kernels.Backend, opt Options) Schedule {
			s := newZigZag(cm, be, opt).(*ringAttn)
			s.chunks = 1
			return s
		})
		if err != nil {
			t.Fatal(err)
		}
		want := in.reference()
		if e := relErr(whole.o, want.o); e > 2e-6 {
			t.Errorf("P=%d: whole-q variant o rel err %.3g", P, e)
		}
		n := int64(T / P)
		for r, w := range whole.work {
			if want := 4 * int64(h.Dim*h.N) * int64(P) * n * n; w.AttnFwdFLOPs != want {
				t.Errorf("P=%d rank %d: whole-q variant %d FLOPs, want %d", P, r, w.AttnFwdFLOPs, want)
			}
		}
		t.Logf("%2d %9d %14d %16d %6.2f", P, got.work[0].AttnBlocks, got.work[0].AttnFwdFLOPs, whole.work[0].AttnFwdFLOPs,
			float64(whole.work[0].AttnFwdFLOPs)/float64(got.work[0].AttnFwdFLOPs))
	}
}

// TestRingRepeatedCalls: a schedule instance serves several layers (and shapes) in a row, as
// in the model; every call gives the single-worker result.
func TestRingRepeatedCalls(t *testing.T) {
	for _, name := range []string{"ring", "zigzag"} {
		for _, overlap := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/overlap=%v", name, overlap), func(t *testing.T) {
				const P = 3
				ins := []attnInputs{newInputs(24, testHeads["MHA"], 1), newInputs(24, testHeads["MHA"], 2), newInputs(36, testHeads["GQA"], 3)}
				var wants []scheduleRun
				for _, in := range ins {
					wants = append(wants, in.reference())
				}
				mk := func(c transport.Comm, be kernels.Backend, opt Options) Schedule {
					s, err := NewAttention(name, c, be, opt)
					if err != nil {
						panic(err)
					}
					return s
				}
				gots, err := ringRunMany(ins, P, mk, Options{Overlap: overlap})
				if err != nil {
					t.Fatal(err)
				}
				for i := range ins {
					if e := relErr(gots[i].o, wants[i].o); e > 2e-6 {
						t.Errorf("call %d: o rel err %.3g", i, e)
					}
					if e := relErr(gots[i].dk, wants[i].dk); e > 1e-5 {
						t.Errorf("call %d: dk rel err %.3g", i, e)
					}
				}
			})
		}
	}
}

// ringRunWith is attnInputs.run for a schedule built by mk (a variant that is not registered).
func ringRunWith(in attnInputs, P int, mk constructor) (scheduleRun, error) {
	out, err := ringRunMany([]attnInputs{in}, P, mk, Options{})
	if err != nil {
		return scheduleRun{}, err
	}
	return out[0], nil
}

// ringRunMany runs forward and backward of each input in turn on the same schedule instances
// of P in-process ranks, and gathers the results as attnInputs.run does (each result's work
// counts that input alone; its traffic is cumulative).
func ringRunMany(ins []attnInputs, P int, mk constructor, opt Options) ([]scheduleRun, error) {
	out := make([]scheduleRun, len(ins))
	for i, in := range ins {
		out[i] = in.newRun(P)
	}
	err := transport.NewWorld(P).Run(func(c transport.Comm) error {
		be := kernels.NewCPU()
		s := mk(c, be, opt)
		for i, in := range ins {
			be.Counters().Reset()
			if err := in.runRank(s, c, be, &out[i]); err != nil {
				return err
			}
		}
		return nil
	})
	return out, err
}

// BenchmarkZigZagSplit times forward + backward of zigzag with per-chunk primitive calls
// (the schedule) against whole-q calls that rely on the kernel's tile skipping, on 4 ranks.
// With T = 2048 a chunk is 256 tokens, a multiple of the CPU tile, so tile skipping hides the
// masked halves too; T = 1152 gives chunks of 144, which straddle tiles.
func BenchmarkZigZagSplit(b *testing.B) {
	const P = 4
	h := model.Heads{N: 4, KV: 2, Dim: 32}
	for _, T := range []int{1152, 2048} {
		in := newInputs(T, h, 1)
		for _, v := range []struct {
			name   string
			chunks int
		}{{"split", 2}, {"whole-q", 1}} {
			b.Run(fmt.Sprintf("T%d/%s", T, v.name), func(b *testing.B) {
				mk := func(c transport.Comm, be kernels.Backend, opt Options) Schedule {
					s := newZigZag(c, be, opt).(*ringAttn)
					s.chunks = v.chunks
					return s
				}
				var flops int64
				for i := 0; i < b.N; i++ {
					r, err := ringRunWith(in, P, mk)
					if err != nil {
						b.Fatal(err)
					}
					flops = r.work[0].AttnFwdFLOPs
				}
				b.ReportMetric(float64(flops), "fwdFLOPs/rank0")
			})
		}
	}
}
