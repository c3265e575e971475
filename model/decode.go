package model

import (
	"fmt"
	"math"

	"distflash/kernels"
)

// Decoding: text generation one token at a time with a key/value cache.
//
// The prompt is prefilled by one Forward over its tokens (the configured attention schedule
// with sequence parallelism), during which each layer's keys (after RoPE) and values of the
// rank's tokens are copied into the rank's cache (Model.KVHook): the cache stays where the
// schedule's layout placed the tokens, and no rank holds all of it. Each new token is then
// computed by every rank, layer by layer, as written out in Step: its query meets each rank's
// cached keys in one attention block per rank (the primitive's partial result: unnormalised
// output, row maximum, row sum), the partial results are all-gathered and merged by
// log-sum-exp in rank order (kernels.Backend.AttnMerge, FlashAttention's online softmax), so
// every rank finishes the same attention output from every key without any rank holding the
// keys. The new token's own key and value go to one rank's cache, token i of the decoding on
// rank i mod P. Everything else of the token (projections, MLP, head) is computed by every rank
// on the same inputs, so every rank has the same logits; a caller that samples still shares
// the sampled token (Decoder.Share) so that the ranks cannot drift apart.
//
// Positions and RoPE. The prompt holds positions 0..n−1 and the k-th new token position n+k.
// The RoPE table is the one of a sequence of n + maxNew tokens (Config.RoPE), prompt and
// new tokens alike, so the logits of every step are those a Forward of the whole sequence
// would give (which matters for rope_scaling dynamic only). A windowed layer sees the keys of
// the last sliding_window positions.

// Group is the ranks a Decoder's cache is spread over; transport.Comm implements it.
type Group interface {
	Rank() int
	Size() int
	// AllGather concatenates every rank's src into dst in rank order.
	AllGather(dst, src kernels.Buf, site string)
	// AllReduce sums buf over the ranks, in rank order.
	AllReduce(buf kernels.Buf, site string)
}

// CacheBytes is the key/value cache of tokens tokens of a model of cfg: keys and values of
// every layer, float32.
func CacheBytes(cfg Config, tokens int) int64 {
	return 2 * int64(cfg.NLayers) * int64(cfg.KVDim()) * 4 * int64(tokens)
}

// Decoder generates from a model: Prefill once, then Step per token. It is one rank's; with
// a Group every rank of the group runs its own Decoder over the same calls.
type Decoder struct {
	m          *Model
	g          Group // nil: one rank
	rank, size int

	k, v    []kernels.Buf // per layer [capacity, KVDim] keys (after RoPE) and values
	pos     []int32       // positions of the cached tokens, in cache order
	next    int32         // position of the next token
	decoded int           // tokens Step has taken
	maxNew  int           // tokens Step may take

	// one token's buffers
	x, norm, rstd, q, kt, vt, att, lse, h, gate, up, act, out, logits kernels.Buf
	acc, part                                                         kernels.AttnState
	pack, gathered                                                    kernels.Buf // partial results, this rank's and all ranks'
	tok                                                               kernels.Buf // the shared token
	host                                                              []float32
	one                                                               []int32
}

// NewDecoder returns a decoder of m on the ranks of g (nil: m alone). m must hold its
// parameters; its Attn is the schedule the prefill runs.
func NewDecoder(m *Model, g Group) *Decoder {
	d := &Decoder{m: m, g: g, size: 1}
	if g != nil {
		d.rank, d.size = g.Rank(), g.Size()
	}
	be, c := m.be, m.Cfg
	Q, KV, D, F, H := c.QDim(), c.KVDim(), c.Dim, c.FFNDim, c.NHeads
	d.x, d.norm, d.rstd, d.h, d.out = be.Alloc(D), be.Alloc(D), be.Alloc(1), be.Alloc(D), be.Alloc(D)
	d.q, d.kt, d.vt, d.att, d.lse = be.Alloc(Q), be.Alloc(KV), be.Alloc(KV), be.Alloc(Q), be.Alloc(H)
	d.gate, d.up, d.act = be.Alloc(F), be.Alloc(F), be.Alloc(F)
	d.logits, d.host = be.Alloc(c.VocabSize), make([]float32, c.VocabSize)
	d.acc = kernels.AttnState{O: be.Alloc(Q), M: be.Alloc(H), L: be.Alloc(H)}
	d.pack = be.Alloc(Q + 2*H)
	d.part = kernels.AttnState{O: be.Slice(d.pack, 0, Q), M: be.Slice(d.pack, Q, H), L: be.Slice(d.pack, Q+H, H)}
	d.gathered = be.Alloc(d.size * (Q + 2*H))
	d.one, d.tok = make([]int32, 1), be.Alloc(1)
	return d
}

// Prefill runs the prompt: ids are this rank's tokens at the global positions pos (the
// layout's, as Forward takes them), of a prompt of promptLen tokens; positions from promptLen
// on are padding, which is neither cached nor seen. It makes room for maxNew tokens and returns
// the logits of the prompt's last token (every rank gets them). The slice is reused by the
// next call.
func (d *Decoder) Prefill(ids, pos []int32, promptLen, maxNew int) []float32 {
	m, be, c := d.m, d.m.be, d.m.Cfg
	if promptLen < 1 || maxNew < 0 {
		panic(fmt.Sprintf("model: prefill of %d tokens for %d new ones", promptLen, maxNew))
	}
	held := 0
	for i, p := range pos {
		if int(p) < promptLen {
			if held != i {
				panic("model: prefill positions with padding before prompt tokens on one rank")
			}
			held++
		}
	}
	capacity := held + (maxNew+d.size-1)/d.size
	KV := c.KVDim()
	d.k, d.v = make([]kernels.Buf, c.NLayers), make([]kernels.Buf, c.NLayers)
	for l := range d.k {
		d.k[l], d.v[l] = be.Alloc(capacity*KV), be.Alloc(capacity*KV)
	}
	d.pos = append(make([]int32, 0, capacity), pos[:held]...)
	d.next, d.decoded, d.maxNew = int32(promptLen), 0, maxNew

	m.KVHook = func(l int, k, v kernels.Buf) {
		if held > 0 {
			be.Copy(be.Slice(d.k[l], 0, held*KV), be.Slice(k, 0, held*KV))
			be.Copy(be.Slice(d.v[l], 0, held*KV), be.Slice(v, 0, held*KV))
		}
	}
	be.Zero(d.logits)
	V := c.VocabSize
	m.RowHook = func(row0 int, lg kernels.Buf, rows int) {
		for i := row0; i < row0+rows; i++ {
			if int(pos[i]) == promptLen-1 {
				be.Copy(d.logits, be.Slice(lg, (i-row0)*V, V))
			}
		}
	}
	targets := make([]int32, len(ids))
	for i := range targets {
		targets[i] = -1
	}
	m.Forward(Batch{IDs: ids, Targets: targets, B: 1, Pos: pos, SeqLen: promptLen + maxNew})
	m.KVHook, m.RowHook = nil, nil
	if d.g != nil { // the last token's rank has them, the others zeros: the sum is exact
		d.g.AllReduce(d.logits, "decode.prefill_logits")
	}
	be.Download(d.host, d.logits)
	return d.host
}

// Share makes every rank's tok the root rank's (rank 0) and returns it: the token a caller
// sampled on each rank from the same logits, taken from one of them.
func (d *Decoder) Share(tok int32) int32 {
	if d.g == nil {
		return tok
	}
	be, b := d.m.be, d.tok
	v := []float32{0}
	if d.rank == 0 {
		v[0] = float32(tok) // exact: ids are below 2^24
	}
	be.Upload(b, v)
	d.g.AllReduce(b, "decode.token")
	be.Download(v, b)
	return int32(v[0])
}

// Step feeds tok (the token at the next position) through the model and returns the logits
// of the token after it. The slice is reused by the next call.
func (d *Decoder) Step(tok int32) []float32 {
	m, be, c := d.m, d.m.be, d.m.Cfg
	if d.decoded >= d.maxNew {
		panic(fmt.Sprintf("model: decoding step %d of a cache made for %d", d.decoded+1, d.maxNew))
	}
	D, Q, KV, F, H, hd := c.Dim, c.QDim(), c.KVDim(), c.FFNDim, c.NHeads, c.HeadDim
	eps := float32(c.NormEps)
	p := d.next
	qpos := []int32{p}
	d.one[0] = tok
	be.Embedding(d.x, m.acquire(0)[0], d.one, D)
	m.release(0)
	mine := d.decoded%d.size == d.rank // this rank caches the token
	n := len(d.pos)
	if mine {
		d.pos = append(d.pos, p)
	}
	for l := 0; l < c.NLayers; l++ {
		w := layerWeights(m.acquire(1 + l))
		be.RMSNorm(d.norm, d.rstd, d.x, w.AttnNorm, 1, D, eps)
		m.linear(kernels.OpGemmQ, d.q, d.norm, w.Wq, 1, Q, D)
		m.linear(kernels.OpGemmK, d.kt, d.norm, w.Wk, 1, KV, D)
		m.linear(kernels.OpGemmV, d.vt, d.norm, w.Wv, 1, KV, D)
		be.RoPE(d.q, qpos, c.NHeads, hd, m.rope, false)
		be.RoPE(d.kt, qpos, c.NKVHeads, hd, m.rope, false)
		if mine {
			be.Copy(be.Slice(d.k[l], n*KV, KV), d.kt)
			be.Copy(be.Slice(d.v[l], n*KV, KV), d.vt)
		}
		// this rank's keys: a partial result, merged with the other ranks' by log-sum-exp
		nk := len(d.pos)
		be.AttnInit(d.part)
		if nk > 0 {
			sh := kernels.AttnShape{NQ: 1, NK: nk, Heads: H, KVHeads: c.NKVHeads, HeadDim: hd, Causal: true,
				Scale: float32(1 / math.Sqrt(float64(hd))), QPos: qpos, KPos: d.pos}
			if W := c.Window(l); W > 0 {
				sh.QStart = []int32{max(0, p-int32(W)+1)}
			}
			be.AttnForward(d.part, d.q, be.Slice(d.k[l], 0, nk*KV), be.Slice(d.v[l], 0, nk*KV), sh)
		}
		st := d.part
		if d.g != nil {
			d.g.AllGather(d.gathered, d.pack, "decode.attn")
			be.AttnInit(d.acc)
			w := Q + 2*H
			for r := 0; r < d.size; r++ { // in rank order: every rank merges alike
				o := r * w
				be.AttnMerge(d.acc, kernels.AttnState{O: be.Slice(d.gathered, o, Q), M: be.Slice(d.gathered, o+Q, H),
					L: be.Slice(d.gathered, o+Q+H, H)}, 1, H, hd)
			}
			st = d.acc
		}
		be.AttnFinish(d.att, d.lse, st, 1, H, hd)
		m.linear(kernels.OpGemmO, d.h, d.att, w.Wo, 1, D, Q)
		be.Add(d.h, d.h, d.x)
		be.RMSNorm(d.norm, d.rstd, d.h, w.FFNNorm, 1, D, eps)
		m.linear(kernels.OpGemmGate, d.gate, d.norm, w.Gate, 1, F, D)
		m.linear(kernels.OpGemmUp, d.up, d.norm, w.Up, 1, F, D)
		be.SwiGLU(d.act, d.gate, d.up)
		m.linear(kernels.OpGemmDown, d.out, d.act, w.Down, 1, D, F)
		be.Add(d.x, d.out, d.h)
		m.release(1 + l)
	}
	head := m.acquire(c.NLayers + 1)
	be.RMSNorm(d.norm, d.rstd, d.x, head[0], 1, D, eps)
	m.linear(kernels.OpGemmHead, d.logits, d.norm, head[1], 1, c.VocabSize, D)
	m.release(c.NLayers + 1)
	be.Download(d.host, d.logits)
	d.next++
	d.decoded++
	return d.host
}

// Cached is the number of tokens in this rank's cache.
func (d *Decoder) Cached() int { return len(d.pos) }
