package train

import (
	"fmt"
	"math"
	"sync/atomic"
	"time"
)

// Clock is where a run stands in time: the step being trained and since when, how long steps
// and saves take, and the time limit (--time-limit). The loop writes it; the signal handler
// reads it from another goroutine to say how long the step it waits for has run and is
// expected to run, and the ranks read it to stop before the limit.
type Clock struct {
	started time.Time     // when the process began (the limit counts from here)
	limit   time.Duration // 0: none
	step    atomic.Int64  // the step being trained, or just trained
	began   atomic.Int64  // unix nanoseconds when that step began; 0 when none runs
	saving  atomic.Int64  // the step whose checkpoint is being saved; 0 when none is
	stepNS  atomic.Int64  // a step's expected duration: the mean of this session's steps but its first, in nanoseconds (0: none done)
	saveNS  atomic.Int64  // a save's expected duration: the longest so far (nanoseconds), else a guess from its size
	limited atomic.Bool   // the time limit asked to stop
	last    atomic.Int64  // the step of the newest complete checkpoint; 0: none
	steps   int64         // steps timed (written by the loop only)
	sumNS   int64         // their summed duration but the first's
}

// NewClock returns a clock started now with a time limit (0: none).
func NewClock(limit time.Duration) *Clock {
	return &Clock{started: time.Now(), limit: limit}
}

// begin records that step (1-based) starts now.
func (c *Clock) begin(step int) {
	c.step.Store(int64(step))
	c.began.Store(time.Now().UnixNano())
}

// end records that the step begun last has ended. The first step of a session (it pays for
// warming up: allocation, the first touch of every page) is the expected duration only until a
// second one ends.
func (c *Clock) end() {
	d := time.Now().UnixNano() - c.began.Load()
	c.began.Store(0)
	c.steps++
	if c.steps > 1 {
		c.sumNS += d
		c.stepNS.Store(c.sumNS / (c.steps - 1))
	} else {
		c.stepNS.Store(d)
	}
}

// saved records that the checkpoint of step is complete, after d.
func (c *Clock) saved(step int, d time.Duration) {
	c.last.Store(int64(step))
	if int64(d) > c.saveNS.Load() {
		c.saveNS.Store(int64(d))
	}
}

// guessSave sets the expected duration of a save before one has happened: the state's bytes
// at 100 MB/s (checkpoints here compress fp32 at 200–300 MB/s).
func (c *Clock) guessSave(bytes int64) {
	if c.saveNS.Load() == 0 {
		c.saveNS.Store(int64(float64(bytes) / 100e6 * 1e9))
	}
}

// overLimit reports, at the end of a step, whether the next step and a save would end past the
// time limit; it remembers that it said so.
func (c *Clock) overLimit() bool {
	if c.limit <= 0 {
		return false
	}
	next := time.Duration(c.stepNS.Load())
	if c.began.Load() != 0 && next == 0 { // the first step is ending: it is the best guess of the next
		next = time.Since(time.Unix(0, c.began.Load()))
	}
	if time.Since(c.started)+next+time.Duration(c.saveNS.Load()) > c.limit {
		c.limited.Store(true)
		return true
	}
	return false
}

// StopMessage is what a first stop request (Ctrl-C, SIGTERM) says: the step it waits for, how
// long that step has run and how long a step takes, or the checkpoint being saved, which may
// not complete (a second request, or under MPI a rank lost: mpirun's SIGTERM to the others
// comes as one), and what is `latest` until it does.
func (c *Clock) StopMessage() string {
	if s := c.saving.Load(); s > 0 {
		return fmt.Sprintf("stopping when the checkpoint of step %d, now being saved, is complete (Ctrl-C again to stop now); until it is, or if it cannot be (stopped now, a rank lost), %s", s, c.latest())
	}
	step, b := c.step.Load(), c.began.Load()
	var ran string
	switch mean := time.Duration(c.stepNS.Load()); {
	case b == 0:
	case mean > 0:
		ran = fmt.Sprintf(" (it has run %s; a step takes about %s)", Duration(time.Since(time.Unix(0, b))), Duration(mean))
	default:
		ran = fmt.Sprintf(" (it has run %s; it is the first, how long one takes is not known yet)", Duration(time.Since(time.Unix(0, b))))
	}
	latest := "no checkpoint is saved yet"
	if l := c.last.Load(); l > 0 {
		latest = fmt.Sprintf("the newest checkpoint is step %d", l)
	}
	return fmt.Sprintf("stopping after step %d%s and saving; until that save completes, %s (Ctrl-C again to stop now)", step, ran, latest)
}

// latest says which checkpoint is `latest` while none is being completed: the newest
// complete one (resumed from or saved), or that there is none.
func (c *Clock) latest() string {
	if l := c.last.Load(); l > 0 {
		return fmt.Sprintf("the checkpoint of step %d stays `latest`", l)
	}
	return "no checkpoint exists"
}

// NowMessage is what a second stop request says, ending the process at once: the step, or
// the save, it stopped in without completing, and the checkpoint that stays `latest`, if any.
func (c *Clock) NowMessage() string {
	latest := c.latest()
	switch s, step := c.saving.Load(), c.step.Load(); {
	case s > 0:
		return fmt.Sprintf("stopped at once during the save of step %d's checkpoint, which is not complete; %s", s, latest)
	case c.began.Load() != 0:
		return fmt.Sprintf("stopped at once during step %d, without saving; %s", step, latest)
	default: // between steps: evaluating, writing the metrics
		return fmt.Sprintf("stopped at once after step %d, without saving it; %s", step, latest)
	}
}

// Duration writes d for people: "850ms", "42s", "3m05s", "2h07m", "3d04h".
func Duration(d time.Duration) string {
	switch s := d.Seconds(); {
	case s < 1:
		return fmt.Sprintf("%dms", d.Milliseconds())
	case s < 60:
		return fmt.Sprintf("%.0fs", s)
	case s < 3600:
		m := int(s) / 60
		return fmt.Sprintf("%dm%02ds", m, int(s)-60*m)
	case s < 86400:
		h := int(s) / 3600
		return fmt.Sprintf("%dh%02dm", h, (int(s)-3600*h)/60)
	case s < math.MaxInt32:
		dd := int(s) / 86400
		return fmt.Sprintf("%dd%02dh", dd, (int(s)-86400*dd)/3600)
	}
	return "a very long time"
}
