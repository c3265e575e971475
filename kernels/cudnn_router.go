package kernels

import (
	"fmt"
	"os"
	"sort"
	"strings"
)

// Attention paths of a backend that has more than one (the CUDA backend: cuDNN's fused
// attention and its own FlashAttention kernels). The interface is optional: the CPU backend
// has one path and does not implement it, so a caller asserts it.

// The values of device.attention, which SetAttention takes.
const (
	// AttentionAuto sends each block to cuDNN when cuDNN can compute it (a build and a machine
	// with cuDNN 9, bf16/fp16 precision, a mask cuDNN expresses), else to the own kernel; a
	// missing cuDNN is said once and the own kernel runs every block.
	AttentionAuto = "auto"
	// AttentionCUDNN is AttentionAuto, except that a cuDNN that cannot be loaded is an error of
	// SetAttention. Blocks cuDNN cannot compute still run the own kernel.
	AttentionCUDNN = "cudnn"
	// AttentionOwn runs every block on the own kernel.
	AttentionOwn = "own"
)

// AttentionEnv is the environment variable that sets the CUDA backend's attention path when
// it is made (one of the Attention* values; default auto). A config's device.attention,
// passed to SetAttention, overrides it.
const AttentionEnv = "DISTFLASH_ATTENTION"

// AttentionRouter is implemented by a backend whose attention blocks can take several paths.
type AttentionRouter interface {
	// SetAttention selects the path of later attention blocks: AttentionAuto, AttentionCUDNN or
	// AttentionOwn. AttentionCUDNN loads cuDNN at once and returns why it cannot be used.
	SetAttention(mode string) error
	// SetDeterministicAttention asks for a backward that gives the same bits run to run
	// (device.deterministic_attention): cuDNN's deterministic backward where its workspace fits
	// a cap, the own kernel (deterministic) elsewhere. Off by default, as in PyTorch and
	// TransformerEngine: cuDNN then accumulates dQ with atomics.
	SetDeterministicAttention(on bool)
	// AttentionPaths counts the attention blocks that took each path.
	AttentionPaths() AttentionPaths
}

// AttentionPaths is which path the attention blocks of a backend took.
type AttentionPaths struct {
	Mode          string // the setting (AttentionAuto, AttentionCUDNN, AttentionOwn)
	Deterministic bool   // device.deterministic_attention
	Library       string // e.g. "cuDNN 9.10.2 (libcudnn.so.9), NVRTC 12.8", or why cuDNN is not used ("" before the first block that asked)
	// Forward and Backward count blocks by path, e.g. "cudnn causal" or "own: fp32": a path
	// is "cudnn <block kind>" or "own: <why cuDNN did not take the block>".
	Forward, Backward map[string]int64
	// Plans counts cuDNN's execution plans (one per graph: block shape, mask, direction).
	Plans PlanStats
}

// PlanStats counts the cuDNN plans a backend built and the time it took.
type PlanStats struct {
	Built, Failed int     // plans built; graphs no engine of cuDNN took
	Seconds       float64 // the build time of all of them
	Slowest       float64 // the longest build of one
	Workspace     int64   // the largest workspace one asks for, bytes (with its workspace-resident tensors)
}

// String writes the counts, e.g. "12 plans built in 3.4 s (the slowest 0.6 s), workspace up to 96 MiB".
func (p PlanStats) String() string {
	s := fmt.Sprintf("%d plans built in %.1f s (the slowest %.2f s), workspace up to %.0f MiB", p.Built, p.Seconds, p.Slowest,
		float64(p.Workspace)/(1<<20))
	if p.Failed > 0 {
		s += fmt.Sprintf(", %d graphs without a plan", p.Failed)
	}
	return s
}

// ValidateAttention reports a mode that is not one of the Attention* values.
func ValidateAttention(mode string) error {
	switch mode {
	case AttentionAuto, AttentionCUDNN, AttentionOwn:
		return nil
	}
	return fmt.Errorf("kernels: device.attention = %q: want %s, %s or %s", mode, AttentionAuto, AttentionCUDNN, AttentionOwn)
}

// AttentionFromEnv returns $DISTFLASH_ATTENTION, AttentionAuto when unset, or an error naming a
// value that is not an Attention* value.
func AttentionFromEnv() (string, error) {
	m := os.Getenv(AttentionEnv)
	if m == "" {
		return AttentionAuto, nil
	}
	if err := ValidateAttention(m); err != nil {
		return "", fmt.Errorf("%w (from %s)", err, AttentionEnv)
	}
	return m, nil
}

// CUDNNBlocks is the number of blocks cuDNN computed, forward and backward.
func (p AttentionPaths) CUDNNBlocks() (fwd, bwd int64) {
	for k, n := range p.Forward {
		if strings.HasPrefix(k, "cudnn") {
			fwd += n
		}
	}
	for k, n := range p.Backward {
		if strings.HasPrefix(k, "cudnn") {
			bwd += n
		}
	}
	return fwd, bwd
}

// String writes the paths on a few lines, the largest counts first, e.g.
//
//	attention (auto, cuDNN 9.10.2): forward 96 cudnn causal, 32 cudnn full; backward 96 cudnn causal, 32 cudnn full
func (p AttentionPaths) String() string {
	list := func(m map[string]int64) string {
		if len(m) == 0 {
			return "none"
		}
		keys := make([]string, 0, len(m))
		for k := range m {
			keys = append(keys, k)
		}
		sort.Slice(keys, func(i, j int) bool {
			if m[keys[i]] != m[keys[j]] {
				return m[keys[i]] > m[keys[j]]
			}
			return keys[i] < keys[j]
		})
		parts := make([]string, len(keys))
		for i, k := range keys {
			parts[i] = fmt.Sprintf("%d %s", m[k], k)
		}
		return strings.Join(parts, ", ")
	}
	lib := p.Library
	if lib == "" {
		lib = "cuDNN not asked yet"
	}
	mode := p.Mode
	if p.Deterministic {
		mode += ", deterministic"
	}
	s := fmt.Sprintf("attention (%s, %s): forward %s; backward %s", mode, lib, list(p.Forward), list(p.Backward))
	if p.Plans.Built+p.Plans.Failed > 0 {
		s += "; cuDNN " + p.Plans.String()
	}
	return s
}
