package sysmem

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestMemAvailable(t *testing.T) {
	for _, tt := range []struct {
		file string
		want int64
		ok   bool
	}{
		{"MemTotal:       32768 kB\nMemFree:  1 kB\nMemAvailable:   2048 kB\n", 2048 << 10, true},
		{"MemTotal:       32768 kB\n", 0, false},
		{"MemAvailable:   lots kB\n", 0, false},
		{"MemAvailable:   -5 kB\n", 0, false},
		{"MemAvailable:   99999999999999999999 kB\n", 0, false},
	} {
		path := filepath.Join(t.TempDir(), "meminfo")
		os.WriteFile(path, []byte(tt.file), 0o644)
		got, ok := memAvailable(path)
		if got != tt.want || ok != tt.ok {
			t.Errorf("%q: %d, %v; want %d, %v", tt.file, got, ok, tt.want, tt.ok)
		}
	}
	if _, ok := memAvailable(filepath.Join(t.TempDir(), "absent")); ok {
		t.Error("an absent file gave a number")
	}
}

func TestCgroupRoom(t *testing.T) {
	dir := t.TempDir()
	if _, ok := cgroupRoom(dir); ok {
		t.Error("no cgroup files gave a limit")
	}
	os.WriteFile(filepath.Join(dir, "memory.max"), []byte("max\n"), 0o644)
	if _, ok := cgroupRoom(dir); ok {
		t.Error(`memory.max "max" gave a limit`)
	}
	os.WriteFile(filepath.Join(dir, "memory.max"), []byte("1000\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "memory.current"), []byte("300\n"), 0o644)
	if got, ok := cgroupRoom(dir); got != 700 || !ok {
		t.Errorf("room %d, %v; want 700, true", got, ok)
	}
}

func TestCheck(t *testing.T) {
	if err := check("x", 100, 100, "test"); err != nil {
		t.Errorf("100 bytes of 100 refused: %v", err)
	}
	err := check("the model of config.json", 300<<30, 24<<30, "MemAvailable in /proc/meminfo")
	if err == nil {
		t.Fatal("300 GiB of 24 accepted")
	}
	for _, want := range []string{"the model of config.json", "322122547200 bytes (300.0 GiB)", "25769803776 bytes (24.0 GiB)", "MemAvailable"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q: %v", want, err)
		}
	}
	if err := Check("1e30 bytes", 1e30); err == nil || !strings.Contains(err.Error(), "1e+30 bytes") {
		t.Errorf("Check(1e30) = %v, want an error naming the bytes", err)
	}
	if avail, _, ok := Available(); ok && avail <= 0 {
		t.Errorf("Available = %d", avail)
	}
}
