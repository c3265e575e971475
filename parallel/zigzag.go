package parallel

// Zig-zag ring attention: the ring of DistFlashAttn Alg. 1 (papers/distflashattn.txt §3.1,
// ring.go) on the ZigZag layout, which removes the causal imbalance of Fig. 1(a) (§3.2) by
// placement instead of by helpers. The sequence is cut into 2P chunks of c = N/(2P) tokens and
// rank p holds chunks p and 2P−1−p (Megatron / TransformerEngine context parallelism,
// ring-flash-attention's zigzag_ring_flash_attn).
//
// Every (query chunk, key chunk) pair is one call of the attention primitive on c × c, and a
// pair is called only when some key is visible to some query. With own chunks (a, b) =
// (p, 2P−1−p) and a received block from rank r with chunks (r, 2P−1−r):
//
//   - r = p (step 0): (a, a) and (b, b) are causal diagonal chunks and (b, a) is fully visible
//     — 3 calls, (a, b) is masked;
//   - r < p: key chunk r is fully visible to both query chunks, chunk 2P−1−r to neither —
//     2 calls (a, r), (b, r);
//   - r > p: query chunk b sees both key chunks fully, chunk a sees neither — 2 calls (b, r),
//     (b, 2P−1−r).
//
// So every rank makes 2P+1 forward calls computing c²(2P−1) + c(c+1) visible scores, the same
// work on every rank. Splitting the queries matters: calling the whole local q against the
// whole received block would rely on the kernel's tile skipping (64 queries × 128 keys on the
// CPU), which hides nothing when c is small and is exact only when c is a multiple of the
// tile: at c = 3 it computes P·n² scores per rank against (2P+1)·c², 1.9× the work at P = 8
// (TestZigZagWorkBalanced), 7% more at T = 1152, P = 4 (c = 144), and the same at T = 2048
// (c = 256, tile-aligned), where BenchmarkZigZagSplit times both alike. Per-chunk calls are
// never more work and do not depend on the kernel's tile sizes, so the schedule uses them.
// The communication is that of the ring: k, v of N/P tokens move P−1 times forward and
// backward, dk, dv P times (ring.go).

import (
	"distflash/kernels"
	"distflash/parallel/transport"
)

func init() { register("zigzag", newZigZag, nil) }

// newZigZag builds the zig-zag ring schedule for one rank.
func newZigZag(c transport.Comm, be kernels.Backend, opt Options) Schedule {
	return &ringAttn{c: c, be: be, opt: opt, name: "zigzag", layout: ZigZag, chunks: 2, tag: 300,
		site: ringSites{fwdKV: "zigzag.fwd.kv", bwdKV: "zigzag.bwd.kv", bwdDKV: "zigzag.bwd.dkv"}}
}
