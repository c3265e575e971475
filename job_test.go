package main

import (
	"testing"

	"distflash/parallel/transport"
)

// TestSayPosted: rank 0 says each posted text once, after the ranks that posted it in rank
// order (10 after 9, not after 1), in the order the texts first arrived.
func TestSayPosted(t *testing.T) {
	got := sayPosted([]transport.BoardMessage{{Rank: 10, Text: "a"}, {Rank: 3, Text: "b"}, {Rank: 9, Text: "a"}, {Rank: 1, Text: "a"}})
	want := "distflash: ranks 1, 9, 10: a\ndistflash: rank 3: b\n"
	if got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}
