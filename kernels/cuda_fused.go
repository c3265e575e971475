//go:build cuda

package kernels

import (
	"math"
	"unsafe"
)

// The fused kernels of the CUDA backend (issue 36): one pass where the unfused calls made two,
// each computing every value as the unfused kernels do (elementwise.cu).

// AddRMSNorm implements Backend: df_add_rmsnorm, a block per row.
func (c *CUDA) AddRMSNorm(sum, out, rstd, a, b, w Buf, rows, dim int, eps float32) {
	sp, op := dptr("add+rmsnorm sum", sum, rows*dim), dptr("add+rmsnorm out", out, rows*dim)
	ap, bp := dptr("add+rmsnorm a", a, rows*dim), dptr("add+rmsnorm b", b, rows*dim)
	rp, wp := dptr("add+rmsnorm rstd", rstd, rows), dptr("add+rmsnorm w", w, dim)
	if rows == 0 {
		return
	}
	c.launch("df_add_rmsnorm", rowGrid(rows), 1, ewThreads, 0, sp, op, rp, ap, bp, wp, int32(rows), int32(dim), eps)
}

// SwiGLUBackwardAct implements Backend: df_swiglu_bwd_act, elementwise.
func (c *CUDA) SwiGLUBackwardAct(act, dgate, dup, dout, gate, up Buf) {
	n := dbuf(dout).n
	a, dg, du := dptr("swiglu act", act, n), dptr("swiglu dgate", dgate, n), dptr("swiglu dup", dup, n)
	g, u := dptr("swiglu gate", gate, n), dptr("swiglu up", up, n)
	c.launch("df_swiglu_bwd_act", ewGrid(n), 1, ewThreads, 0, a, dg, du, dbuf(dout), g, u, int64(n))
}

// AdamWSegments implements Backend: df_adamw_multi, one launch for every segment, whose table
// (offset, length, decay as int64 triples, adamwSegTable) is uploaded first; the grid is the
// elementwise grid of the longest segment.
func (c *CUDA) AdamWSegments(pb, gb, mb, vb Buf, segs []AdamWSegment, hp AdamWStep) {
	c.adamwSegments("df_adamw_multi", pb, gb, mb, vb, segs, hp, nil, nil)
}

// adamwSegments queues kernel, an AdamW over the segments of p, g, m and v in one launch
// (df_adamw_multi, df_adamw_multi16): its arguments are p, g, m, v, then mid, the segment
// table (uploaded first) and its length, the hyper-parameters, then tail.
func (c *CUDA) adamwSegments(kernel string, pb, gb, mb, vb Buf, segs []AdamWSegment, hp AdamWStep, mid, tail []any) {
	p := dbuf(pb)
	g, m, v := dptr("adamw g", gb, p.n), dptr("adamw m", mb, p.n), dptr("adamw v", vb, p.n)
	checkSegments(segs, p.n)
	table, longest := adamwSegTable(segs)
	if longest == 0 {
		return
	}
	c1 := float32(1 - math.Pow(hp.Beta1, float64(hp.Step)))
	c2 := float32(1 - math.Pow(hp.Beta2, float64(hp.Step)))
	c.mu.Lock()
	defer c.mu.Unlock()
	tp := c.grow(&c.segs, 8*len(table))
	c.htod(tp, unsafe.Pointer(&table[0]), 8*len(table))
	args := append([]any{p, g, m, v}, mid...)
	args = append(args, tp, int32(len(segs)), float32(hp.Beta1), float32(hp.Beta2), c1, c2, float32(hp.LR),
		float32(hp.Eps), hp.GradScale, float32(hp.WeightDecay))
	c.launch(kernel, ewGrid(longest), 1, ewThreads, 0, append(args, tail...)...)
}

// adamwSegTable is df_adamw_multi's segment table, (offset, length, decay 0 or 1) per segment,
// and the length of the longest.
func adamwSegTable(segs []AdamWSegment) (table []int64, longest int) {
	table = make([]int64, 0, 3*len(segs))
	for _, s := range segs {
		d := int64(0)
		if s.Decay {
			d = 1
		}
		table = append(table, int64(s.Off), int64(s.N), d)
		longest = max(longest, s.N)
	}
	return table, longest
}
