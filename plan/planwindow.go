package plan

// Sliding windows in plan (model.sliding_window, model.sliding_window_layers).
//
// A query at position i sees the keys i − W < j ≤ i, so a windowed layer over T tokens
// computes
//
//	V = Σ_{i<T} min(i + 1, W) = T·W − W(W−1)/2   (W ≤ T)
//
// of the causal triangle's T(T+1)/2 pairs (windowVisible): about 2W/T for W ≪ T, so attention
// FLOPs grow ∝ T·W instead of T². Under documents too, a token at document offset A and window
// position p sees min(A, p, W − 1) + 1 keys, so DocLengths.VisibleFraction truncates its sum at
// W and the sampled windows of plandocs.go get the window's starts.
//
// Idle. The ranks' work under the window is parallel.DocumentSteps' on the start table
// max(0, i − W + 1) (the window is a document that starts W − 1 positions back), and the idle
// fraction parallel.DocumentTime's, as for documents (windowIdle). A contiguous layout is
// balanced once W ≤ T/P: every rank but the first computes the same band; zigzag's chunk pairs
// that were balanced for the triangle are then uneven, and DistFlashAttn's helpers have
// little to take.
//
// Traffic. Ring, Burst and DistFlashAttn send no block that the window hides from every query
// of its receiver (parallel.ringCutoff, burst's cutoff, distflash's plan), so their bytes fall
// from ∝ T·P to ∝ T·⌈(W−1)/(T/P)⌉. plan measures them by running the schedules with a
// window, like every schedule's bytes: at the short lengths measureTraffic runs (chunks of k =
// 2 and 4 tokens, a chunk being the layout's unit of T/divisor tokens) with the window that
// hides exactly the chunk pairs the real one hides at seq_len T (windowReach, reachWindow).
// The bytes are linear in T at a fixed reach, so the fit holds. Zigzag, Attention2D (cyclic)
// and Ulysses send what they send without a window: zigzag's chunks put a visible pair on
// every ring step, Attention2D's all-gathers and Ulysses' all-to-alls move whole blocks.
//
// The longest sequence. A window changes no buffer: the attention kernels keep O(n) state per
// rank with or without it, so the memory model and MaxTokensPerGPU are the causal ones; what
// changes is the step time at a given length (∝ T instead of T² in the attention).

import (
	"fmt"
	"io"
	"sync"
	"text/tabwriter"

	"distflash/parallel"
)

// WindowPlan is what a sliding window does to one plan's attention.
type WindowPlan struct {
	Window     int     `json:"window"`      // model.sliding_window, tokens
	Layers     int     `json:"layers"`      // the layers it applies to (model.sliding_window_layers)
	Visible    float64 `json:"visible"`     // fraction of the causal pairs a windowed layer computes (without documents)
	Idle       float64 `json:"idle"`        // the ranks' idle fraction in a windowed layer (documents included when masked)
	CausalIdle float64 `json:"causal_idle"` // the schedule's idle with neither window nor documents (IdleFraction)
	BytesRatio float64 `json:"bytes_ratio"` // a windowed layer's attention bytes over an unwindowed one's, busiest rank, forward + backward
}

// windowVisible is the fraction of the causal pairs T(T+1)/2 that a window of W tokens
// leaves (the file comment); 1 without a window or when W ≥ T.
func windowVisible(T, W int) float64 {
	if W <= 0 || W >= T {
		return 1
	}
	t, w := float64(T), float64(W)
	return (t*w - w*(w-1)/2) / (t * (t + 1) / 2)
}

// windowStarts is the start table of a window of W tokens over T positions, combined with
// the document starts doc (nil: none): max(doc[i], i − W + 1), as model.Seq.Start.
func windowStarts(T, W int, doc []int32) []int32 {
	st := make([]int32, T)
	for i := range st {
		st[i] = int32(max(0, i-W+1))
		if doc != nil {
			st[i] = max(st[i], doc[i])
		}
	}
	return st
}

// windowReach is how many chunks back (a chunk being T/divisor tokens of layout l on P ranks)
// a window of W tokens reaches at seq_len T: the chunk at distance d ≥ 1 before a query's
// chunk holds a visible key iff d ≤ ⌈(W−1)/s⌉, s the chunk's tokens. It returns −1 when the
// window hides no chunk pair (none, or one that reaches every chunk) or the layout is cyclic,
// whose bytes do not depend on it.
func windowReach(l parallel.Layout, P, T, W int) int {
	div := l.Divisor(P)
	if W <= 0 || l == parallel.Cyclic || T <= 0 || T%div != 0 {
		return -1
	}
	s := T / div
	if D := (W - 1 + s - 1) / s; D < div-1 {
		return D
	}
	return -1
}

// reachWindow is a window that reaches D chunks back when chunks have k ≥ 2 tokens (0 for
// D < 0: no window): ⌈(W−1)/k⌉ = D for W = (D−1)·k + 2, and W = 1 (no other key) for D = 0.
func reachWindow(D, k int) int {
	switch {
	case D < 0:
		return 0
	case D == 0:
		return 1
	}
	return (D-1)*k + 2
}

var (
	windowMu    sync.Mutex
	windowCache = map[string]float64{}
)

// windowIdle is the idle fraction of schedule name on P ranks in a layer windowed to W tokens
// at seq_len T (the file comment), computed on the start table at T or, past maxDocWindow
// tokens, at the largest multiple of the layout's divisor below it with the window scaled
// alike. Results are cached.
func windowIdle(name string, P, T, W int) (float64, error) {
	if P <= 1 || W <= 0 || W >= T {
		return IdleFraction(name, P), nil
	}
	key := fmt.Sprintf("%s/%d/%d/%d", name, P, T, W)
	windowMu.Lock()
	defer windowMu.Unlock()
	if v, ok := windowCache[key]; ok {
		return v, nil
	}
	l, err := parallel.LayoutOf(name)
	if err != nil {
		return 0, err
	}
	t, w := T, W
	if t > maxDocWindow {
		div := l.Divisor(P)
		t = maxDocWindow / div * div
		w = max(1, int(float64(W)*float64(t)/float64(T)+0.5))
	}
	span, busy, err := parallel.DocumentTime(windowStarts(t, w, nil), name, P)
	if err != nil {
		return 0, fmt.Errorf("plan: a window of %d on %s: %w", W, name, err)
	}
	idle := 0.0
	if span > 0 {
		idle = 1 - float64(busy)/(float64(P)*float64(span))
	}
	windowCache[key] = idle
	return idle, nil
}

// writeWindowTable prints, under plan's table, what the sliding window does to each plan: the
// visible fraction of a windowed layer, its bytes against an unwindowed layer's, and the idle
// with and without the window.
func writeWindowTable(w io.Writer, rep Report) {
	var tw *tabwriter.Writer
	for _, pl := range rep.Plans {
		wp := pl.Window
		if wp == nil || pl.Refused != "" {
			continue
		}
		if tw == nil {
			fmt.Fprintf(w, "\nsliding window: %d tokens on %d of %d layers; a windowed layer against an unwindowed one (the columns above are the whole model's)\n", wp.Window, wp.Layers, rep.Layers)
			tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
			fmt.Fprintln(tw, "attention\tseq_len\tvisible\tattn bytes\tcausal idle\tidle\t")
		}
		fmt.Fprintf(tw, "%s\t%s\t%.4f\t%.3f\t%.3f\t%.3f\t\n", pl.Attention, seqName(pl.SeqLen), wp.Visible, wp.BytesRatio, wp.CausalIdle, wp.Idle)
	}
	if tw != nil {
		tw.Flush()
	}
}
