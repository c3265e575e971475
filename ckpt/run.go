package ckpt

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"
)

// RunFile is the name of the file in a run directory that holds the run's identity (RunID).
const RunFile = "run.json"

// RunID is the identity of one training run: its name and a random id drawn when it started
// from scratch. Every checkpoint carries the RunID of the run that saved it (Manifest.Run),
// so that a checkpoint directory two runs share never makes one continue from the other's
// checkpoint without being told.
type RunID struct {
	ID      string    `json:"id"`
	Name    string    `json:"name"`
	Started time.Time `json:"started"`
}

// NewRunID returns a new identity for a run called name.
func NewRunID(name string) RunID {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return RunID{ID: hex.EncodeToString(b[:]), Name: name, Started: time.Now().UTC().Truncate(time.Second)}
}

// String names the run for messages: run "tiny" (id 1a2b…).
func (r RunID) String() string { return fmt.Sprintf("run %q (id %s)", r.Name, r.ID) }

// ReadRunID reads dir's run.json; ok is false when there is none.
func ReadRunID(dir string) (id RunID, ok bool, err error) {
	path := filepath.Join(dir, RunFile)
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return RunID{}, false, nil
	}
	if err != nil {
		return RunID{}, false, fmt.Errorf("ckpt: %w", err)
	}
	if err := json.Unmarshal(b, &id); err != nil || id.ID == "" {
		return RunID{}, false, fmt.Errorf("ckpt: %s: not a run identity (want {\"id\": ..., \"name\": ...}): delete it to start a new identity", path)
	}
	return id, true, nil
}

// WriteRunID writes id to dir's run.json (atomically).
func WriteRunID(dir string, id RunID) error {
	b, err := json.MarshalIndent(id, "", "  ")
	if err != nil {
		return fmt.Errorf("ckpt: %w", err)
	}
	return writeFileAtomic(filepath.Join(dir, RunFile), append(b, '\n'), nil)
}

// CheckpointRun is a step directory of a checkpoint directory and the run that saved it, as
// its manifest says (a zero RunID for checkpoints written before runs had identities, and
// for manifests that cannot be read: those are Open's to report).
type CheckpointRun struct {
	Dir string
	Run RunID
}

// Checkpoints lists the complete step directories of dir, newest first, with the run each
// belongs to. It reads only the manifests' run field, not the shards.
func Checkpoints(dir string) ([]CheckpointRun, error) {
	names, err := stepDirs(dir)
	if err != nil {
		return nil, err
	}
	out := make([]CheckpointRun, 0, len(names))
	for _, n := range names {
		c := CheckpointRun{Dir: filepath.Join(dir, n)}
		if b, err := os.ReadFile(filepath.Join(c.Dir, ManifestFile)); err == nil {
			var m struct {
				Run RunID `json:"run"`
			}
			if json.Unmarshal(b, &m) == nil {
				c.Run = m.Run
			}
		}
		out = append(out, c)
	}
	return out, nil
}

// ForeignError says that a checkpoint belongs to another run than the one resuming.
type ForeignError struct {
	Dir        string
	Owner, Run RunID
}

func (e *ForeignError) Error() string {
	return fmt.Sprintf("%s belongs to %s, not to this %s: continue from it only by naming it (--resume %s)", e.Dir, e.Owner, e.Run, e.Dir)
}

// belongs reports whether a checkpoint saved by owner is one of run's. A checkpoint without
// an identity (saved before checkpoints carried one) belongs to any run.
func belongs(owner, run RunID) bool {
	return owner.ID == "" || run.ID == "" || owner.ID == run.ID
}
