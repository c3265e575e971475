package evaluate

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"sync"
	"time"

	"distflash/model"
	"distflash/parallel"
	"distflash/parallel/transport"
	"distflash/world"
)

// Generation: `distflash generate`, passkey's generated scoring and train's samples.
//
// The prompt is prefilled by the evaluator's ranks with the configured schedule, each rank
// keeping its tokens' keys and values; then every new token is decoded by all ranks, each
// attending with its own cache and the partial results merged by log-sum-exp
// (model.Decoder). Rank 0 samples the next token from the logits, which every rank has
// alike, and shares it.

// GenOptions are how tokens are chosen.
// Its JSON (generate --out's "options") names each by its flag.
type GenOptions struct {
	MaxNew      int     `json:"max_new_tokens"` // tokens to generate at most
	Temperature float64 `json:"temperature"`    // 0: greedy (the largest logit, the lowest id among equals)
	TopK        int     `json:"top_k"`          // sample among the K most likely tokens; 0: all
	TopP        float64 `json:"top_p"`          // sample among the most likely tokens whose probabilities reach P (nucleus); 0 or 1: all
	Seed        uint64  `json:"seed"`           // the sampler's seed
	Stop        []int32 `json:"stop"`           // tokens that end the text (EOS); not included in it
}

// Validate reports options no sampler can follow.
func (o GenOptions) Validate() error {
	switch {
	case o.MaxNew < 1:
		return fmt.Errorf("--max-new-tokens %d: want at least 1", o.MaxNew)
	case o.Temperature < 0 || math.IsNaN(o.Temperature) || math.IsInf(o.Temperature, 0):
		return fmt.Errorf("--temperature %g: want 0 (greedy) or a positive number", o.Temperature)
	case o.TopK < 0:
		return fmt.Errorf("--top-k %d: want 0 (all tokens) or a positive count", o.TopK)
	case !(o.TopP >= 0 && o.TopP <= 1):
		return fmt.Errorf("--top-p %g: want a probability in (0, 1], or 0 for all tokens", o.TopP)
	}
	return nil
}

// Generation is what one Generate produced.
type Generation struct {
	Tokens     []int32 `json:"tokens"`      // the new tokens (without a stop token)
	Stopped    string  `json:"stopped"`     // "eos" (a stop token), "length" (MaxNew) or "cancelled"
	PromptLen  int     `json:"prompt_len"`  // prompt tokens
	PrefillSec float64 `json:"prefill_s"`   // the prompt's forward
	DecodeSec  float64 `json:"decode_s"`    // the new tokens
	Decoded    int     `json:"decoded"`     // decoding steps (tokens fed back; the first new token comes from the prefill)
	CacheBytes int64   `json:"cache_bytes"` // the key/value cache of all ranks together
	// BytesPerToken is, per call site, the bytes the busiest rank sent per decoding step.
	BytesPerToken map[string]float64 `json:"bytes_per_token,omitempty"`
}

// PrefillTokensPerSec is the prompt's tokens per second of prefill.
func (g Generation) PrefillTokensPerSec() float64 { return float64(g.PromptLen) / g.PrefillSec }

// DecodeTokensPerSec is the new tokens per second of decoding (the first, which the prefill
// gives, not counted).
func (g Generation) DecodeTokensPerSec() float64 {
	if g.DecodeSec == 0 {
		return 0
	}
	return float64(g.Decoded) / g.DecodeSec
}

// sampler picks tokens from logits as GenOptions say.
type sampler struct {
	opt   GenOptions
	rng   *rand.Rand
	probs []float64
	order []int
}

func newSampler(opt GenOptions) *sampler {
	return &sampler{opt: opt, rng: rand.New(rand.NewPCG(opt.Seed, 0x9e3779b97f4a7c15))}
}

// next returns the token chosen from logits.
func (s *sampler) next(logits []float32) int32 {
	if s.opt.Temperature == 0 {
		return argmax(logits)
	}
	V := len(logits)
	if cap(s.order) < V {
		s.order, s.probs = make([]int, V), make([]float64, V)
	}
	order, probs := s.order[:V], s.probs[:V]
	for i := range order {
		order[i] = i
	}
	// the most likely first, ties by id, so the choice does not depend on the sort
	sort.Slice(order, func(a, b int) bool {
		x, y := logits[order[a]], logits[order[b]]
		return x > y || x == y && order[a] < order[b]
	})
	keep := V
	if k := s.opt.TopK; k > 0 && k < keep {
		keep = k
	}
	t, top := s.opt.Temperature, float64(logits[order[0]])
	var sum float64
	for i := 0; i < keep; i++ {
		probs[i] = math.Exp((float64(logits[order[i]]) - top) / t)
		sum += probs[i]
	}
	if p := s.opt.TopP; p > 0 && p < 1 {
		var c float64
		for i := 0; i < keep; i++ {
			c += probs[i] / sum
			if c >= p {
				keep = i + 1
				break
			}
		}
		sum = 0
		for i := 0; i < keep; i++ {
			sum += probs[i]
		}
	}
	u := s.rng.Float64() * sum
	for i := 0; i < keep; i++ {
		u -= probs[i]
		if u < 0 {
			return int32(order[i])
		}
	}
	return int32(order[keep-1])
}

// argmax is the index of the largest value, the lowest among equals.
func argmax(x []float32) int32 {
	best := 0
	for i, v := range x {
		if v > x[best] {
			best = i
		}
	}
	return int32(best)
}

// Generate continues prompt (token ids, BOS included when the model wants one) by up to
// opt.MaxNew tokens on the evaluator's ranks: every replica generates the same text (the same
// seed, the same logits), each sequence group with its cache sharded over its ranks. emit, when
// not nil, is called with each new token as it is chosen (on rank 0's goroutine). A cancelled
// ctx (on any process) stops it after the token being chosen (Stopped "cancelled").
func (e *Evaluator) Generate(ctx context.Context, prompt []int32, opt GenOptions, emit func(tok int32)) (Generation, error) {
	if err := opt.Validate(); err != nil {
		return Generation{}, err
	}
	n := len(prompt)
	if n == 0 {
		return Generation{}, fmt.Errorf("generate: an empty prompt")
	}
	if total := n + opt.MaxNew; total > e.Config.MaxSeqLen {
		return Generation{}, fmt.Errorf("generate: %d prompt tokens + --max-new-tokens %d = %d exceed the model's longest sequence, %d (max_seq_len / max_position_embeddings)",
			n, opt.MaxNew, total, e.Config.MaxSeqLen)
	}
	d := e.w.Dims
	T := d.Padded(n)
	ids := make([]int32, T) // padding after the prompt: neither cached nor seen
	copy(ids, prompt)
	g := Generation{PromptLen: n, Stopped: "length", CacheBytes: model.CacheBytes(e.Config, T+opt.MaxNew) * int64(d.DP())}
	// each rank holds its sequence group's share of one replica's cache
	perRank := model.CacheBytes(e.Config, T+opt.MaxNew) / int64(d.SP)
	if avail, source, ok := e.w.Memory(); ok && float64(perRank) > avail {
		return Generation{}, fmt.Errorf("generate: the key/value cache of %d prompt tokens + --max-new-tokens %d needs %.2f GiB per rank (%d layers × 2 × %d values a token, float32, over %d ranks), a rank has %.2f GiB (%s): shorten the prompt or --max-new-tokens",
			n, opt.MaxNew, float64(perRank)/(1<<30), e.Config.NLayers, e.Config.KVDim(), d.SP, avail/(1<<30), source)
	}
	// the decoding's stop reasons, shared with the token: a token id, or one of these
	const eos, cancelled = -1, -2
	gens := make(map[int]*Generation)       // each local rank's, written by its goroutine
	sent := make(map[int]transport.Traffic) // each local rank's bytes over the decoding steps
	var mu sync.Mutex
	err := e.w.Run(func(r *world.Rank) error {
		my := &Generation{}
		mu.Lock()
		gens[r.ID] = my
		mu.Unlock()
		pos, err := r.Positions(T)
		if err != nil {
			return err
		}
		var grp model.Group
		if d.SP > 1 {
			grp = r.Seq
		}
		dec := model.NewDecoder(r.Model, grp)
		smp := newSampler(opt)
		start := time.Now()
		logits := dec.Prefill(parallel.Shard(ids, 1, T, 1, pos), pos, n, opt.MaxNew)
		before := r.Comm.Traffic()
		my.PrefillSec = time.Since(start).Seconds()
		start = time.Now()
		for i := 0; ; i++ {
			tok := int32(cancelled)
			if r.SPRank() == 0 { // each sequence group's first rank chooses; the group takes its choice
				tok = smp.next(logits)
				switch {
				case slices.Contains(opt.Stop, tok):
					tok = eos
				case ctx.Err() != nil:
					tok = cancelled
				}
			}
			// the replicas stop together (their FSDP gathers meet): one more flag, agreed by all
			if d.DP() > 1 && e.stoppedOn(r, ctx) {
				tok = cancelled
			}
			if tok = dec.Share(tok); tok < 0 {
				my.Stopped = map[int32]string{eos: "eos", cancelled: "cancelled"}[tok]
				break
			}
			my.Tokens = append(my.Tokens, tok)
			if emit != nil && r.ID == 0 {
				emit(tok)
			}
			if i+1 == opt.MaxNew {
				break
			}
			logits = dec.Step(tok)
		}
		my.DecodeSec = time.Since(start).Seconds()
		after := r.Comm.Traffic().Since(before)
		mu.Lock()
		sent[r.ID] = after
		mu.Unlock()
		return nil
	})
	if err != nil {
		return Generation{}, fmt.Errorf("generate: %w", err)
	}
	first := gens[e.w.First().ID]
	g.Tokens, g.PrefillSec, g.DecodeSec = first.Tokens, first.PrefillSec, first.DecodeSec
	if first.Stopped != "" {
		g.Stopped = first.Stopped
	}
	g.Decoded = max(len(g.Tokens)-1, 0)
	if g.Stopped != "length" {
		g.Decoded = len(g.Tokens)
	}
	if steps := len(g.Tokens); e.w.Dims.World > 1 && steps > 0 {
		// per call site, the bytes the busiest of this process's ranks sent per token
		g.BytesPerToken = map[string]float64{}
		for _, tr := range sent {
			for site, b := range tr {
				if b > 0 {
					g.BytesPerToken[site] = max(g.BytesPerToken[site], float64(b)/float64(steps))
				}
			}
		}
	}
	return g, nil
}
