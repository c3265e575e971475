//go:build !linux

package ckpt

// FreeBytes cannot tell the free space on this system: ok is false.
func FreeBytes(path string) (free int64, ok bool) { return 0, false }
