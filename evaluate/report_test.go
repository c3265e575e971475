package evaluate

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestReportNonFinite: a report whose loss is not a number is written (null for each result
// that is not finite, named in non_finite) instead of failing to encode, and reads back; a
// finite one is written as the plain struct would be.
func TestReportNonFinite(t *testing.T) {
	dir := t.TempDir()
	rep := Report{Result: Result{Loss: math.NaN(), Perplexity: math.NaN(), BitsPerByte: math.Inf(1), Tokens: 7}, Model: "m"}
	path := filepath.Join(dir, "r.json")
	if err := WriteReport(path, rep); err != nil {
		t.Fatalf("a NaN loss: %v", err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	if m["loss"] != nil || m["perplexity"] != nil || m["bits_per_byte"] != nil || m["tokens"] != 7.0 || m["model"] != "m" {
		t.Errorf("written: %s", b)
	}
	if nf, _ := m["non_finite"].([]any); len(nf) != 3 {
		t.Errorf("non_finite: %v", m["non_finite"])
	}
	var back Report
	if err := json.Unmarshal(b, &back); err != nil || back.Tokens != 7 {
		t.Errorf("read back: %+v, %v", back, err)
	}
	fine := Report{Result: Result{Loss: 2.5, Perplexity: math.Exp(2.5), Tokens: 7}, Model: "m"}
	type plain Report
	want, _ := json.Marshal(plain(fine))
	got, err := json.Marshal(fine)
	if err != nil || string(got) != string(want) || strings.Contains(string(got), "non_finite") {
		t.Errorf("a finite report: %s, want %s (%v)", got, want, err)
	}
}
