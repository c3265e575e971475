package train

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/BurntSushi/toml"

	"distflash/ckpt"
	"distflash/config"
)

// runDirs are the directories a training run writes: the run directory (config, metrics,
// run.json and, by default, the checkpoints) and the checkpoint directory
// (checkpoint.dir, when set). A run holds both directories' locks for its lifetime.
type runDirs struct {
	run, ckpt string
	id        ckpt.RunID
	locks     []*ckpt.Lock
}

// runDirsOf returns the directories of cfg's run.
func runDirsOf(cfg config.Config) *runDirs {
	d := &runDirs{run: filepath.Join(cfg.Run.OutputDir, cfg.Run.Name), ckpt: cfg.Checkpoint.Dir}
	if d.ckpt == "" {
		d.ckpt = d.run
	}
	return d
}

// earlierRun describes what of an earlier run dir holds ("metrics.jsonl with 600 steps,
// checkpoints step-000600, step-000300"), or "" when it holds none: no metrics, no
// checkpoint, no run identity. A config.json alone (a launch that did not train) is no run.
func earlierRun(dir string) string {
	var what []string
	if fi, err := os.Stat(filepath.Join(dir, "metrics.jsonl")); err == nil && fi.Size() > 0 {
		steps := 0
		if b, err := os.ReadFile(filepath.Join(dir, "metrics.jsonl")); err == nil {
			steps = bytes.Count(b, []byte("\n"))
		}
		what = append(what, fmt.Sprintf("metrics.jsonl with %d steps", steps))
	}
	if cps, err := ckpt.Checkpoints(dir); err == nil && len(cps) > 0 {
		var names []string
		for i, c := range cps {
			if i == 3 {
				names = append(names, "…")
				break
			}
			names = append(names, filepath.Base(c.Dir))
		}
		what = append(what, "checkpoints "+strings.Join(names, ", "))
	} else if _, err := os.Stat(filepath.Join(dir, ckpt.LatestFile)); err == nil {
		what = append(what, "a latest pointer")
	}
	if _, ok, _ := ckpt.ReadRunID(dir); ok && len(what) == 0 {
		what = append(what, ckpt.RunFile)
	}
	return strings.Join(what, ", ")
}

// checkFresh refuses a run from scratch into directories that hold an earlier run, with the
// ways on: for the run directory, continue, rename or start over; for a checkpoint.dir of its
// own that holds another run's checkpoints, what applies there.
func (d *runDirs) checkFresh() error {
	for _, dir := range d.dirs() {
		what := earlierRun(dir)
		if what == "" {
			continue
		}
		if dir != d.run {
			return d.sharedCheckpoints(what)
		}
		return fmt.Errorf("%s holds an earlier run (%s); a fresh run would overwrite it.\n"+
			"  continue it:           --resume auto\n"+
			"  keep it, train anew:   --set run.name=OTHER\n"+
			"  start over:            --fresh (moves it aside to %s.old-<time>, deletes nothing)", dir, what, dir)
	}
	return nil
}

// sharedCheckpoints explains a fresh run whose checkpoint.dir, elsewhere than its run
// directory, holds checkpoints (what): whose they are and what to do.
func (d *runDirs) sharedCheckpoints(what string) error {
	owner := "an earlier run"
	cont := "--resume auto (with that run's run.name)"
	if r, ok := d.owner(func(ckpt.CheckpointRun) bool { return true }); ok {
		owner = fmt.Sprintf("run %q", r.Name)
		cont = fmt.Sprintf("--set run.name=%s --resume auto", r.Name)
	}
	name := filepath.Base(d.run)
	return fmt.Errorf("checkpoint.dir %s holds checkpoints of %s (%s); this run's steps would be written beside them.\n"+
		"  continue that run:      %s\n"+
		"  give this run its own:  --set checkpoint.dir=%s-%s\n"+
		"  start over:             --fresh (moves %s aside to %s.old-<time>, deletes nothing; --resume auto of %s then names where they went)",
		d.ckpt, owner, what, cont, filepath.Clean(d.ckpt), name, d.ckpt, d.ckpt, owner)
}

// movedAside finds the checkpoints of run id that a --fresh moved aside from the checkpoint
// directory dir (to dir.old-<time>): the newest such step directory, or "".
func movedAside(dir string, id ckpt.RunID) string {
	olds, _ := filepath.Glob(filepath.Clean(dir) + ".old-*")
	for i := len(olds) - 1; i >= 0; i-- { // the newest stamp first
		cps, _ := ckpt.Checkpoints(olds[i])
		for _, c := range cps {
			if c.Run.ID == id.ID {
				return c.Dir
			}
		}
	}
	return ""
}

// checkInUse says whether another process holds the lock of the run or checkpoint directory
// (a run in progress there: the first thing to say, before what the directory holds). It takes
// no lock and writes nothing where no lock file is.
func (d *runDirs) checkInUse() error {
	for _, dir := range d.dirs() {
		if _, err := os.Stat(ckpt.LockFile(dir)); err != nil {
			continue
		}
		l, err := ckpt.LockDir(dir)
		var locked *ckpt.LockedError
		if errors.As(err, &locked) {
			return fmt.Errorf("train: %w", err)
		}
		l.Unlock()
	}
	return nil
}

// dirs lists the run directory and, when it is elsewhere, the checkpoint directory.
func (d *runDirs) dirs() []string {
	if filepath.Clean(d.ckpt) == filepath.Clean(d.run) {
		return []string{d.run}
	}
	return []string{d.run, d.ckpt}
}

// open takes the directories' locks, then prepares them for this run: a fresh run is refused
// where an earlier run is (checkFresh), or with fresh set the earlier run is moved aside; the
// run's identity is read from run.json, or taken from the checkpoint it resumes, or drawn
// anew, and written. cfg is written as config.json and config.toml. On error nothing was
// written and no lock is held.
func (d *runDirs) open(cfg config.Config, resume string, fresh bool, stderr io.Writer) (err error) {
	defer func() {
		if err != nil {
			d.close()
		}
	}()
	for _, dir := range d.dirs() {
		l, err := ckpt.LockDir(dir)
		if err != nil {
			return fmt.Errorf("train: %w", err)
		}
		d.locks = append(d.locks, l)
	}
	switch {
	case resume == "" && fresh:
		stamp := time.Now().Format("20060102-150405")
		for _, dir := range d.dirs() {
			if earlierRun(dir) == "" {
				continue
			}
			old := dir + ".old-" + stamp
			if err := os.Rename(dir, old); err != nil {
				return fmt.Errorf("train: --fresh: move the earlier run aside: %w", err)
			}
			fmt.Fprintf(stderr, "train: --fresh: moved the earlier run in %s to %s\n", dir, old)
		}
	case resume == "":
		if err := d.checkFresh(); err != nil {
			return err
		}
	}
	id, ok, err := ckpt.ReadRunID(d.run)
	if err != nil {
		return fmt.Errorf("train: %w", err)
	}
	switch {
	case resume == "":
		id = ckpt.NewRunID(cfg.Run.Name)
	case resume != "auto":
		// continuing from a checkpoint of this checkpoint directory continues its run
		if owner, found := d.owner(func(c ckpt.CheckpointRun) bool { return sameFile(c.Dir, resume) }); found {
			id = owner
		} else if !ok {
			id = ckpt.NewRunID(cfg.Run.Name)
		}
	case !ok:
		// a run directory of an earlier version, or a new one over a shared checkpoint.dir:
		// the run of the newest checkpoint saved under the same run.name
		if owner, found := d.owner(func(c ckpt.CheckpointRun) bool { return c.Run.Name == cfg.Run.Name }); found {
			id = owner
		} else {
			id = ckpt.NewRunID(cfg.Run.Name)
		}
	}
	if err := d.checkForeign(id, resume); err != nil {
		return err
	}
	d.id = id
	if err := os.MkdirAll(d.run, 0o755); err != nil {
		return fmt.Errorf("train: create run directory: %w", err)
	}
	if err := ckpt.WriteRunID(d.run, id); err != nil {
		return fmt.Errorf("train: %w", err)
	}
	return writeResolvedConfig(d.run, cfg)
}

// owner returns the run of the newest checkpoint in the checkpoint directory that match
// accepts, among those that carry a run identity.
func (d *runDirs) owner(match func(ckpt.CheckpointRun) bool) (ckpt.RunID, bool) {
	cps, _ := ckpt.Checkpoints(d.ckpt)
	for _, c := range cps {
		if c.Run.ID != "" && match(c) {
			return c.Run, true
		}
	}
	return ckpt.RunID{}, false
}

// checkForeign refuses to write into a checkpoint directory that holds another run's
// checkpoints: the two runs' step directories would replace each other. The exception is
// continuing from one of them by naming it (--resume PATH): then the checkpoints beside it
// are that run's history, which the resumed run carries on.
func (d *runDirs) checkForeign(id ckpt.RunID, resume string) error {
	cps, err := ckpt.Checkpoints(d.ckpt)
	if err != nil {
		return fmt.Errorf("train: %w", err)
	}
	for _, c := range cps {
		if c.Run.ID == "" || c.Run.ID == id.ID {
			continue
		}
		if resume != "" && resume != "auto" {
			return nil
		}
		if moved := movedAside(d.ckpt, id); moved != "" {
			return fmt.Errorf("train: checkpoint.dir %s holds checkpoints of another run (%s, saved by %s); this %s's own checkpoints were moved aside by a --fresh, the newest to %s: continue there with --set checkpoint.dir=%s --resume auto",
				d.ckpt, filepath.Base(c.Dir), c.Run, id, moved, filepath.Dir(moved))
		}
		return fmt.Errorf("train: checkpoint.dir %s holds checkpoints of another run: %s was saved by %s, and this is %s; "+
			"use another checkpoint.dir, or continue that run by naming its checkpoint: --resume %s", d.ckpt, filepath.Base(c.Dir), c.Run, id, c.Dir)
	}
	return nil
}

// close releases the locks.
func (d *runDirs) close() {
	for _, l := range d.locks {
		_ = l.Unlock()
	}
	d.locks = nil
}

// sameFile reports whether a and b name the same file or directory.
func sameFile(a, b string) bool {
	fa, err := os.Stat(a)
	if err != nil {
		return false
	}
	fb, err := os.Stat(b)
	return err == nil && os.SameFile(fa, fb)
}

// writeResolvedConfig writes cfg, with every default filled in, as config.json and as
// config.toml (which --config accepts) into dir, each atomically.
func writeResolvedConfig(dir string, cfg config.Config) error {
	j, err := json.MarshalIndent(cfg, "", "  ")
	if err != nil {
		return fmt.Errorf("train: encode config: %w", err)
	}
	var t bytes.Buffer
	fmt.Fprintf(&t, "# The resolved configuration of run %q (every default filled in), written by distflash train.\n", cfg.Run.Name)
	fmt.Fprintf(&t, "# distflash train --config %s repeats it.\n\n", filepath.Join(dir, "config.toml"))
	if err := toml.NewEncoder(&t).Encode(cfg); err != nil {
		return fmt.Errorf("train: encode config as TOML: %w", err)
	}
	for name, b := range map[string][]byte{"config.json": append(j, '\n'), "config.toml": t.Bytes()} {
		if err := ckpt.WriteFileAtomic(filepath.Join(dir, name), b); err != nil {
			return fmt.Errorf("train: %w", err)
		}
	}
	return nil
}
