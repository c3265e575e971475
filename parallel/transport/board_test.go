package transport

import (
	"strings"
	"testing"
	"unicode/utf8"
)

// TestBoardMessages: what a rank posts is what rank 0 reads, every byte (UTF-8 included), and a
// message too long for one post is cut at a character boundary, marked with "…".
func TestBoardMessages(t *testing.T) {
	long := strings.Repeat("é", boardValues) // 2 bytes a character: cut in the middle otherwise
	for _, text := range []string{"", "rank 3: config.toml: training.steps = 10 differs", "日本語 ✓", long} {
		got := decodeBoard(encodeBoard(text))
		if len(text) < boardValues && got != text {
			t.Errorf("round trip of %q gave %q", text, got)
		}
		if len(text) >= boardValues {
			if !utf8.ValidString(got) || !strings.HasSuffix(got, "…") || len(got) > boardValues-1 ||
				!strings.HasPrefix(text, strings.TrimSuffix(got, "…")) {
				t.Errorf("cut of a %d-byte message: %d bytes, valid %v, ends %q", len(text), len(got), utf8.ValidString(got), got[len(got)-8:])
			}
		}
	}
	if got := decodeBoard(make([]float32, 3)); got != "" {
		t.Errorf("an empty buffer read as %q", got)
	}
	if got := decodeBoard([]float32{99, 1}); got != "" {
		t.Errorf("a malformed count read as %q", got)
	}
}
