package evaluate

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"distflash/data"
)

// TestPlotReports: reports with the loss by position read back and draw; one without it is
// refused by name; a passkey result draws as two panels.
func TestPlotReports(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, r Report) string {
		path := filepath.Join(dir, name)
		b, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, b, 0o644); err != nil {
			t.Fatal(err)
		}
		return path
	}
	pos := &PositionResult{Mode: "truncate", Lo: []int{0, 64}, Hi: []int{64, 100}, Loss: []float64{2.5, math.NaN()}, Tokens: []int64{640, 0}}
	with := write("a.eval.json", Report{Model: "runs/a", Data: "d", Scoring: "truncate", Positions: pos, TrainSeqLen: 64})
	without := write("b.eval.json", Report{Model: "runs/b"})
	if _, err := ReadPositionReports([]string{with, without}); err == nil || !strings.Contains(err.Error(), without+" has no loss by position") {
		t.Errorf("a report without positions: %v", err)
	}
	reports, err := ReadPositionReports([]string{with})
	if err != nil || len(reports) != 1 || reports[0].Model != "runs/a" || !math.IsNaN(reports[0].Positions.Loss[1]) {
		t.Fatalf("%v %+v", err, reports)
	}
	for _, tc := range []struct {
		names []string
		want  string // in the legend
	}{{nil, "runs/a"}, {[]string{"model a"}, "model a"}} {
		out := filepath.Join(dir, "pos.svg")
		if err := PlotPositions(out, reports, tc.names); err != nil {
			t.Fatal(err)
		}
		if b, _ := os.ReadFile(out); !strings.Contains(string(b), tc.want) {
			t.Errorf("names %v: the legend lacks %q", tc.names, tc.want)
		}
	}
	r := PasskeyResult{Lengths: []int{1024, 2048}, Depths: []float64{0.5}, Trials: 2,
		Generated: PasskeyScore{Correct: [][]int{{2}, {1}}, Trials: [][]int{{2}, {2}}, Accuracy: []float64{1, 0.5}},
		Forced:    PasskeyScore{Correct: [][]int{{2}, {2}}, Trials: [][]int{{2}, {2}}, Accuracy: []float64{1, 1}}}
	out := filepath.Join(dir, "passkey.svg")
	if err := PlotPasskey(out, "passkey", r); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(out); !strings.Contains(string(b), "teacher-forced") || !strings.Contains(string(b), "generated (greedy)") {
		t.Errorf("the passkey picture lacks its panels")
	}
}

// TestWritePasskeyDocuments: n documents a line as jsonl, each ending in its answer; an
// existing file is refused.
func TestWritePasskeyDocuments(t *testing.T) {
	path := filepath.Join(t.TempDir(), "pk.jsonl")
	if err := WritePasskeyDocuments(path, 3, 400, 800, 1); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(string(raw), "\n"), "\n")
	if len(lines) != 3 {
		t.Fatalf("%d lines", len(lines))
	}
	for _, l := range lines {
		var d struct{ Text string }
		if err := json.Unmarshal([]byte(l), &d); err != nil || len(d.Text) < 400 || len(d.Text) > 800 || !strings.HasSuffix(d.Text, ".") {
			t.Errorf("%v: %q", err, l)
		}
	}
	if err := WritePasskeyDocuments(path, 3, 400, 800, 1); err == nil || !strings.Contains(err.Error(), "exists") {
		t.Errorf("over an existing file: %v", err)
	}
	// As Parquet (more rows than a row group): the same documents, read back by data.format
	// "parquet" as by "jsonl".
	const n = data.ParquetRowGroup + 7
	pq, js := filepath.Join(t.TempDir(), "pk.parquet"), filepath.Join(t.TempDir(), "pk.jsonl")
	for _, p := range []string{pq, js} {
		if err := WritePasskeyDocuments(p, n, 300, 400, 2); err != nil {
			t.Fatal(err)
		}
	}
	a, err := data.ReadDocuments(data.Source{Path: pq, Format: "parquet"}, 0)
	if err != nil {
		t.Fatal(err)
	}
	b, err := data.ReadDocuments(data.Source{Path: js, Format: "jsonl"}, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(a) != n || !reflect.DeepEqual(a, b) {
		t.Errorf("Parquet gives %d documents, jsonl %d; equal: %v", len(a), len(b), reflect.DeepEqual(a, b))
	}
}
