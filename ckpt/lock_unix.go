//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package ckpt

import (
	"errors"
	"os"
	"syscall"
)

// TryLock takes an exclusive flock on f without waiting; false means another open file
// description holds it. The kernel releases it when f's last descriptor closes, however the
// process ends (LockDir's lock, and an export's temporary directory while it is written).
func TryLock(f *os.File) (bool, error) {
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		switch {
		case err == nil:
			return true, nil
		case errors.Is(err, syscall.EWOULDBLOCK):
			return false, nil
		case errors.Is(err, syscall.EINTR):
			continue
		}
		return false, err
	}
}
