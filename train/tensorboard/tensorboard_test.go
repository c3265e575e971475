package tensorboard

import (
	"bytes"
	"encoding/hex"
	"hash/crc32"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// fixClock makes Create see t as the current time for the rest of the test.
func fixClock(t *testing.T, at time.Time) {
	t.Helper()
	old := now
	now = func() time.Time { return at }
	t.Cleanup(func() { now = old })
}

func TestCRC32C(t *testing.T) {
	// The CRC-32C check value of "123456789" is 0xE3069283 (RFC 3720, B.4). Its mask, by hand:
	// crc>>15 = 0x0001C60D, crc<<17 = 0x25060000, rotated 0x2507C60D, + 0xA282EAD8 = 0xC78AB0E5.
	if got := crc32.Checksum([]byte("123456789"), castagnoli); got != 0xE3069283 {
		t.Errorf("crc32c(123456789) = %#08x, want 0xe3069283", got)
	}
	tests := []struct {
		crc, want uint32
	}{
		{0, 0xa282ead8},
		{0xE3069283, 0xC78AB0E5},
		{1, 0xa284ead8},          // 1 rotates to 1<<17 = 0x20000
		{0x8000, 0xa282ead9},     // bit 15 rotates to bit 0
		{0xffffffff, 0xa282ead7}, // rotation of all ones, plus the constant, wraps
	}
	for _, tc := range tests {
		if got := mask(tc.crc); got != tc.want {
			t.Errorf("mask(%#08x) = %#08x, want %#08x", tc.crc, got, tc.want)
		}
	}
	if got, want := maskedCRC([]byte("123456789")), uint32(0xC78AB0E5); got != want {
		t.Errorf("maskedCRC(123456789) = %#08x, want %#08x", got, want)
	}
}

// TestGoldenRecord compares the bytes the Writer appends for one step against
// testdata/golden.txt, computed by testdata/golden.py without any Go code.
func TestGoldenRecord(t *testing.T) {
	golden, err := os.ReadFile(filepath.Join("testdata", "golden.txt"))
	if err != nil {
		t.Fatal(err)
	}
	want, err := hex.DecodeString(strings.TrimSpace(string(golden)))
	if err != nil {
		t.Fatal(err)
	}
	// NaN and +Inf are skipped: the golden event holds loss and lr only.
	values := map[string]float64{"lr": 0.001, "loss": 2.5, "bad": math.NaN(), "inf": math.Inf(1)}

	if got := appendRecord(nil, encodeScalarsEvent(42, 1700000000.5, values)); !bytes.Equal(got, want) {
		t.Errorf("record =\n%x\nwant\n%x", got, want)
	}

	w, err := Create(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Scalars(42, time.Unix(1700000000, 500_000_000), values); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	file, err := os.ReadFile(w.Path())
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasSuffix(file, want) {
		t.Errorf("file ends\n%x\nwant\n%x", file[max(0, len(file)-len(want)):], want)
	}
	// What precedes it is the file_version record alone: 12 bytes of header, wall_time
	// (1+8 bytes), file_version (1+1+13 bytes), 4 bytes of CRC.
	if got, want := len(file)-len(want), 12+9+15+4; got != want {
		t.Errorf("file_version record is %d bytes, want %d", got, want)
	}
}

func TestRoundTrip(t *testing.T) {
	start := time.Unix(1700000000, 0)
	fixClock(t, start)
	dir := filepath.Join(t.TempDir(), "run", "tb") // Create makes the parents
	w, err := Create(dir)
	if err != nil {
		t.Fatal(err)
	}
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "localhost"
	}
	if want := filepath.Join(dir, "events.out.tfevents.1700000000."+host); w.Path() != want {
		t.Errorf("Path() = %q, want %q", w.Path(), want)
	}

	steps := []struct {
		step   int64
		wall   time.Time
		values map[string]float64
		want   map[string]float32
	}{
		{0, time.Unix(1700000001, 250_000_000),
			map[string]float64{"train/loss": 10.5, "train/lr": 3e-4},
			map[string]float32{"train/loss": 10.5, "train/lr": 3e-4}},
		{1, time.Unix(1700000002, 0),
			map[string]float64{"train/loss": 9.25, "train/lr": 6e-4, "train/grad_norm": math.NaN(), "zero": 0},
			map[string]float32{"train/loss": 9.25, "train/lr": 6e-4, "zero": 0}},
		{2, time.Unix(1700000003, 500_000_000),
			map[string]float64{"eval/loss": 1.0 / 3, "big": 1e40, "neg": -math.MaxFloat32, "minf": math.Inf(-1)},
			map[string]float32{"eval/loss": float32(1.0 / 3), "neg": -math.MaxFloat32}},
		{1 << 40, time.Unix(1700000004, 0),
			map[string]float64{"a": 1, "b": 2, "c": 3, "ü/ñ": 4},
			map[string]float32{"a": 1, "b": 2, "c": 3, "ü/ñ": 4}},
		{-7, time.Unix(1700000005, 0),
			map[string]float64{"only_nan": math.NaN()},
			map[string]float32{}},
	}
	for _, s := range steps {
		if err := w.Scalars(s.step, s.wall, s.values); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}

	events, err := ReadFile(w.Path())
	if err != nil {
		t.Fatal(err)
	}
	if len(events) != 1+len(steps) {
		t.Fatalf("read %d events, want %d", len(events), 1+len(steps))
	}
	if got, want := events[0], (Event{WallTime: 1700000000, FileVersion: "brain.Event:2"}); !reflect.DeepEqual(got, want) {
		t.Errorf("event 0 = %+v, want %+v", got, want)
	}
	wantWall := []float64{1700000001.25, 1700000002, 1700000003.5, 1700000004, 1700000005}
	for i, s := range steps {
		got := events[i+1]
		want := Event{WallTime: wantWall[i], Step: s.step, Values: s.want}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("event %d = %+v, want %+v", i+1, got, want)
		}
	}
}

func TestWallTimeFraction(t *testing.T) {
	w, err := Create(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	wall := time.Unix(1712345678, 123_456_789)
	if err := w.Scalars(3, wall, map[string]float64{"x": 1}); err != nil {
		t.Fatal(err)
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	events, err := ReadFile(w.Path())
	if err != nil {
		t.Fatal(err)
	}
	if got := events[len(events)-1].WallTime; math.Abs(got-1712345678.123456789) > 1e-6 {
		t.Errorf("wall time = %.9f, want 1712345678.123456789", got)
	}
}

// TestFlush checks that Scalars buffers and Flush writes.
func TestFlush(t *testing.T) {
	w, err := Create(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	count := func() int {
		t.Helper()
		events, err := ReadFile(w.Path())
		if err != nil {
			t.Fatal(err)
		}
		return len(events)
	}
	if got := count(); got != 1 {
		t.Fatalf("after Create: %d events, want 1 (file_version)", got)
	}
	if err := w.Scalars(1, time.Now(), map[string]float64{"x": 1}); err != nil {
		t.Fatal(err)
	}
	if got := count(); got != 1 {
		t.Errorf("after Scalars, before Flush: %d events, want 1", got)
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	if got := count(); got != 2 {
		t.Errorf("after Flush: %d events, want 2", got)
	}
}

// writeSample writes a file of three records (file_version and two steps) and returns its
// path and the byte offsets of the records.
func writeSample(t *testing.T) (string, []int) {
	t.Helper()
	w, err := Create(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	for step := range int64(2) {
		if err := w.Scalars(step+1, time.Unix(1700000000+step, 0), map[string]float64{"loss": 1}); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(w.Path())
	if err != nil {
		t.Fatal(err)
	}
	var offs []int
	for off := 0; off < len(data); {
		offs = append(offs, off)
		n := int(data[off]) // every record here is shorter than 256 bytes
		off += 16 + n
	}
	if len(offs) != 3 {
		t.Fatalf("sample has %d records, want 3", len(offs))
	}
	return w.Path(), offs
}

func TestCorruption(t *testing.T) {
	tests := []struct {
		name string
		// edit changes the file's bytes, given the records' offsets.
		edit func(data []byte, offs []int) []byte
		want string
	}{
		{"data byte flipped", func(d []byte, o []int) []byte { d[o[1]+12+3] ^= 0x01; return d }, "record 1 at byte %d: data CRC"},
		{"data CRC flipped", func(d []byte, o []int) []byte { d[o[2]-1] ^= 0x80; return d }, "record 1 at byte %d: data CRC"},
		{"length byte flipped", func(d []byte, o []int) []byte { d[o[1]] ^= 0x01; return d }, "record 1 at byte %d: length CRC"},
		{"length CRC flipped", func(d []byte, o []int) []byte { d[o[1]+9] ^= 0x10; return d }, "record 1 at byte %d: length CRC"},
		{"truncated mid data", func(d []byte, o []int) []byte { return d[:o[2]+20] }, "record 2 at byte %d: truncated"},
		{"truncated data CRC", func(d []byte, o []int) []byte { return d[:len(d)-2] }, "record 2 at byte %d: truncated"},
		{"truncated mid header", func(d []byte, o []int) []byte { return d[:o[2]+5] }, "record 2 at byte %d: truncated header"},
		{"trailing garbage", func(d []byte, o []int) []byte { return append(d, 1, 2, 3) }, "record 3 at byte %d: truncated header"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			path, offs := writeSample(t)
			data, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := ReadFile(path); err != nil {
				t.Fatalf("intact file: %v", err)
			}
			idx := int(tc.want[len("record ")] - '0')
			off := len(data)
			if idx < len(offs) {
				off = offs[idx]
			}
			if err := os.WriteFile(path, tc.edit(data, offs), 0o644); err != nil {
				t.Fatal(err)
			}
			events, err := ReadFile(path)
			if err == nil {
				t.Fatalf("ReadFile of a damaged file read %d events, want an error", len(events))
			}
			want := strings.Replace(tc.want, "%d", strconv.Itoa(off), 1)
			if !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), path) {
				t.Errorf("error %q, want it to name %q and contain %q", err, path, want)
			}
		})
	}
}

func TestReadFileMissing(t *testing.T) {
	path := filepath.Join(t.TempDir(), "nope")
	if _, err := ReadFile(path); err == nil || !strings.Contains(err.Error(), path) {
		t.Errorf("ReadFile(missing) error = %v, want one naming %s", err, path)
	}
}

// TestNameCollision creates writers in the same second: each gets its own file and no file
// is overwritten.
func TestNameCollision(t *testing.T) {
	fixClock(t, time.Unix(1700000000, 0))
	dir := t.TempDir()
	first, err := Create(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := first.Scalars(5, time.Unix(1700000000, 0), map[string]float64{"first": 1}); err != nil {
		t.Fatal(err)
	}
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	before, err := os.ReadFile(first.Path())
	if err != nil {
		t.Fatal(err)
	}

	paths := []string{first.Path()}
	for range 2 {
		w, err := Create(dir)
		if err != nil {
			t.Fatal(err)
		}
		paths = append(paths, w.Path())
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
	}
	for i, want := range []string{first.Path(), first.Path() + ".1", first.Path() + ".2"} {
		if paths[i] != want {
			t.Errorf("writer %d path = %q, want %q", i, paths[i], want)
		}
	}
	if !regexp.MustCompile(`^events\.out\.tfevents\.1700000000\.[^/]+$`).MatchString(filepath.Base(first.Path())) {
		t.Errorf("file name %q, want events.out.tfevents.1700000000.<host>", filepath.Base(first.Path()))
	}
	after, err := os.ReadFile(first.Path())
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(before, after) {
		t.Errorf("first file changed by later writers: %d bytes, was %d", len(after), len(before))
	}
	events, err := ReadFile(first.Path())
	if err != nil {
		t.Fatal(err)
	}
	if len(events) != 2 || events[1].Step != 5 || events[1].Values["first"] != 1 {
		t.Errorf("first file holds %+v, want file_version and step 5", events)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 3 {
		t.Errorf("%d files in dir, want 3", len(entries))
	}
}
