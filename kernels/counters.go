package kernels

import "sync/atomic"

// Counters count the work a Backend has done. Each rank owns its own Backend, so these are
// per-rank numbers; the schedules' load-balance tests and the plan command read them.
type Counters struct {
	AttnBlocks    atomic.Int64 // AttnForward calls that computed at least one visible score
	AttnFwdFLOPs  atomic.Int64 // 4·hd per visible (query, key, head) in forward (QK^T and PV)
	AttnBwdFLOPs  atomic.Int64 // 10·hd per visible (query, key, head) in backward: QK^T recomputed, dV, dP, dQ, dK
	AttnSkipped   atomic.Int64 // AttnForward calls whose block was fully masked and skipped
	MatMulFLOPs   atomic.Int64 // 2·m·n·k per MatMul
	AttnBackwards atomic.Int64 // AttnBackward calls that computed at least one visible score
}

// Snapshot is a plain copy of Counters for reports.
type Snapshot struct {
	AttnBlocks, AttnSkipped, AttnBackwards  int64
	AttnFwdFLOPs, AttnBwdFLOPs, MatMulFLOPs int64
}

// Snapshot returns the current values.
func (c *Counters) Snapshot() Snapshot {
	return Snapshot{
		AttnBlocks: c.AttnBlocks.Load(), AttnSkipped: c.AttnSkipped.Load(), AttnBackwards: c.AttnBackwards.Load(),
		AttnFwdFLOPs: c.AttnFwdFLOPs.Load(), AttnBwdFLOPs: c.AttnBwdFLOPs.Load(), MatMulFLOPs: c.MatMulFLOPs.Load(),
	}
}

// Reset sets every counter to zero.
func (c *Counters) Reset() {
	for _, a := range []*atomic.Int64{&c.AttnBlocks, &c.AttnSkipped, &c.AttnBackwards, &c.AttnFwdFLOPs, &c.AttnBwdFLOPs, &c.MatMulFLOPs} {
		a.Store(0)
	}
}
