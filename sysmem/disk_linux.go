package sysmem

import "syscall"

// DiskFree returns the bytes an unprivileged process may still write on the file system
// that holds path; ok is false where that cannot be told.
func DiskFree(path string) (free int64, ok bool) {
	var s syscall.Statfs_t
	if err := syscall.Statfs(path, &s); err != nil {
		return 0, false
	}
	return int64(s.Bavail) * int64(s.Bsize), true
}
