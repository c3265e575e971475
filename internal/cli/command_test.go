package cli

import (
	"flag"
	"io"
	"strings"
	"testing"
	"time"
)

// TestCheckRanges: a flag given outside its range is refused naming it, its value and what is
// wanted, and what leaving it out gives; a flag left out is not checked; a fraction may be 1
// but not above; a count is at least 1.
func TestCheckRanges(t *testing.T) {
	ranges := []Range{{Flag: "mem", Want: "bytes", Min: 1e6}, {Flag: "frac", Want: "a fraction", Max: 1},
		{Flag: "n", Want: "at least 1", Default: "n of the config"}}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, ""}, {[]string{"-mem", "2e6"}, ""}, {[]string{"-frac", "1"}, ""},
		{[]string{"-mem", "0"}, "test: --mem 0: want bytes (above 1e+06); leave the flag out for the default"},
		{[]string{"-frac", "1.5"}, "--frac 1.5: want a fraction"}, {[]string{"-frac", "0"}, "--frac 0"},
		{[]string{"-mem", "+Inf"}, "--mem +Inf"}, {[]string{"-n", "1"}, ""},
		{[]string{"-n", "0"}, "test: --n 0: want at least 1; leave the flag out for n of the config"},
	} {
		fs := flag.NewFlagSet("test", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		fs.Float64("mem", 0, "")
		fs.Float64("frac", 0, "")
		fs.Int("n", 0, "")
		if err := fs.Parse(tc.args); err != nil {
			t.Fatal(err)
		}
		err := CheckRanges(fs, "the default", ranges)
		if (tc.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("%q: %v, want %q", tc.args, err, tc.want)
		}
	}
}

// TestRank0Only: under an MPI launch a rank above 0 leaves a command that is not EveryRank to
// rank 0 (a command of a group too), runs one that is, and rank 0 runs every one; an unknown
// name is left to the usual error.
func TestRank0Only(t *testing.T) {
	root := &Command{Name: "p", Subs: []Command{{Name: "train", EveryRank: true}, {Name: "plan"}, {Name: "data", Subs: []Command{{Name: "tokenize"}}}}}
	for _, tc := range []struct {
		args []string
		rank int
		want bool
	}{
		{[]string{"plan"}, 1, true}, {[]string{"data", "tokenize"}, 3, true}, {[]string{"train"}, 1, false},
		{[]string{"plan"}, 0, false}, {[]string{"bogus"}, 1, false}, {nil, 1, false},
	} {
		if got := root.Rank0Only(tc.args, tc.rank); got != tc.want {
			t.Errorf("%q on rank %d: %v, want %v", tc.args, tc.rank, got, tc.want)
		}
	}
}

// TestDuration: a duration flag reads what time.ParseDuration reads, and a number without a
// unit is told that it needs one.
func TestDuration(t *testing.T) {
	for _, c := range []struct {
		in   string
		want time.Duration
		err  string
	}{
		{"3h50m", 3*time.Hour + 50*time.Minute, ""},
		{"90s", 90 * time.Second, ""},
		{"0", 0, ""},
		{"5", 0, "a duration needs a unit: 5m, 3h50m, 90s"},
		{"1.5", 0, "a duration needs a unit"},
		{"5x", 0, "want a duration such as 5m"},
	} {
		var d Duration
		err := d.Set(c.in)
		switch {
		case c.err == "" && (err != nil || time.Duration(d) != c.want):
			t.Errorf("Set(%q) = %v, %v; want %v", c.in, time.Duration(d), err, c.want)
		case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)):
			t.Errorf("Set(%q): error %v, want %q", c.in, err, c.err)
		}
	}
}
