//go:build cuda

package kernels

import "distflash/kernels/cuda"

// cudaTimer is the CUDA backend's clock for the per-op profile (OpTimer): mark i records event
// i of a pool on the backend's stream, and Times waits for the last and reads each event's time
// after the first with cuEventElapsedTime. The events are made the first time a mark needs
// them and reused after a Reset, so a step's marks allocate nothing after the first step.
type cudaTimer struct {
	c      *CUDA
	events []*cuda.Event
	n      int
}

// NewOpTimer returns a timer on c's stream (kernels.TimerOf).
func (c *CUDA) NewOpTimer() OpTimer { return &cudaTimer{c: c} }

// Mark implements OpTimer.
func (t *cudaTimer) Mark() int {
	if t.n == len(t.events) {
		e, err := t.c.dev.NewEvent()
		must(err)
		t.events = append(t.events, e)
	}
	must(t.c.dev.RecordEvent(t.events[t.n]))
	t.n++
	return t.n - 1
}

// Times implements OpTimer: it waits for the last mark.
func (t *cudaTimer) Times() []float64 {
	out := make([]float64, t.n)
	if t.n == 0 {
		return out
	}
	for i := 1; i < t.n; i++ { // each waits for its event, the first that is not yet reached for the rest
		s, err := t.c.dev.EventSeconds(t.events[0], t.events[i])
		must(err)
		out[i] = s
	}
	return out
}

// Reset implements OpTimer.
func (t *cudaTimer) Reset() { t.n = 0 }
