package train

import "testing"

// TestParseProfileSteps: FIRST..LAST with 1 <= FIRST <= LAST, and nothing else.
func TestParseProfileSteps(t *testing.T) {
	if got, err := ParseProfileSteps("3..7"); err != nil || got != [2]int{3, 7} {
		t.Errorf("3..7: %v, %v", got, err)
	}
	if got, err := ParseProfileSteps("5..5"); err != nil || got != [2]int{5, 5} {
		t.Errorf("5..5: %v, %v", got, err)
	}
	for _, bad := range []string{"", "3", "7..3", "0..2", "a..b", "3..", "..7", "-1..2"} {
		if _, err := ParseProfileSteps(bad); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}
