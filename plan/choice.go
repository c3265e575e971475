package plan

import (
	"fmt"
	"strings"

	"distflash/config"
)

// What checkpoint.activation = "auto", training.mlp_tile = -1 and training.loss_chunk = -1
// become on a device (Choose): the least recomputation whose step fits the device by
// MemoryFor's estimate, held to SafeCapacity (EstimateError of the memory left for what the
// estimate misses). The policies are tried in the order of what they recompute in the
// backward: none (nothing), attn_output (each block's projections and MLP from its input and
// attention output), layer (each block's whole forward, its attention too). For each, an
// MLP left whole before one in tiles (under none the tiles recompute each tile's gate and up,
// under the other two the backward recomputes them anyway) and the logits at once before in
// chunks (chunks recompute nothing: they cost a GEMM's efficiency and a read of the head's
// weights a chunk). So at 8K tokens the 0.85B of configs/llama-1b.toml on an 80 GB GPU in
// bf16 takes none with its MLP and logits whole; from about 32K attn_output; beyond, layer.
// With eval.interval > 0 the held-out evaluation during training must fit too
// (TrainEvalMemoryFor).
//
// Where the memory is not known (a GPU plan's catalogue does not name, a host whose memory
// cannot be read), auto takes attn_output, the tile of AutoMLPTile and the chunk of
// AutoLossChunk: the middle policy, which fits where today's runs fit, at the cost of its
// recomputation. A config that sets a policy, a tile or a chunk keeps it; Choose decides only
// what the config leaves to it.

// autoPolicies are the policies checkpoint.activation = "auto" weighs, least recomputation first.
var autoPolicies = []string{"none", "attn_output", "layer"}

// unknownPolicy is what auto takes where the device's memory is not known.
const unknownPolicy = "attn_output"

// Candidate is one setting of the recomputation knobs and its estimate.
type Candidate struct {
	Policy    string  `json:"policy"`     // checkpoint.activation
	MLPTile   int     `json:"mlp_tile"`   // training.mlp_tile's tokens; 0: the MLP whole
	LossChunk int     `json:"loss_chunk"` // training.loss_chunk's tokens; 0: the logits at once
	Peak      float64 `json:"peak"`       // bytes per rank: the step's peak, or the held-out evaluation's during training where larger
	Fits      bool    `json:"fits"`       // Peak is within the budget
}

// Choice is what Choose decided: the candidate taken, the keys it decided, the memory it was
// held to and the other policies it weighed.
type Choice struct {
	Candidate
	// Auto are the keys the config left to Choose, of checkpoint.activation,
	// training.mlp_tile and training.loss_chunk (none: the choice is the config's own).
	Auto     []string `json:"auto,omitempty"`
	Capacity float64  `json:"capacity"` // bytes per rank; 0: not known
	Budget   float64  `json:"budget"`   // SafeCapacity(Capacity): what a candidate must fit in
	// Others are the policies auto weighed and did not take, least recomputation first, each
	// at its most compact setting that fits (or its most compact setting).
	Others []Candidate `json:"others,omitempty"`
}

// IsAuto reports whether cfg leaves any of the recomputation knobs to Choose.
func IsAuto(cfg config.Config) bool {
	t := cfg.Training
	return cfg.Checkpoint.Activation == "auto" || t.MLPTile < 0 || t.LossChunk < 0
}

// Resolved returns cfg with what it leaves to Choose decided for capacity bytes per rank (0:
// not known): checkpoint.activation one of none, attn_output and layer, training.mlp_tile and
// training.loss_chunk numbers of tokens (0: whole). A config with nothing to decide is
// returned as it is.
func Resolved(cfg config.Config, capacity float64) config.Config {
	if !IsAuto(cfg) {
		return cfg
	}
	return Choose(cfg, capacity).Apply(cfg)
}

// Apply returns cfg with the choice's policy, tile and chunk.
func (c Candidate) Apply(cfg config.Config) config.Config {
	cfg.Checkpoint.Activation, cfg.Training.MLPTile, cfg.Training.LossChunk = c.Policy, c.MLPTile, c.LossChunk
	return cfg
}

// Choose decides, for a rank of capacity bytes (0: not known), what cfg leaves to it of
// checkpoint.activation ("auto"), training.mlp_tile and training.loss_chunk (-1): the first
// candidate, least recomputation first, whose peak fits SafeCapacity(capacity); when none
// fits, the most compact (layer, tiled, chunked), with Fits false.
func Choose(cfg config.Config, capacity float64) Choice {
	ch := Choice{Capacity: capacity, Budget: SafeCapacity(capacity)}
	policies := []string{cfg.Checkpoint.Activation}
	if cfg.Checkpoint.Activation == "auto" {
		policies = autoPolicies
		ch.Auto = append(ch.Auto, "checkpoint.activation")
	}
	tiles := []int{cfg.Training.MLPTile}
	if cfg.Training.MLPTile < 0 {
		tiles = []int{0, config.AutoMLPTile(cfg.Model.FFNDim)}
		ch.Auto = append(ch.Auto, "training.mlp_tile")
	}
	chunks := []int{cfg.Training.LossChunk}
	if cfg.Training.LossChunk < 0 {
		chunks = []int{0, config.AutoLossChunk(cfg.Model.VocabSize)}
		ch.Auto = append(ch.Auto, "training.loss_chunk")
	}
	// within a policy: the MLP and the logits whole, then the logits in chunks, then both cut
	var variants [][2]int
	for _, t := range tiles {
		for _, c := range chunks {
			if t > 0 && c == 0 && len(chunks) > 1 {
				continue // a tiled MLP beside whole logits: the chunks cost less, so they come first
			}
			variants = append(variants, [2]int{t, c})
		}
	}
	last := variants[len(variants)-1]
	if capacity <= 0 {
		p := policies[0]
		if len(policies) > 1 {
			p = unknownPolicy
		}
		ch.Candidate = Candidate{Policy: p, MLPTile: last[0], LossChunk: last[1]}
		return ch
	}
	var best []Candidate // per policy: its first variant that fits, else its most compact
	for _, p := range policies {
		var c Candidate
		for _, v := range variants {
			c = ch.Estimate(cfg, Candidate{Policy: p, MLPTile: v[0], LossChunk: v[1]})
			if c.Fits {
				break
			}
		}
		best = append(best, c)
	}
	taken := len(best) - 1
	for i, c := range best {
		if c.Fits {
			taken = i
			break
		}
	}
	ch.Candidate = best[taken]
	if len(best) > 1 {
		ch.Others = append(append([]Candidate{}, best[:taken]...), best[taken+1:]...)
	}
	return ch
}

// Estimate is c with its peak on cfg and whether that fits the choice's budget (false where
// the capacity is not known).
func (ch Choice) Estimate(cfg config.Config, c Candidate) Candidate {
	cfg = c.Apply(cfg)
	c.Peak = MemoryFor(cfg, ch.Capacity).Peak
	if ev, ok := TrainEvalMemoryFor(cfg, ch.Capacity); ok {
		c.Peak = max(c.Peak, ev.Peak)
	}
	c.Fits = ch.Capacity > 0 && c.Peak <= ch.Budget
	return c
}

// String says what the choice decided and why, one clause per key it decided, e.g.
//
//	checkpoint.activation = auto → none: 33.1 GB of 72.0 GB (90% of 80.0 GB) (attn_output 19.4 GB, layer 17.9 GB); training.mlp_tile = -1 → the MLP whole; training.loss_chunk = -1 → the logits at once
//
// It is "" when the config decided everything itself.
func (ch Choice) String() string {
	if len(ch.Auto) == 0 {
		return ""
	}
	var parts []string
	budget := fmt.Sprintf("%s of %s (%.0f%% of %s)", gb1(ch.Peak), gb1(ch.Budget), 100*(1-EstimateError), gb1(ch.Capacity))
	known := ch.Capacity > 0
	// over the budget but within the memory: the estimate's error margin is what is short
	short := "DOES NOT FIT"
	if ch.Peak <= ch.Capacity {
		short = "over the budget (the estimate's margin)"
	}
	for i, key := range ch.Auto {
		var s string
		switch key {
		case "checkpoint.activation":
			s = "checkpoint.activation = auto → " + ch.Policy
			switch {
			case !known:
				s += ": the device's memory is not known, so the middle policy (checkpoint.activation chooses another)"
			case ch.Fits:
				s += ": " + budget
			default:
				s += ": " + short + ": " + budget + ", and no policy needs less"
			}
			if known && len(ch.Others) > 0 {
				var o []string
				for _, c := range ch.Others {
					o = append(o, c.Policy+" "+gb1(c.Peak))
				}
				s += " (" + strings.Join(o, ", ") + ")"
			}
		case "training.mlp_tile":
			s = "training.mlp_tile = -1 → the MLP whole"
			if ch.MLPTile > 0 {
				s = fmt.Sprintf("training.mlp_tile = -1 → tiles of %d tokens", ch.MLPTile)
				if known {
					s += " (whole, it does not fit)"
				}
			}
		case "training.loss_chunk":
			s = "training.loss_chunk = -1 → the logits at once"
			if ch.LossChunk > 0 {
				s = fmt.Sprintf("training.loss_chunk = -1 → chunks of %d tokens", ch.LossChunk)
				if known {
					s += " (at once, they do not fit)"
				}
			}
		}
		if i == 0 && key != "checkpoint.activation" { // the policy was the config's: the reason goes here
			switch {
			case !known:
				s += ": the device's memory is not known, so the 256 MiB rule"
			case ch.Fits:
				s += ": the step takes " + budget
			default:
				s += ": " + short + " even so: " + budget
			}
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, "; ")
}

// gb1 writes bytes in GB (10^9) with one decimal, or below 1 GB in MB (10^6).
func gb1(b float64) string {
	if b < 1e9 {
		return fmt.Sprintf("%.0f MB", b/1e6)
	}
	return fmt.Sprintf("%.1f GB", b/1e9)
}
