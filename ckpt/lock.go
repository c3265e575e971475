package ckpt

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// Holder describes the process that holds a directory's lock.
type Holder struct {
	PID     int       `json:"pid"`
	Host    string    `json:"host"`
	Since   time.Time `json:"since"`
	Command string    `json:"command"`
}

func (h Holder) String() string {
	return fmt.Sprintf("pid %d on %s since %s (%s)", h.PID, h.Host, h.Since.Local().Format("2006-01-02 15:04:05"), h.Command)
}

// Lock is a held lock on a run or checkpoint directory (LockDir).
type Lock struct {
	f    *os.File
	path string
}

// LockFile is the name of the lock of directory dir: a hidden file beside it
// (runs/.tiny.lock for runs/tiny), so that the lock stays where it is when the directory is
// moved aside, and exists before the directory does.
func LockFile(dir string) string {
	dir = filepath.Clean(dir)
	return filepath.Join(filepath.Dir(dir), "."+filepath.Base(dir)+".lock")
}

// LockedError is LockDir's error when another process holds the lock.
type LockedError struct {
	Dir    string
	Holder Holder // zero when the holder could not be read
}

func (e *LockedError) Error() string {
	who := "another process"
	if e.Holder.PID != 0 {
		who = e.Holder.String()
	}
	return fmt.Sprintf("%s is in use by %s: one run per directory (wait for it, stop it, or choose another run.name)", e.Dir, who)
}

// LockDir takes the exclusive lock of dir (LockFile) for this process, creating dir's parent
// if needed, and records this process as its holder. The lock is an advisory file lock
// (flock) that the kernel releases when the process ends however it ends, so a kill -9 leaves
// no stale lock. A lock another process holds gives a *LockedError naming that process.
// Where the system has no file locks, LockDir records the holder but cannot exclude others.
func LockDir(dir string) (*Lock, error) {
	path := LockFile(dir)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("ckpt: lock %s: %w", dir, err)
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("ckpt: lock %s: %w", dir, err)
	}
	held, err := TryLock(f)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("ckpt: lock %s: %w", dir, err)
	}
	if !held {
		var h Holder
		if b, err := os.ReadFile(path); err == nil {
			_ = json.Unmarshal(b, &h)
		}
		f.Close()
		return nil, &LockedError{Dir: dir, Holder: h}
	}
	host, _ := os.Hostname()
	h := Holder{PID: os.Getpid(), Host: host, Since: time.Now(), Command: strings.Join(os.Args, " ")}
	b, _ := json.Marshal(h)
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt(append(b, '\n'), 0)
	}
	return &Lock{f: f, path: path}, nil
}

// Unlock releases the lock. The lock file stays (removing it would let a process that
// opened it before the removal lock a file nobody else sees).
func (l *Lock) Unlock() error {
	if l == nil || l.f == nil {
		return nil
	}
	_ = l.f.Truncate(0)
	err := l.f.Close() // closing the last descriptor releases the flock
	l.f = nil
	return err
}
