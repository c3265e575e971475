package sysmem

import (
	"io/fs"
	"path/filepath"
)

// TreeBytes is the size of the regular files under path (0 where it cannot be read): what a
// partial output that is about to be removed held.
func TreeBytes(path string) int64 {
	var n int64
	_ = filepath.WalkDir(path, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if fi, err := d.Info(); err == nil {
				n += fi.Size()
			}
		}
		return nil
	})
	return n
}
