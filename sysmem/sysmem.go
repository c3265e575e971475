// Package sysmem tells how much memory this machine can give to a new allocation, so that a
// size read from a file (a model's shape, a tokenizer's vocabulary, a tensor's length) is
// checked before it is allocated: what cannot fit is refused with an error naming what needs
// the memory, the bytes it needs and the bytes available, instead of a panic or the kernel's
// out-of-memory killer.
package sysmem

import (
	"bufio"
	"bytes"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
)

// Available returns the bytes of memory available to new allocations and where the number
// comes from: on Linux, MemAvailable of /proc/meminfo, lowered to the room left under the
// cgroup (v2) memory limit when one is set. ok is false where neither can be read (other
// systems); then only sizes past the address space are refused (see Check).
func Available() (bytes int64, source string, ok bool) {
	bytes, ok = memAvailable("/proc/meminfo")
	source = "MemAvailable in /proc/meminfo"
	if limit, ok2 := cgroupRoom("/sys/fs/cgroup"); ok2 && (!ok || limit < bytes) {
		bytes, source, ok = limit, "the cgroup memory.max less memory.current", true
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

// cgroupRoom is memory.max − memory.current of the cgroup v2 mounted at dir, when a limit is
// set.
func cgroupRoom(dir string) (int64, bool) {
	read := func(name string) (int64, bool) {
		b, err := os.ReadFile(dir + "/" + name)
		if err != nil {
			return 0, false
		}
		v, err := strconv.ParseInt(string(bytes.TrimSpace(b)), 10, 64)
		return v, err == nil // "max" (no limit) does not parse
	}
	limit, ok := read("memory.max")
	if !ok {
		return 0, false
	}
	used, _ := read("memory.current")
	return max(limit-used, 0), true
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
