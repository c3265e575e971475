package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sync"
	"syscall"
)

// interrupt says what SIGINT and SIGTERM do to a command, for onSignal. The first signal calls
// stop, then cancels the command's context, which asks the command to stop as soon as it
// can; a second one (or the first, when stop is nil) calls exit and ends the process at once
// with exit status 130.
type interrupt struct {
	stop func() // what a first signal says (and does before the context is cancelled)
	exit func() // what is done and said before a signal ends the process
}

// onSignal returns a context that the first SIGINT or SIGTERM cancels, answering the signals
// as h says, and a function that stops listening and cancels the context.
func onSignal(h interrupt) (context.Context, func()) {
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	ctx, stop := h.watch(sigs, os.Exit)
	return ctx, func() {
		signal.Stop(sigs)
		stop()
	}
}

// watch is onSignal with the signals read from sigs and the process ended by exit (the tests
// give their own).
func (h interrupt) watch(sigs <-chan os.Signal, exit func(code int)) (context.Context, func()) {
	ctx, cancel := context.WithCancel(context.Background())
	quit := make(chan struct{})
	go func() {
		for n := 0; ; n++ {
			select {
			case <-sigs:
			case <-quit:
				return
			}
			select {
			case <-quit: // stopped while the signal came
				return
			default:
			}
			if n == 0 && h.stop != nil {
				h.stop()
				cancel()
				continue
			}
			if h.exit != nil {
				h.exit()
			}
			exit(130)
			return
		}
	}()
	var once sync.Once
	return ctx, func() {
		once.Do(func() { close(quit) })
		cancel()
	}
}

// say is a hook that writes msg() on a line of its own to w, when this process speaks (rank 0
// of several); the line starts a new one after a progress bar.
func say(w io.Writer, speak bool, msg func() string) func() {
	return func() {
		if speak {
			fmt.Fprintf(w, "\n%s\n", msg())
		}
	}
}

// stopping is the interrupt of a command that stops where it is when asked (eval, generate,
// data tokenize and fetch): the first signal says so and cancels its work, a second ends it at
// once. left says what a command ended at once leaves behind ("" for nothing).
func stopping(stderr io.Writer, name, left string) interrupt {
	return interrupt{
		stop: say(stderr, true, func() string { return name + ": stopping (Ctrl-C again to stop at once)" }),
		exit: say(stderr, true, func() string { return name + ": stopped at once" + left }),
	}
}
