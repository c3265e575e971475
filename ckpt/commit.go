package ckpt

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
)

// LatestFile is the name of the pointer file in a run directory: it holds the name of the
// newest complete step directory ("step-000100").
const LatestFile = "latest"

// StepDir is the name of step's directory in a run directory: step-NNNNNN.
func StepDir(step int) string { return fmt.Sprintf("step-%06d", step) }

var stepRE = regexp.MustCompile(`^step-([0-9]{6,})$`)

// parseStepDir returns the step of a step directory name, or -1 if name is not one.
func parseStepDir(name string) int {
	m := stepRE.FindStringSubmatch(name)
	if m == nil {
		return -1
	}
	n, err := strconv.Atoi(m[1])
	if err != nil {
		return -1
	}
	return n
}

// BeginStep starts saving step in runDir: it creates runDir if needed and returns an empty
// temporary directory for the step's files, runDir/step-NNNNNN.tmp, removing one left by a
// save that did not finish. With ranks in separate processes, one rank calls it and the
// others wait for it (a barrier) before WriteShard.
func BeginStep(runDir string, step int) (string, error) {
	if step < 0 {
		return "", fmt.Errorf("ckpt: BeginStep: step %d is negative", step)
	}
	if err := os.MkdirAll(runDir, 0o755); err != nil {
		return "", fmt.Errorf("ckpt: BeginStep: %w", err)
	}
	tmp := filepath.Join(runDir, StepDir(step)+".tmp")
	if err := os.RemoveAll(tmp); err != nil {
		return "", fmt.Errorf("ckpt: BeginStep: remove a stale save: %w", err)
	}
	if err := os.Mkdir(tmp, 0o755); err != nil {
		return "", fmt.Errorf("ckpt: BeginStep: %w", err)
	}
	return tmp, nil
}

// The stages of Commit, in order: after each one Commit calls commitHook (when set), which
// can stop it there as if the process had been killed.
const (
	stageSidecarsRead   = "sidecars read"   // every rank's index read and checked
	stageManifestTmp    = "manifest tmp"    // manifest.json.tmp written and fsynced
	stageManifest       = "manifest"        // renamed to manifest.json, sidecars removed
	stageDirRenamed     = "dir renamed"     // step-NNNNNN.tmp renamed to step-NNNNNN
	stageRunDirSynced   = "run dir synced"  // the rename made durable
	stageLatestTmp      = "latest tmp"      // latest.tmp written and fsynced
	stageLatestRenamed  = "latest renamed"  // latest now names the new step
	stageLatestDurable  = "latest durable"  // the run directory fsynced again
	stagePruned         = "pruned"          // older steps removed
	stageReplacedRemove = "replaced remove" // (only when the step existed) before the old copy is removed
)

// commitStages lists the stages every Commit passes, in order.
var commitStages = []string{stageSidecarsRead, stageManifestTmp, stageManifest, stageDirRenamed,
	stageRunDirSynced, stageLatestTmp, stageLatestRenamed, stageLatestDurable, stagePruned}

// commitHook, when not nil, is called after each stage of Commit; an error from it stops
// Commit at once, leaving the files as a kill at that point would. Tests use it.
var commitHook func(stage string) error

// KillAtEnv names an environment variable for crash tests of whole programs: when it holds
// the name of a save stage ("shard written" — after a rank's shard and index are on disk —
// or one of Commit's stages, such as "manifest" or "latest renamed"), the process kills
// itself with SIGKILL on reaching that stage, as a machine failure would.
const KillAtEnv = "DISTFLASH_CKPT_KILL_AT"

// PauseAtEnv names an environment variable for tests that signal a save in progress: when it
// holds the name of a save stage (as KillAtEnv), the process waits 2 seconds on reaching
// that stage, as a slow disk would.
const PauseAtEnv = "DISTFLASH_CKPT_PAUSE_AT"

// stageShardWritten is reached when WriteShard has written and synced a rank's files.
const stageShardWritten = "shard written"

func hook(stage string) error {
	if os.Getenv(KillAtEnv) == stage {
		killSelf()
	}
	if os.Getenv(PauseAtEnv) == stage {
		time.Sleep(2 * time.Second)
	}
	if commitHook != nil {
		return commitHook(stage)
	}
	return nil
}

// Commit completes the save that BeginStep started, once every rank's WriteShard has
// returned; one rank (rank 0) calls it. It reads every rank's index from tmpDir (so it works
// when the ranks are separate processes sharing a file system), checks that all
// m.World.Size ranks are there with the file sizes they recorded and that their pieces cover
// each of m.Tensors exactly once, and fills in m.Version, m.Shards, m.ConfigHash and (if
// zero) m.Time. Then, each step durable before the next: manifest.json is written (temporary
// name, fsync, rename), tmpDir is renamed to runDir/step-NNNNNN, the `latest` pointer is
// replaced (temporary name, fsync, rename) and older steps are pruned so that the newest
// keep remain (keep <= 0 keeps all; the new step is always kept). A process killed at any
// point leaves `latest` naming the previous complete step or the new one, both intact.
//
// Commit does not re-read the shards to hash them (WriteShard hashed what it wrote); Open
// does. If the step directory exists already (a step saved again after resuming from an
// older one), it is replaced, atomically where the file system can swap two directories
// (Linux renameat2), otherwise with two renames. An error from pruning alone comes with
// the final path: the checkpoint itself is complete.
func Commit(runDir, tmpDir string, m Manifest, keep int) (string, error) {
	name := StepDir(m.Step)
	final := filepath.Join(runDir, name)
	if want := filepath.Join(runDir, name+".tmp"); filepath.Clean(tmpDir) != want {
		return "", fmt.Errorf("ckpt: Commit step %d: temporary directory %s, want %s (from BeginStep)", m.Step, tmpDir, want)
	}
	if m.World.Size < 1 {
		return "", fmt.Errorf("ckpt: Commit %s: world size %d, want >= 1", tmpDir, m.World.Size)
	}
	if len(m.Config) == 0 {
		return "", fmt.Errorf("ckpt: Commit %s: the manifest has no config", tmpDir)
	}
	hash, err := HashConfig(m.Config)
	if err != nil {
		return "", fmt.Errorf("ckpt: Commit %s: %w", tmpDir, err)
	}
	m.ConfigHash = hash
	m.Version = Version
	if m.Time.IsZero() {
		m.Time = time.Now()
	}
	m.Time = m.Time.UTC()
	if m.State == nil {
		m.State = json.RawMessage("null")
	}

	m.Shards = make([]ShardInfo, m.World.Size)
	for r := range m.Shards {
		s, err := readSidecar(tmpDir, r)
		if err != nil {
			return "", err
		}
		m.Shards[r] = s
	}
	extra, _ := filepath.Glob(filepath.Join(tmpDir, "rank-*.json"))
	if len(extra) > m.World.Size {
		return "", fmt.Errorf("ckpt: Commit %s: %d rank indexes for a world of %d ranks", tmpDir, len(extra), m.World.Size)
	}
	if err := validate(tmpDir, m); err != nil {
		return "", err
	}
	data, err := encodeManifest(m)
	if err != nil {
		return "", err
	}
	if err := hook(stageSidecarsRead); err != nil {
		return "", err
	}

	if err := writeFileAtomic(filepath.Join(tmpDir, ManifestFile), data, func() error { return hook(stageManifestTmp) }); err != nil {
		return "", err
	}
	for r := range m.Shards {
		if err := os.Remove(filepath.Join(tmpDir, sidecarFile(r))); err != nil {
			return "", fmt.Errorf("ckpt: Commit: %w", err)
		}
	}
	if err := SyncDir(tmpDir); err != nil {
		return "", err
	}
	if err := hook(stageManifest); err != nil {
		return "", err
	}

	if err := replaceDir(tmpDir, final); err != nil {
		return "", err
	}
	if err := hook(stageDirRenamed); err != nil {
		return "", err
	}
	if err := SyncDir(runDir); err != nil {
		return "", err
	}
	if err := hook(stageRunDirSynced); err != nil {
		return "", err
	}

	if err := writeFileAtomic(filepath.Join(runDir, LatestFile), []byte(name+"\n"), func() error { return hook(stageLatestTmp) }); err != nil {
		return "", err
	}
	if err := hook(stageLatestRenamed); err != nil {
		return "", err
	}
	if err := SyncDir(runDir); err != nil {
		return "", err
	}
	if err := hook(stageLatestDurable); err != nil {
		return "", err
	}

	if err := prune(runDir, name, keep); err != nil {
		return final, err
	}
	return final, hook(stagePruned)
}

// readSidecar reads rank's index from a temporary step directory and checks that its shard
// file has the size it records.
func readSidecar(dir string, rank int) (ShardInfo, error) {
	path := filepath.Join(dir, sidecarFile(rank))
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return ShardInfo{}, fmt.Errorf("ckpt: Commit %s: rank %d did not finish its shard: %s is missing", dir, rank, sidecarFile(rank))
	}
	if err != nil {
		return ShardInfo{}, fmt.Errorf("ckpt: Commit: %w", err)
	}
	var s ShardInfo
	if err := json.Unmarshal(b, &s); err != nil {
		return ShardInfo{}, fmt.Errorf("ckpt: Commit: %s: %w", path, err)
	}
	if s.Rank != rank || s.File != ShardFile(rank) {
		return ShardInfo{}, fmt.Errorf("ckpt: Commit: %s describes rank %d's file %q, want rank %d's %s", path, s.Rank, s.File, rank, ShardFile(rank))
	}
	fi, err := os.Stat(filepath.Join(dir, s.File))
	if err != nil {
		return ShardInfo{}, fmt.Errorf("ckpt: Commit: rank %d: %w", rank, err)
	}
	if fi.Size() != s.Size {
		return ShardInfo{}, fmt.Errorf("ckpt: Commit: %s has %d bytes, its index %s says %d", filepath.Join(dir, s.File), fi.Size(), sidecarFile(rank), s.Size)
	}
	return s, nil
}

// replaceDir renames the complete directory tmp to final, replacing final if it exists.
func replaceDir(tmp, final string) error {
	err := os.Rename(tmp, final)
	if err == nil {
		return nil
	}
	if _, serr := os.Stat(final); serr != nil {
		return fmt.Errorf("ckpt: Commit: %w", err)
	}
	// final exists: swap the two and remove the old one, now at tmp.
	ok, xerr := exchange(tmp, final)
	if xerr != nil {
		return fmt.Errorf("ckpt: Commit: replace %s: %w", final, xerr)
	}
	old := tmp
	if !ok {
		old = final + ".replaced"
		if err := os.RemoveAll(old); err != nil {
			return fmt.Errorf("ckpt: Commit: %w", err)
		}
		if err := os.Rename(final, old); err != nil {
			return fmt.Errorf("ckpt: Commit: %w", err)
		}
		if err := os.Rename(tmp, final); err != nil {
			return fmt.Errorf("ckpt: Commit: %w", err)
		}
	}
	if err := hook(stageReplacedRemove); err != nil {
		return err
	}
	if err := os.RemoveAll(old); err != nil {
		return fmt.Errorf("ckpt: Commit: remove the replaced %s: %w", final, err)
	}
	return nil
}

// stepDirs lists the complete step directories of runDir (step-NNNNNN, not .tmp), newest
// (highest step) first. A missing runDir has none.
func stepDirs(runDir string) ([]string, error) {
	entries, err := os.ReadDir(runDir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("ckpt: %w", err)
	}
	var names []string
	for _, e := range entries {
		if e.IsDir() && parseStepDir(e.Name()) >= 0 {
			names = append(names, e.Name())
		}
	}
	slices.SortFunc(names, func(a, b string) int { return cmp.Compare(parseStepDir(b), parseStepDir(a)) })
	return names, nil
}

// prune removes the step directories of runDir beyond the newest keep (keep <= 0: none),
// never current, and what unfinished or interrupted saves left behind (step-*.tmp,
// step-*.replaced).
func prune(runDir, current string, keep int) error {
	entries, err := os.ReadDir(runDir)
	if err != nil {
		return fmt.Errorf("ckpt: prune: %w", err)
	}
	var errs []error
	for _, e := range entries {
		n := e.Name()
		if strings.HasPrefix(n, "step-") && (strings.HasSuffix(n, ".tmp") || strings.HasSuffix(n, ".replaced")) {
			if err := os.RemoveAll(filepath.Join(runDir, n)); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if keep > 0 {
		names, err := stepDirs(runDir)
		if err != nil {
			return err
		}
		kept := 1 // current
		for _, n := range names {
			if n == current {
				continue
			}
			if kept < keep {
				kept++
				continue
			}
			if err := os.RemoveAll(filepath.Join(runDir, n)); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("ckpt: prune %s: %w", runDir, err)
	}
	return nil
}

// readLatest returns the step directory name that runDir's latest pointer holds.
func readLatest(runDir string) (string, error) {
	path := filepath.Join(runDir, LatestFile)
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("ckpt: %w", err)
	}
	name := strings.TrimSpace(string(b))
	if parseStepDir(name) < 0 {
		return "", fmt.Errorf("ckpt: %s holds %q, want a step directory name like %s", path, name, StepDir(100))
	}
	return name, nil
}
