package ckpt

import "golang.org/x/sys/unix"

// exchange swaps the directories a and b in one step (renameat2 RENAME_EXCHANGE), so that a
// reader of b sees the old or the new directory, never none. ok is false where the file
// system cannot do it; the caller then falls back to two renames.
func exchange(a, b string) (ok bool, err error) {
	err = unix.Renameat2(unix.AT_FDCWD, a, unix.AT_FDCWD, b, unix.RENAME_EXCHANGE)
	switch err {
	case nil:
		return true, nil
	case unix.EINVAL, unix.ENOSYS, unix.EOPNOTSUPP:
		return false, nil
	}
	return false, err
}
