package kernels

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// LastLevelCache is the size in bytes of the largest data or unified cache of CPU 0, as Linux
// describes it under /sys/devices/system/cpu/cpu0/cache; 0 where it is not known.
func LastLevelCache() int64 { return lastLevelCache("/sys/devices/system/cpu/cpu0/cache") }

// lastLevelCache reads the caches index*/ under dir: the size of the one of highest level
// whose type is Data or Unified.
func lastLevelCache(dir string) int64 {
	idx, _ := filepath.Glob(filepath.Join(dir, "index*"))
	var level, size int64
	for _, d := range idx {
		read := func(name string) string {
			b, _ := os.ReadFile(filepath.Join(d, name))
			return strings.TrimSpace(string(b))
		}
		if t := read("type"); t != "Data" && t != "Unified" {
			continue
		}
		l, err := strconv.ParseInt(read("level"), 10, 64)
		s := cacheSize(read("size"))
		if err != nil || s <= 0 {
			continue
		}
		if l > level || l == level && s > size {
			level, size = l, s
		}
	}
	return size
}

// cacheSize reads a size as sysfs writes it: "32768K", "1M", "512"; 0 if it cannot.
func cacheSize(s string) int64 {
	mul := int64(1)
	switch {
	case strings.HasSuffix(s, "K"):
		mul, s = 1<<10, strings.TrimSuffix(s, "K")
	case strings.HasSuffix(s, "M"):
		mul, s = 1<<20, strings.TrimSuffix(s, "M")
	case strings.HasSuffix(s, "G"):
		mul, s = 1<<30, strings.TrimSuffix(s, "G")
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 {
		return 0
	}
	return n * mul
}
