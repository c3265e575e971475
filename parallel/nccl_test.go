package parallel

import (
	"fmt"
	"math"
	"testing"

	"distflash/kernels"
	"distflash/model"
	"distflash/parallel/transport"
	"distflash/parallel/transport/transporttest"
)

// TestFSDPUnderNCCL runs FSDP's forward-backward over NCCL: the gradient chunks and the loss
// equal the in-process world's bit for bit (the fake sums in rank order, as the host does).
func TestFSDPUnderNCCL(t *testing.T) {
	cfg := fsdpConfig()
	params := model.InitParams(cfg, model.NewLayout(cfg), 3)
	const T = 8
	for _, P := range []int{2, 3} {
		ids, targets := fsdpBatch(cfg, P, T)
		dscale := float32(1) / float32(P*T)
		for _, prefetch := range []bool{false, true} {
			hostG, hostL := runFSDP(t, transport.NewWorld(P).Run, cfg, params, ids, targets, P, T, dscale, model.CheckpointLayer, prefetch)
			ncclG, ncclL := runFSDP(t, transporttest.NCCLRun(P, transporttest.NCCLVersions[0]), cfg, params, ids, targets, P, T, dscale, model.CheckpointLayer, prefetch)
			if hostL != ncclL {
				t.Errorf("P%d prefetch=%v: loss %v over NCCL, %v in process", P, prefetch, ncclL, hostL)
			}
			for r := range hostG {
				for i := range hostG[r] {
					if math.Float32bits(hostG[r][i]) != math.Float32bits(ncclG[r][i]) {
						t.Fatalf("P%d prefetch=%v rank %d gradient %d: %v over NCCL, %v in process", P, prefetch, r, i, ncclG[r][i], hostG[r][i])
					}
				}
			}
		}
	}
}

// TestSchedulesUnderNCCL runs every schedule (P = 2, 3, 4, 5, 8, with and without overlap,
// causal and with a window and documents) and the hybrids over the NCCL communicator on the
// fake NCCL, whose rules are NCCL's: each gives the single-worker result, with no send paired
// with the wrong receive and no deadlock.
func TestSchedulesUnderNCCL(t *testing.T) {
	type tc struct {
		name string
		P, U int
	}
	var cases []tc
	for _, name := range Names() {
		for _, P := range []int{2, 3, 4, 5, 8} {
			cases = append(cases, tc{name, P, 1})
		}
	}
	for _, name := range hybridOuter {
		cases = append(cases, tc{name, 4, 2})
	}
	h := testHeads["MHA"]
	for _, c := range cases {
		for _, overlap := range []bool{false, true} {
			for _, masked := range []bool{false, true} {
				key := fmt.Sprintf("%s/P%d/U%d/overlap=%v/window+docs=%v", c.name, c.P, c.U, overlap, masked)
				t.Run(key, func(t *testing.T) {
					if CheckHybrid(c.name, h, c.P, c.U) != nil {
						return // refused for these heads (TestSchedulesExact checks the refusal)
					}
					T := 24 * c.P
					in := newInputs(T, h, uint64(c.P*100+h.N))
					if masked { // a window of half a rank's tokens and short documents: fewer steps, skipped pairs
						in.docs, in.window = docTables(T, c.P, uint64(c.P))["short"], 13
					}
					out := in.newRun(c.P)
					err := transporttest.NCCLRun(c.P, transporttest.NCCLVersions[0])(func(cm transport.Comm) error {
						be := kernels.NewCPU()
						s, err := NewAttention(c.name, cm, be, Options{Overlap: overlap, UlyssesDegree: c.U})
						if err != nil {
							return err
						}
						return in.runRank(s, cm, be, &out)
					})
					if err != nil {
						t.Fatalf("under NCCL's rules: %v", err)
					}
					checkExact(t, out, in.reference())
				})
			}
		}
	}
}
