package transport

import (
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// NCCLOptions are the NCCL communicator's settings.
type NCCLOptions struct {
	// Timeout bounds a hang: a communicator whose stream has had operations pending, with
	// nothing new issued on it, for longer than Timeout has stopped (a rank died or is stuck,
	// a link is down, or the ranks disagree on the order of their calls), and so has one whose
	// NCCL reports an asynchronous error. The watchdog then says which, with the
	// communicator's last operation, aborts every communicator (ncclCommAbort) and ends the
	// job (AbortMPI). 0 turns the watchdog off.
	Timeout time.Duration
	// Every is how often the watchdog looks (0: Timeout/20, at most a second).
	Every time.Duration
	// OnHang, when set (tests), receives the report instead of the job ending; the
	// communicators are aborted either way.
	OnHang func(report string)
}

// DefaultNCCLTimeout is NCCLOptions.Timeout when DISTFLASH_NCCL_TIMEOUT is not set: far longer
// than any transfer of a healthy step, far shorter than a lost allocation.
const DefaultNCCLTimeout = 10 * time.Minute

// NCCLOptionsFromEnv reads NCCLOptions from DISTFLASH_NCCL_TIMEOUT (a Go duration such as 90s
// or 10m; 0 waits forever; default DefaultNCCLTimeout), naming the variable when its value is
// not one.
func NCCLOptionsFromEnv() (NCCLOptions, error) { return ncclOptionsFrom(os.Getenv) }

func ncclOptionsFrom(getenv func(string) string) (NCCLOptions, error) {
	d, err := timeoutEnv(getenv, "DISTFLASH_NCCL_TIMEOUT", DefaultNCCLTimeout)
	return NCCLOptions{Timeout: d}, err
}

// every is the watchdog's period.
func (o NCCLOptions) every() time.Duration {
	if o.Every > 0 {
		return o.Every
	}
	return min(o.Timeout/20, time.Second)
}

// ncclShared is what a communicator shares with its splits: the byte counts, and the
// communicators the watchdog looks after.
type ncclShared struct {
	ctr  *counter
	rank int // this rank in the world, for reports
	opt  NCCLOptions
	stop chan struct{} // closed by the world's Close: the watchdog returns
	once sync.Once     // closes stop
	// aborted is set when the watchdog has aborted the communicators
	aborted atomic.Bool

	mu    sync.Mutex
	comms []*ncclComm // live, in the order made
}

func (sh *ncclShared) add(c *ncclComm) {
	sh.mu.Lock()
	sh.comms = append(sh.comms, c)
	sh.mu.Unlock()
}

func (sh *ncclShared) remove(c *ncclComm) {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	for i, x := range sh.comms {
		if x == c {
			sh.comms = append(sh.comms[:i], sh.comms[i+1:]...)
			return
		}
	}
}

// all returns the live communicators, the newest first (splits before what they split).
func (sh *ncclShared) all() []*ncclComm {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	out := make([]*ncclComm, len(sh.comms))
	for i, c := range sh.comms {
		out[len(out)-1-i] = c
	}
	return out
}

// watch is the watchdog: every opt.every() it polls each communicator, and reports the first
// one that has an asynchronous error, or has stayed busy with nothing issued for opt.Timeout.
func (sh *ncclShared) watch(lib NCCLLib) {
	tick := time.NewTicker(sh.opt.every())
	defer tick.Stop()
	type busy struct {
		since  time.Time
		issued int64
	}
	seen := map[*ncclComm]busy{}
	for {
		select {
		case <-sh.stop:
			return
		case <-tick.C:
		}
		for _, c := range sh.all() {
			b, err := lib.NCCLPoll(c.h)
			select {
			case <-sh.stop: // closed meanwhile: the poll may have seen a destroyed communicator
				return
			default:
			}
			if err != nil {
				sh.hang(lib, c, fmt.Sprintf("has failed: %v", err))
				return
			}
			is := c.issued.Load()
			if !b {
				delete(seen, c)
				continue
			}
			if s, ok := seen[c]; !ok || s.issued != is {
				seen[c] = busy{time.Now(), is}
				continue
			}
			if d := time.Since(seen[c].since); d >= sh.opt.Timeout {
				sh.hang(lib, c, fmt.Sprintf("has had operations pending for %v with nothing new issued", d.Round(time.Millisecond)))
				return
			}
		}
	}
}

// hang reports c, aborts every communicator and ends the job (or hands the report to
// opt.OnHang). An abort that does not return within 10 s is left behind.
func (sh *ncclShared) hang(lib NCCLLib, c *ncclComm, what string) {
	last, _ := c.last.Load().(string)
	if last == "" {
		last = "none issued"
	}
	report := fmt.Sprintf("parallel: NCCL on rank %d: %s %s (its last operation: %s); a rank has died or stopped, a link is down, or the ranks disagree on the order of their calls: aborting the job (DISTFLASH_NCCL_TIMEOUT sets the wait, %v now; 0 waits forever)",
		sh.rank, c.name, what, last, sh.opt.Timeout)
	sh.aborted.Store(true)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for _, x := range sh.all() {
			_ = lib.NCCLAbort(x.h)
		}
	}()
	if sh.opt.OnHang != nil {
		<-done
		sh.opt.OnHang(report)
		return
	}
	fmt.Fprintln(os.Stderr, report)
	select {
	case <-done:
	case <-time.After(10 * time.Second):
	}
	AbortMPI(124)
}
