// Package sysmem tells how much memory this machine can give to a new allocation, so that a
// size read from a file (a model's shape, a tokenizer's vocabulary, a tensor's length) is
// checked before it is allocated: what cannot fit is refused with an error naming what needs
// the memory, the bytes it needs and the bytes available, instead of a panic or the kernel's
// out-of-memory killer. DiskFree tells the room left on a file system, for the messages of a
// write that filled it.
package sysmem

import (
	"bufio"
	"bytes"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// Available returns the bytes of memory available to new allocations and where the number
// comes from: on Linux, MemAvailable of /proc/meminfo, lowered to the least room left under a
// memory limit of the process's own cgroup or of any cgroup above it (the cgroup is found
// through /proc/self/cgroup and /proc/self/mountinfo). The room under a limit is the limit
// less the group's working set, as the kubelet and docker stats count it: its usage (cgroup
// v2 memory.current, v1 memory.usage_in_bytes) less its inactive file cache (memory.stat's
// inactive_file, v1's total_inactive_file), which the kernel reclaims before it kills
// anything (a file written in the group, a checkpoint saved, is cache until then). ok is
// false where none of these can be read (other systems); then only sizes past the address
// space are refused (see Check).
func Available() (bytes int64, source string, ok bool) {
	bytes, ok = memAvailable("/proc/meminfo")
	source = "MemAvailable in /proc/meminfo"
	if room, where, ok2 := cgroupLimit("/proc/self/cgroup", "/proc/self/mountinfo"); ok2 && (!ok || room < bytes) {
		bytes, source, ok = room, where, true
	}
	return bytes, source, ok
}

// memAvailable reads MemAvailable (kB) from a /proc/meminfo file.
func memAvailable(path string) (int64, bool) {
	f, err := os.Open(path)
	if err != nil {
		return 0, false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), "MemAvailable:")
		if !ok {
			continue
		}
		kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
		if err != nil || kb < 0 || kb > math.MaxInt64/1024 {
			return 0, false
		}
		return kb * 1024, true
	}
	return 0, false
}

// cgroupRoom is the room left under the memory limit of the cgroup directory dir: the limit
// (v2's memory.max, v1's memory.limit_in_bytes) less the working set, which is the usage (v2's
// memory.current, v1's memory.usage_in_bytes) less the inactive file cache of memory.stat
// (v2's inactive_file, v1's total_inactive_file, both counting the groups below), never below
// 0. ok is false when dir sets no limit ("max", or v1's page-rounded maximum).
func cgroupRoom(dir string) (room int64, file string, ok bool) {
	read := func(name string) (int64, bool) {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			return 0, false
		}
		v, err := strconv.ParseInt(string(bytes.TrimSpace(b)), 10, 64)
		return v, err == nil // "max" (no limit) does not parse
	}
	for _, f := range [][3]string{{"memory.max", "memory.current", "inactive_file"}, {"memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file"}} {
		limit, ok := read(f[0])
		if !ok || limit >= math.MaxInt64/2 { // v1 writes "no limit" as 2^63 rounded down to a page
			continue
		}
		used, _ := read(f[1])
		used = max(used-statValue(filepath.Join(dir, "memory.stat"), f[2]), 0)
		return max(limit-used, 0), filepath.Join(dir, f[0]), true
	}
	return 0, "", false
}

// statValue is the value of key in a memory.stat file (lines "key value"); 0 where the file
// or the key cannot be read.
func statValue(path, key string) int64 {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		k, v, _ := strings.Cut(line, " ")
		if k != key {
			continue
		}
		n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		if err != nil || n < 0 {
			return 0
		}
		return n
	}
	return 0
}

// cgroupLimit finds the process's memory cgroup (v2, or v1's memory controller) from the
// cgroup file (/proc/self/cgroup) and the mount table (/proc/self/mountinfo), and returns the
// least room under a limit set on it or on any cgroup above it, naming the limit's file.
func cgroupLimit(cgroupFile, mountinfo string) (room int64, source string, ok bool) {
	paths := map[string]string{} // "2" (unified) or "memory" → the cgroup's path in its hierarchy
	b, err := os.ReadFile(cgroupFile)
	if err != nil {
		return 0, "", false
	}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		f := strings.SplitN(line, ":", 3)
		if len(f) != 3 {
			continue
		}
		switch {
		case f[0] == "0" && f[1] == "":
			paths["2"] = f[2]
		case slices.Contains(strings.Split(f[1], ","), "memory"):
			paths["memory"] = f[2]
		}
	}
	mi, err := os.ReadFile(mountinfo)
	if err != nil {
		return 0, "", false
	}
	for _, line := range strings.Split(string(mi), "\n") {
		// ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS... - FSTYPE SOURCE SUPEROPTIONS
		pre, post, found := strings.Cut(line, " - ")
		f, g := strings.Fields(pre), strings.Fields(post)
		if !found || len(f) < 5 || len(g) < 3 {
			continue
		}
		root, mount := f[3], f[4]
		var key string
		switch {
		case g[0] == "cgroup2":
			key = "2"
		case g[0] == "cgroup" && slices.Contains(strings.Split(g[2], ","), "memory"):
			key = "memory"
		default:
			continue
		}
		path, have := paths[key]
		if !have {
			continue
		}
		rel, inside := strings.CutPrefix(path, root)
		if !inside && root != "/" {
			continue // the cgroup lies outside what this mount shows
		}
		if root == "/" {
			rel = path
		}
		// the cgroup's own directory, then each one above it up to the mount point
		for dir := filepath.Join(mount, rel); ; dir = filepath.Dir(dir) {
			if r, file, limited := cgroupRoom(dir); limited && (!ok || r < room) {
				room, source, ok = r, "the room under "+file+": the limit less the group's usage but for its inactive file cache", true
			}
			if dir == mount || len(dir) <= len(mount) {
				break
			}
		}
	}
	return room, source, ok
}

// Check returns nil when need bytes fit in the memory Available, and otherwise an error
// naming what needs them ("the model of config.json's hidden_size = 8192, …"), the bytes
// needed and the bytes available. need is a float64 so that callers compute it without
// overflow from sizes read from files. Where Available is unknown, need is refused only
// when it exceeds the address space.
func Check(what string, need float64) error {
	avail, source, ok := Available()
	if !ok {
		if need > math.MaxInt {
			return fmt.Errorf("%s needs %s: more than this machine can address", what, Bytes(need))
		}
		return nil
	}
	return check(what, need, avail, source)
}

func check(what string, need float64, avail int64, source string) error {
	if need <= float64(avail) {
		return nil
	}
	return fmt.Errorf("%s needs %s, this machine has %s available (%s)", what, Bytes(need), Bytes(float64(avail)), source)
}

// Bytes writes a byte count exactly and in GiB: "322122547200 bytes (300.0 GiB)".
func Bytes(b float64) string {
	if b >= 1<<63 {
		return fmt.Sprintf("%.3g bytes (%.3g GiB)", b, b/(1<<30))
	}
	return fmt.Sprintf("%d bytes (%.1f GiB)", int64(b), b/(1<<30))
}
