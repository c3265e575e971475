//go:build !linux

package sysmem

// DiskFree cannot tell the free space on this system: ok is false.
func DiskFree(path string) (free int64, ok bool) { return 0, false }
