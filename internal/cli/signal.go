package cli

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sync"
	"syscall"

	"distflash/parallel/transport"
)

// Interrupt says what SIGINT and SIGTERM do to a command, for OnSignal. The first signal calls
// Stop, then cancels the command's context, which asks the command to stop as soon as it
// can; a second one (or the first, when Stop is nil) calls Exit and ends the process at once
// with exit status 130.
type Interrupt struct {
	Stop func() // what a first signal says (and does before the context is cancelled)
	Exit func() // what is done and said before a signal ends the process
	// Guard, when set, orders the signals with the command's steps that change its output
	// (Guard.Do): a signal that would end the process waits for a step under way, and once
	// the commit has run it is ignored (Late says so) and the command runs to its end.
	Guard *Guard
	Late  func() // what a signal after the commit says
}

// Guard makes a command's commit point single for its signal hook, for a command whose Exit
// removes its partial output (export: a temporary directory renamed into place when whole).
// The steps that change what is on disk (making the temporary directory, renaming it) run
// through Do; a signal is answered between two steps, never during one. Before the commit it
// ends the process (Exit, status 130) and no step runs after it; from the commit on, SIGINT
// and SIGTERM are ignored and the command ends as it would have.
type Guard struct {
	mu        sync.Mutex
	committed bool
	ignore    func() // what the commit does to later signals (OnSignal: ignores them)
}

// Do runs step with no signal answered during it. commit says that step is the commit: once
// it returns nil, the output is whole.
func (g *Guard) Do(commit bool, step func() error) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	err := step()
	if commit && err == nil {
		g.committed = true
		if g.ignore != nil {
			g.ignore()
		}
	}
	return err
}

// OnSignal returns a context that the first SIGINT or SIGTERM cancels, answering the signals
// as h says, and a function that stops listening and cancels the context. The command is done
// with what a signal could interrupt when it calls that function: the signals that come after
// it, while the process ends, are ignored (not left to end it by their default action, which
// would say nothing and hide the command's own ending).
func OnSignal(h Interrupt) (context.Context, func()) {
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	if h.Guard != nil {
		h.Guard.ignore = func() { signal.Ignore(os.Interrupt, syscall.SIGTERM) }
	}
	ctx, stop := h.watch(sigs, os.Exit)
	return ctx, func() {
		signal.Ignore(os.Interrupt, syscall.SIGTERM)
		signal.Stop(sigs)
		stop()
	}
}

// watch is OnSignal with the signals read from sigs and the process ended by exit (the tests
// give their own). A signal is answered under mu, which the returned stop takes too: a
// command that stops listening while a signal is ending it waits for the end (exit status
// 130), so that it cannot end first with an error its signal hook caused or a success it
// did not have.
func (h Interrupt) watch(sigs <-chan os.Signal, exit func(code int)) (context.Context, func()) {
	ctx, cancel := context.WithCancel(context.Background())
	quit := make(chan struct{})
	var mu sync.Mutex
	answer := func(n int) (more bool) {
		mu.Lock()
		defer mu.Unlock()
		select {
		case <-quit: // stopped while the signal came
			return false
		default:
		}
		if n == 0 && h.Stop != nil {
			h.Stop()
			cancel()
			return true
		}
		if g := h.Guard; g != nil {
			g.mu.Lock() // after a step under way; held to the end, so none follows
			defer g.mu.Unlock()
			if g.committed {
				if h.Late != nil {
					h.Late()
				}
				return true
			}
		}
		if h.Exit != nil {
			h.Exit()
		}
		exit(130)
		return false
	}
	go func() {
		for n := 0; ; n++ {
			select {
			case <-sigs:
			case <-quit:
				return
			}
			if !answer(n) {
				return
			}
		}
	}()
	var once sync.Once
	return ctx, func() {
		mu.Lock()
		once.Do(func() { close(quit) })
		mu.Unlock()
		cancel()
	}
}

// Say is a hook that writes msg() on a line of its own to w, when this process speaks (rank 0
// of several); the line starts a new one after a progress bar.
func Say(w io.Writer, speak bool, msg func() string) func() {
	return func() {
		if speak {
			fmt.Fprintf(w, "\n%s\n", msg())
		}
	}
}

// Stopping is the Interrupt of a command that stops where it is when asked (eval, generate,
// data tokenize and fetch): the first signal says so and cancels its work, a second ends it at
// once. left says what a command ended at once leaves behind ("" for nothing). Its Stop says
// it once however often it is called: a command whose ranks agree to stop (eval under an MPI
// launcher) calls it when another rank's signal stopped it before this process's own came,
// which then finds the command done and says nothing.
func Stopping(stderr io.Writer, name, left string) Interrupt {
	leader := true // under an MPI launcher the signal reaches every rank: rank 0 says it
	if l, _ := transport.MPIEnv(); l != nil && l.Rank > 0 {
		leader = false
	}
	var once sync.Once
	say := Say(stderr, leader, func() string { return name + ": stopping (Ctrl-C again to stop at once)" })
	return Interrupt{
		Stop: func() { once.Do(say) },
		Exit: Say(stderr, leader, func() string { return name + ": stopped at once" + left }),
	}
}

// OnSuccess runs close (a command's world's end: its communicators, then MPI_Finalize) when
// the command went well (*err nil), setting *err to what it gives; after a failure it does
// nothing, since the program then ends the whole job (MPI_Abort) instead of waiting in
// MPI_Finalize for ranks that may never come. Deferred by a command with a named error.
func OnSuccess(close func() error, err *error) {
	if *err == nil {
		*err = close()
	}
}
