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
	if _, _, ok := cgroupRoom(dir); ok {
		t.Error("no cgroup files gave a limit")
	}
	os.WriteFile(filepath.Join(dir, "memory.max"), []byte("max\n"), 0o644)
	if _, _, ok := cgroupRoom(dir); ok {
		t.Error(`memory.max "max" gave a limit`)
	}
	os.WriteFile(filepath.Join(dir, "memory.max"), []byte("1000\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "memory.current"), []byte("300\n"), 0o644)
	if got, file, ok := cgroupRoom(dir); got != 700 || !ok || file != filepath.Join(dir, "memory.max") {
		t.Errorf("room %d in %s, %v; want 700 in memory.max, true", got, file, ok)
	}
	v1 := t.TempDir()
	os.WriteFile(filepath.Join(v1, "memory.limit_in_bytes"), []byte("9223372036854771712\n"), 0o644)
	if _, _, ok := cgroupRoom(v1); ok {
		t.Error("v1's unlimited value gave a limit")
	}
	os.WriteFile(filepath.Join(v1, "memory.limit_in_bytes"), []byte("4096\n"), 0o644)
	os.WriteFile(filepath.Join(v1, "memory.usage_in_bytes"), []byte("5000\n"), 0o644)
	if got, _, ok := cgroupRoom(v1); got != 0 || !ok {
		t.Errorf("v1 over its limit: room %d, %v; want 0, true", got, ok)
	}
}

// TestCgroupRoomFileCache: the inactive file cache in memory.stat (v2's inactive_file, v1's
// total_inactive_file, which counts the groups below) is not counted as used, as the kubelet
// counts a working set: a file written in the group leaves the room as it was.
func TestCgroupRoomFileCache(t *testing.T) {
	const mib = 1 << 20
	for _, c := range []struct {
		name, files, stat string
		want              int64
	}{
		// a 3 GiB v2 group after a 2 GB file was written in it: 2000 MiB of its 2060 MiB is inactive cache
		{"v2 cache", "max:3221225472 current:2160066560", "anon 62914560\nfile 2097152000\nactive_file 0\ninactive_file 2097152000\n", 3072*mib - 60*mib},
		{"v2 active cache counts", "max:1000 current:600", "active_file 300\ninactive_file 100\n", 500},
		{"v2 no stat", "max:1000 current:600", "", 400},
		{"v2 stat unreadable", "max:1000 current:600", "inactive_file lots\n", 400},
		{"v2 cache past usage", "max:1000 current:600", "inactive_file 900\n", 1000},
		{"v1 total, not own", "limit_in_bytes:4000 usage_in_bytes:3000", "inactive_file 100\ntotal_inactive_file 2500\n", 3500},
		{"v1 own only", "limit_in_bytes:4000 usage_in_bytes:3000", "inactive_file 2500\n", 1000},
	} {
		dir := t.TempDir()
		for _, kv := range strings.Fields(c.files) {
			k, v, _ := strings.Cut(kv, ":")
			os.WriteFile(filepath.Join(dir, "memory."+k), []byte(v+"\n"), 0o644)
		}
		if c.stat != "" {
			os.WriteFile(filepath.Join(dir, "memory.stat"), []byte(c.stat), 0o644)
		}
		if got, _, ok := cgroupRoom(dir); got != c.want || !ok {
			t.Errorf("%s: room %d, %v; want %d, true", c.name, got, ok, c.want)
		}
	}
}

// TestCgroupLimit: the process's cgroup is found through /proc/self/cgroup and the mount
// table, for v2 and for v1's memory controller, and the least room on the path from it up to
// the mount point counts: a limit set on a parent holds for the child.
func TestCgroupLimit(t *testing.T) {
	root := t.TempDir()
	write := func(path, text string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	v2, v1 := filepath.Join(root, "unified"), filepath.Join(root, "memory")
	// v2: /a (limit 10000, used 1000) ⊃ /a/b (no limit) ⊃ /a/b/c (limit 50000, used 100)
	write(filepath.Join(v2, "a", "memory.max"), "10000")
	write(filepath.Join(v2, "a", "memory.current"), "1000")
	write(filepath.Join(v2, "a", "b", "memory.max"), "max")
	write(filepath.Join(v2, "a", "b", "c", "memory.max"), "50000")
	write(filepath.Join(v2, "a", "b", "c", "memory.current"), "100")
	// v1: /x (limit 8000, used 500) ⊃ /x/y (limit 3000, used 1000)
	write(filepath.Join(v1, "x", "memory.limit_in_bytes"), "8000")
	write(filepath.Join(v1, "x", "memory.usage_in_bytes"), "500")
	write(filepath.Join(v1, "x", "y", "memory.limit_in_bytes"), "3000")
	write(filepath.Join(v1, "x", "y", "memory.usage_in_bytes"), "1000")
	mountinfo := filepath.Join(root, "mountinfo")
	write(mountinfo, "1 0 0:1 / / rw - ext4 /dev/root rw\n"+
		"30 1 0:30 / "+v2+" rw,relatime - cgroup2 cgroup2 rw\n"+
		"31 1 0:31 / "+v1+" rw,relatime - cgroup cgroup rw,memory\n"+
		"32 1 0:32 / "+filepath.Join(root, "cpu")+" rw - cgroup cgroup rw,cpu\n")
	for _, c := range []struct {
		name, cgroup string
		room         int64
		file         string
	}{
		{"v2 parent's limit", "0::/a/b/c\n", 9000, filepath.Join(v2, "a", "memory.max")},
		{"v1 own limit", "4:memory:/x/y\n0::/\n", 2000, filepath.Join(v1, "x", "y", "memory.limit_in_bytes")},
		{"both: the least", "4:memory:/x\n0::/a/b/c\n", 7500, filepath.Join(v1, "x", "memory.limit_in_bytes")},
		{"no limit anywhere", "4:cpu:/\n0::/\n", -1, ""},
	} {
		cg := filepath.Join(root, "cgroup-"+strings.ReplaceAll(c.name, " ", "-"))
		write(cg, c.cgroup)
		room, source, ok := cgroupLimit(cg, mountinfo)
		if c.room < 0 {
			if ok {
				t.Errorf("%s: room %d (%s), want none", c.name, room, source)
			}
			continue
		}
		if !ok || room != c.room || !strings.Contains(source, c.file) {
			t.Errorf("%s: room %d (%s), %v; want %d under %s", c.name, room, source, ok, c.room, c.file)
		}
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
