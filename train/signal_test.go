package train

import (
	"strings"
	"testing"
	"time"
)

// TestOnSignal: the first stop request names the step it waits for, or the save, the second
// the step or the save it stops in without completing; both name the checkpoint that stays
// `latest`, or say that none exists.
func TestOnSignal(t *testing.T) {
	c := NewClock(0)
	c.begin(7)
	stop, now := OnSignal(c)
	for _, m := range []struct{ got, want string }{
		{stop(), "stopping after step 7 (it has run"}, {stop(), "no checkpoint is saved yet (Ctrl-C again to stop now)"},
		{now(), "stopped at once during step 7, without saving; no checkpoint exists"},
	} {
		if !strings.Contains(m.got, m.want) {
			t.Errorf("during the first step: %q, want %q", m.got, m.want)
		}
	}
	c.end()
	if s := now(); s != "stopped at once after step 7, without saving it; no checkpoint exists" {
		t.Errorf("after the step: %q", s)
	}
	c.saving.Store(7) // the first save
	for _, m := range []struct{ got, want string }{
		{stop(), "stopping when the checkpoint of step 7, now being saved, is complete (Ctrl-C again to stop now); until it is, or if it cannot be (stopped now, a rank lost), no checkpoint exists"},
		{now(), "stopped at once during the save of step 7's checkpoint, which is not complete; no checkpoint exists"},
	} {
		if m.got != m.want {
			t.Errorf("during the first save: %q, want %q", m.got, m.want)
		}
	}
	c.saved(7, time.Second)
	c.saving.Store(0)
	c.begin(8)
	c.end()
	c.saving.Store(8)
	if s := stop(); !strings.HasSuffix(s, "the checkpoint of step 7 stays `latest`") {
		t.Errorf("during the second save: %q", s)
	}
	if s := now(); s != "stopped at once during the save of step 8's checkpoint, which is not complete; the checkpoint of step 7 stays `latest`" {
		t.Errorf("during the second save: %q", s)
	}
}
