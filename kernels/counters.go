package kernels

import "sync/atomic"

// Counters count the work a Backend has done. Attention FLOPs count the scores actually
// computed: every (query, key) pair of each tile (64 queries × 128 keys on the CPU) that has at
// least one visible pair; tiles the causal mask hides entirely are skipped and not counted. So
// a causal block counts somewhat more than its visible half (1.25× at n = 512, 1.06× at 2048).
// Each rank owns its own Backend, so these are
// per-rank numbers; the schedules' load-balance tests and the plan command read them.
type Counters struct {
	AttnBlocks    atomic.Int64 // AttnForward calls that computed at least one visible score
	AttnFwdFLOPs  atomic.Int64 // 4·hd per computed (query, key, head) score in forward (QKᵀ and PV)
	AttnBwdFLOPs  atomic.Int64 // 10·hd per computed score in backward: QKᵀ recomputed, dV, dP, dQ, dK
	AttnSkipped   atomic.Int64 // AttnForward calls whose block was fully masked and skipped
	MatMulFLOPs   atomic.Int64 // 2·m·n·k per MatMul
	AttnBackwards atomic.Int64 // AttnBackward calls that computed at least one visible score
	// AttnDocSkipped counts the blocks (forward and backward calls) a schedule did not make
	// because the document mask hides every key from every query although the causal mask
	// alone would not (data.document_mask); the schedules count it on their own backend.
	AttnDocSkipped atomic.Int64
}

// Snapshot is a plain copy of Counters for reports.
type Snapshot struct {
	AttnBlocks, AttnSkipped, AttnBackwards  int64
	AttnFwdFLOPs, AttnBwdFLOPs, MatMulFLOPs int64
	AttnDocSkipped                          int64
}

// Snapshot returns the current values.
func (c *Counters) Snapshot() Snapshot {
	return Snapshot{
		AttnBlocks: c.AttnBlocks.Load(), AttnSkipped: c.AttnSkipped.Load(), AttnBackwards: c.AttnBackwards.Load(),
		AttnFwdFLOPs: c.AttnFwdFLOPs.Load(), AttnBwdFLOPs: c.AttnBwdFLOPs.Load(), MatMulFLOPs: c.MatMulFLOPs.Load(),
		AttnDocSkipped: c.AttnDocSkipped.Load(),
	}
}

// Reset sets every counter to zero.
func (c *Counters) Reset() {
	for _, a := range []*atomic.Int64{&c.AttnBlocks, &c.AttnSkipped, &c.AttnBackwards, &c.AttnFwdFLOPs, &c.AttnBwdFLOPs, &c.MatMulFLOPs, &c.AttnDocSkipped} {
		a.Store(0)
	}
}
