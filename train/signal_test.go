package train

import (
	"strings"
	"testing"
)

// TestOnSignal: the first stop request names the step it waits for, the second the step it
// stops in without saving.
func TestOnSignal(t *testing.T) {
	c := NewClock(0)
	c.begin(7)
	stop, now := OnSignal(c)
	if s := stop(); !strings.Contains(s, "stopping after step 7") || !strings.Contains(s, "Ctrl-C again to stop now") {
		t.Errorf("first: %q", s)
	}
	if s := now(); !strings.Contains(s, "stopped at once during step 7, without saving") {
		t.Errorf("second: %q", s)
	}
}
