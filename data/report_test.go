package data

import (
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestTokenizeProgressRead: a tokenize reads up to the files' bytes, or up to MaxBytes of text
// when that ends the read first.
func TestTokenizeProgressRead(t *testing.T) {
	p := TokenizeProgress{InputBytes: 300, InputTotal: 1000, TextBytes: 200}
	for _, tt := range []struct {
		maxBytes, done, total int64
	}{{0, 300, 1000}, {2000, 300, 1000}, {500, 200, 500}} {
		if done, total := p.Read(tt.maxBytes); done != tt.done || total != tt.total {
			t.Errorf("max %d: %d of %d, want %d of %d", tt.maxBytes, done, total, tt.done, tt.total)
		}
	}
}

// TestFetchLog: a fetch's log has a line for a retry, a file complete already and a file
// downloaded (with what was resumed), none for bytes arriving, and counts the bytes downloaded.
func TestFetchLog(t *testing.T) {
	var l FetchLog
	reset := errors.New("connection reset")
	for i, s := range []struct {
		file int
		p    FetchProgress
		want []string // in the line; none: no line
	}{
		{0, FetchProgress{Skipped: true, Final: true, Done: 2e6, Total: 2e6}, []string{"[1/3] c4-0: complete already (2.0 MB)"}},
		{1, FetchProgress{Done: 1e6, Total: -1, Resumed: 1e6}, nil},
		{1, FetchProgress{Done: 2e6, Total: 5e6, Resumed: 1e6, Retry: 1, Retries: 5, Wait: time.Second, Err: reset}, []string{"[2/3] c4-1: connection reset; retry 1 of 5 in 1s"}},
		{1, FetchProgress{Done: 5e6, Total: 5e6, Resumed: 1e6, Final: true}, []string{"[2/3] c4-1: 5.0 MB in ", ", resumed after 1.0 MB)"}},
		{2, FetchProgress{Done: 3e6, Total: 3e6, Final: true}, []string{"[3/3] c4-2: 3.0 MB in ", " MB/s)"}},
	} {
		s.p.File, s.p.Index, s.p.Count = "/d/c4-"+strconv.Itoa(s.file), s.file, 3
		got := l.Line(s.p)
		if (got == "") != (s.want == nil) {
			t.Errorf("report %d: %q, want %q", i, got, s.want)
		}
		for _, w := range s.want {
			if !strings.Contains(got, w) {
				t.Errorf("report %d: %q, want %q in it", i, got, w)
			}
		}
	}
	if l.Downloaded != 4e6+3e6 {
		t.Errorf("downloaded %d, want 7e6 (the resumed 1e6 not counted)", l.Downloaded)
	}
}
