package cli

import (
	"bytes"
	"context"
	"errors"
	"os"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// signals drives Interrupt.watch with a signal channel and an exit of its own: what the
// hooks did, in order, and the exit status.
type signals struct {
	sigs   chan os.Signal
	events chan string
	ctx    context.Context
	stop   func()
}

func watch(stop, exit bool) *signals {
	var h Interrupt
	if stop {
		h.Stop = func() {}
	}
	if exit {
		h.Exit = func() {}
	}
	return watchHooks(h)
}

// watchHooks watches with h's hooks (each set one also an event: "stop", "exit hook", "late").
func watchHooks(h Interrupt) *signals {
	s := &signals{sigs: make(chan os.Signal), events: make(chan string, 8)}
	event := func(f func(), e string) func() {
		if f == nil {
			return nil
		}
		return func() { f(); s.events <- e }
	}
	h.Stop, h.Exit, h.Late = event(h.Stop, "stop"), event(h.Exit, "exit hook"), event(h.Late, "late")
	s.ctx, s.stop = h.watch(s.sigs, func(code int) { s.events <- "exit " + strconv.Itoa(code) })
	return s
}

// next is the next thing the hooks did ("" when nothing happens for a while).
func (s *signals) next() string {
	select {
	case e := <-s.events:
		return e
	case <-time.After(200 * time.Millisecond):
		return ""
	}
}

// TestSignal: the first signal runs the stop hook and then cancels the context; a second
// runs the exit hook and exits with status 130. Without a stop hook the first signal exits
// (export). After stop, signals do nothing and the context is cancelled.
func TestSignal(t *testing.T) {
	s := watch(true, true)
	if s.ctx.Err() != nil {
		t.Fatal("cancelled before a signal")
	}
	s.sigs <- syscall.SIGINT
	if e := s.next(); e != "stop" {
		t.Fatalf("first signal: %q, want the stop hook", e)
	}
	select {
	case <-s.ctx.Done():
	case <-time.After(time.Second):
		t.Fatal("the first signal did not cancel the context")
	}
	if e := s.next(); e != "" {
		t.Fatalf("after the first signal: %q", e)
	}
	s.sigs <- syscall.SIGTERM
	if a, b := s.next(), s.next(); a != "exit hook" || b != "exit 130" {
		t.Fatalf("second signal: %q, %q; want the exit hook, then exit 130", a, b)
	}
	s.stop()

	s = watch(false, true)
	s.sigs <- syscall.SIGTERM
	if a, b := s.next(), s.next(); a != "exit hook" || b != "exit 130" {
		t.Fatalf("first signal without a stop hook: %q, %q; want the exit hook, then exit 130", a, b)
	}
	s.stop()

	s = watch(true, true)
	s.stop()
	s.stop() // twice is harmless
	select {
	case s.sigs <- syscall.SIGINT:
	case <-time.After(50 * time.Millisecond):
	}
	if e := s.next(); e != "" {
		t.Errorf("a signal after stop: %q", e)
	}
	if s.ctx.Err() == nil {
		t.Error("stop did not cancel the context")
	}
}

// TestSignalGuard: a signal that comes during a guarded step (export making its temporary
// directory, or renaming it into place) is answered after it; before the commit it ends the
// command (exit hook, 130), after the commit it is said to be late and the command goes on;
// a commit that failed is none.
func TestSignalGuard(t *testing.T) {
	g := &Guard{}
	s := watchHooks(Interrupt{Guard: g, Exit: func() {}, Late: func() {}})
	release, stepped := make(chan struct{}), make(chan error)
	go func() {
		stepped <- g.Do(false, func() error { s.events <- "step"; <-release; return nil })
	}()
	if e := s.next(); e != "step" {
		t.Fatalf("%q, want the step", e)
	}
	go func() { s.sigs <- syscall.SIGINT }()
	if e := s.next(); e != "" {
		t.Fatalf("a signal during a step: %q before the step ended", e)
	}
	close(release)
	if err := <-stepped; err != nil {
		t.Fatal(err)
	}
	if a, b := s.next(), s.next(); a != "exit hook" || b != "exit 130" {
		t.Fatalf("after the step: %q, %q; want the exit hook, then exit 130", a, b)
	}
	s.stop()

	g = &Guard{}
	s = watchHooks(Interrupt{Guard: g, Exit: func() {}, Late: func() {}})
	if err := g.Do(true, func() error { return errors.New("rename") }); err == nil || err.Error() != "rename" {
		t.Fatalf("a failed commit: %v", err)
	}
	s.sigs <- syscall.SIGTERM
	if a, b := s.next(), s.next(); a != "exit hook" || b != "exit 130" {
		t.Fatalf("after a failed commit: %q, %q; want the exit hook, then exit 130", a, b)
	}
	s.stop()

	g = &Guard{}
	s = watchHooks(Interrupt{Guard: g, Exit: func() {}, Late: func() {}})
	if err := g.Do(true, func() error { return nil }); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		s.sigs <- syscall.SIGINT
		if a, b := s.next(), s.next(); a != "late" || b != "" {
			t.Fatalf("a signal after the commit: %q, %q; want it said to be late, and no exit", a, b)
		}
	}
	s.stop()
}

// TestStopWaitsForAnExit: a command that stops listening while a signal is ending it waits
// for the end, so that it cannot end first, with an error its exit hook caused (export's
// removed directory) or a success it did not have.
func TestStopWaitsForAnExit(t *testing.T) {
	entered, release := make(chan struct{}), make(chan struct{})
	s := watchHooks(Interrupt{Exit: func() { close(entered); <-release }})
	s.sigs <- syscall.SIGINT
	<-entered
	stopped := make(chan struct{})
	go func() { s.stop(); close(stopped) }()
	select {
	case <-stopped:
		t.Fatal("stop returned while the exit hook ran")
	case <-time.After(100 * time.Millisecond):
	}
	close(release)
	if a, b := s.next(), s.next(); a != "exit hook" || b != "exit 130" {
		t.Fatalf("%q, %q; want the exit hook, then exit 130", a, b)
	}
	<-stopped
}

// TestSignalMessages: a command that stops says so on the first signal and that it stopped
// at once on the second, with what it leaves; say speaks only for the process that speaks.
func TestSignalMessages(t *testing.T) {
	var buf bytes.Buffer
	h := Stopping(&buf, "data fetch", "; the next data fetch resumes it")
	h.Stop()
	h.Exit()
	want := "\ndata fetch: stopping (Ctrl-C again to stop at once)\n\ndata fetch: stopped at once; the next data fetch resumes it\n"
	if buf.String() != want {
		t.Errorf("got %q, want %q", buf.String(), want)
	}
	buf.Reset()
	Say(&buf, false, func() string { return "rank 1" })()
	if buf.Len() != 0 {
		t.Errorf("a rank that does not speak said %q", buf.String())
	}
}

// TestOnSuccess: a command that went well closes its world and reports what that gives; one
// that failed leaves it (the program ends the job).
func TestOnSuccess(t *testing.T) {
	closed := 0
	closeErr := errors.New("finalize")
	run := func(fail bool) (err error) {
		defer OnSuccess(func() error { closed++; return closeErr }, &err)
		if fail {
			return errors.New("refused")
		}
		return nil
	}
	if err := run(false); err != closeErr || closed != 1 {
		t.Errorf("success: %v, closed %d times", err, closed)
	}
	if err := run(true); err == nil || err.Error() != "refused" || closed != 1 {
		t.Errorf("failure: %v, closed %d times", err, closed)
	}
}
