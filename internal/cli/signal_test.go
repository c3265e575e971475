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
	s := &signals{sigs: make(chan os.Signal), events: make(chan string, 8)}
	var h Interrupt
	if stop {
		h.Stop = func() { s.events <- "stop" }
	}
	if exit {
		h.Exit = func() { s.events <- "exit hook" }
	}
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
