package ckpt

import (
	"bufio"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// twoSteps saves steps 10 and 20 of a 3-rank run and returns the run directory and the
// tensors of each step.
func twoSteps(t *testing.T) (runDir string, a, b tensorSet) {
	t.Helper()
	runDir = t.TempDir()
	a = newTensors(10, map[string]int{"params": 300, "adam.m": 300})
	b = newTensors(20, map[string]int{"params": 300, "adam.m": 300})
	mustSave(t, runDir, 10, a, chunkPieces(a, 3), Options{FrameElems: 32}, 0)
	mustSave(t, runDir, 20, b, chunkPieces(b, 3), Options{FrameElems: 32}, 0)
	return runDir, a, b
}

func flipByte(t *testing.T, path string, at func(n int) int) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	b[at(len(b))] ^= 0x10
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestDamage damages the newest checkpoint in one way each: Open names the file and the
// problem; --resume auto falls back to the older checkpoint and reports why; an explicit
// path does not fall back.
func TestDamage(t *testing.T) {
	step20 := func(runDir, name string) string { return filepath.Join(runDir, "step-000020", name) }
	for _, tc := range []struct {
		name   string
		damage func(t *testing.T, runDir string)
		file   string   // the file the error must name
		want   []string // and what it must say
	}{
		{"truncated shard", func(t *testing.T, runDir string) {
			p := step20(runDir, "rank-00001.zst")
			fi, _ := os.Stat(p)
			os.Truncate(p, fi.Size()-10)
		}, "rank-00001.zst", []string{"truncated", "bytes, the manifest says"}},
		{"shard grown", func(t *testing.T, runDir string) {
			f, _ := os.OpenFile(step20(runDir, "rank-00002.zst"), os.O_APPEND|os.O_WRONLY, 0)
			f.Write([]byte("x"))
			f.Close()
		}, "rank-00002.zst", []string{"bytes, the manifest says"}},
		{"flipped byte in shard, first", func(t *testing.T, runDir string) {
			flipByte(t, step20(runDir, "rank-00000.zst"), func(int) int { return 0 })
		}, "rank-00000.zst", []string{"checksum mismatch", "the file is damaged"}},
		{"flipped byte in shard, middle", func(t *testing.T, runDir string) {
			flipByte(t, step20(runDir, "rank-00002.zst"), func(n int) int { return n / 2 })
		}, "rank-00002.zst", []string{"checksum mismatch"}},
		{"flipped byte in shard, last", func(t *testing.T, runDir string) {
			flipByte(t, step20(runDir, "rank-00001.zst"), func(n int) int { return n - 1 })
		}, "rank-00001.zst", []string{"checksum mismatch"}},
		{"missing rank file", func(t *testing.T, runDir string) {
			os.Remove(step20(runDir, "rank-00001.zst"))
		}, "rank-00001.zst", []string{"missing: the manifest lists it as rank 1's shard"}},
		{"two files damaged", func(t *testing.T, runDir string) {
			os.Remove(step20(runDir, "rank-00000.zst"))
			flipByte(t, step20(runDir, "rank-00002.zst"), func(n int) int { return 1 })
		}, "rank-00000.zst", []string{"missing", "rank-00002.zst: checksum mismatch"}},
		{"missing manifest", func(t *testing.T, runDir string) {
			os.Remove(step20(runDir, ManifestFile))
		}, "step-000020", []string{"no manifest.json"}},
		{"flipped byte in manifest checksum", func(t *testing.T, runDir string) {
			p := step20(runDir, ManifestFile)
			b, _ := os.ReadFile(p)
			i := strings.Index(string(b), checksumKey) + len(checksumKey) + 5
			b[i] = map[bool]byte{true: 'a', false: '0'}[b[i] == '0']
			os.WriteFile(p, b, 0o644)
		}, ManifestFile, []string{"checksum mismatch", "the manifest is damaged"}},
		{"step deleted", func(t *testing.T, runDir string) {
			os.RemoveAll(filepath.Join(runDir, "step-000020"))
		}, "step-000020", []string{"does not exist", "holds step-000010"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			runDir, a, _ := twoSteps(t)
			tc.damage(t, runDir)
			check := func(what string, err error) {
				t.Helper()
				if err == nil {
					t.Fatalf("%s: no error", what)
				}
				for _, w := range append([]string{tc.file}, tc.want...) {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("%s: error %q does not say %q", what, err, w)
					}
				}
			}
			_, err := Open(filepath.Join(runDir, "step-000020"))
			check("Open", err)
			_, err = Open(runDir) // follows latest
			check("Open(run directory)", err)
			_, _, err = Resolve(runDir, filepath.Join(runDir, "step-000020"))
			check("Resolve(explicit path)", err)

			path, skipped, err := Resolve(runDir, "auto")
			if err != nil || path != filepath.Join(runDir, "step-000010") || len(skipped) != 1 {
				t.Fatalf("Resolve auto = %s, skipped %v, %v; want step-000010 and one skipped", path, skipped, err)
			}
			check("Resolve auto's skipped", skipped[0])
			if !strings.Contains(skipped[0].Error(), "latest names step-000020") {
				t.Errorf("skipped %q does not say latest named it", skipped[0])
			}
			checkContents(t, path, a)
		})
	}
}

// TestManifestAnyByte flips bytes all over manifest.json: every one is caught by Open,
// naming the manifest.
func TestManifestAnyByte(t *testing.T) {
	runDir, _, _ := twoSteps(t)
	p := filepath.Join(runDir, "step-000020", ManifestFile)
	orig, _ := os.ReadFile(p)
	step := max(1, len(orig)/150)
	for i := 0; i < len(orig); i += step {
		b := slices.Clone(orig)
		b[i] ^= 0x04
		os.WriteFile(p, b, 0o644)
		if _, err := Open(filepath.Join(runDir, "step-000020")); err == nil || !strings.Contains(err.Error(), p) {
			t.Fatalf("byte %d (%q) flipped: Open = %v, want an error naming %s", i, orig[i], err, p)
		}
	}
	os.WriteFile(p, orig, 0o644)
	if _, err := Open(filepath.Join(runDir, "step-000020")); err != nil {
		t.Fatal(err)
	}
}

func TestResolve(t *testing.T) {
	ts := newTensors(1, map[string]int{"params": 50})
	t.Run("no run directory", func(t *testing.T) {
		p, skipped, err := Resolve(filepath.Join(t.TempDir(), "none"), "auto")
		if p != "" || skipped != nil || err != nil {
			t.Errorf("= %q %v %v, want nothing", p, skipped, err)
		}
	})
	t.Run("no resume", func(t *testing.T) {
		runDir := t.TempDir()
		mustSave(t, runDir, 1, ts, chunkPieces(ts, 1), Options{}, 0)
		if p, skipped, err := Resolve(runDir, ""); p != "" || skipped != nil || err != nil {
			t.Errorf("= %q %v %v, want nothing", p, skipped, err)
		}
	})
	t.Run("only an unfinished save", func(t *testing.T) {
		runDir := t.TempDir()
		tmp, _ := BeginStep(runDir, 5)
		WriteShard(tmp, 0, chunkPieces(ts, 1)[0], Options{})
		if p, skipped, err := Resolve(runDir, "auto"); p != "" || skipped != nil || err != nil {
			t.Errorf("= %q %v %v, want nothing", p, skipped, err)
		}
	})
	t.Run("unfinished save after a good one", func(t *testing.T) {
		runDir := t.TempDir()
		good := mustSave(t, runDir, 10, ts, chunkPieces(ts, 2), Options{}, 0)
		tmp, _ := BeginStep(runDir, 20)
		WriteShard(tmp, 0, chunkPieces(ts, 2)[0], Options{})
		os.WriteFile(filepath.Join(tmp, ShardFile(1)), []byte("half a shard"), 0o644)
		p, skipped, err := Resolve(runDir, "auto")
		if p != good || skipped != nil || err != nil {
			t.Errorf("= %q %v %v, want %s alone", p, skipped, err, good)
		}
		// The next save at that step starts from a clean directory.
		if again := mustSave(t, runDir, 20, ts, chunkPieces(ts, 2), Options{}, 0); again != filepath.Join(runDir, "step-000020") {
			t.Errorf("re-save = %s", again)
		}
	})
	t.Run("no latest pointer", func(t *testing.T) {
		// Killed after the first save's rename, before latest was written: the step is
		// complete and is used.
		runDir := t.TempDir()
		good := mustSave(t, runDir, 10, ts, chunkPieces(ts, 2), Options{}, 0)
		os.Remove(filepath.Join(runDir, LatestFile))
		if p, skipped, err := Resolve(runDir, "auto"); p != good || skipped != nil || err != nil {
			t.Errorf("= %q %v %v, want %s", p, skipped, err, good)
		}
	})
	t.Run("latest garbled", func(t *testing.T) {
		runDir := t.TempDir()
		mustSave(t, runDir, 10, ts, chunkPieces(ts, 2), Options{}, 0)
		good := mustSave(t, runDir, 20, ts, chunkPieces(ts, 2), Options{}, 0)
		os.WriteFile(filepath.Join(runDir, LatestFile), []byte("../../etc\n"), 0o644)
		p, skipped, err := Resolve(runDir, "auto")
		if p != good || len(skipped) != 1 || err != nil || !strings.Contains(skipped[0].Error(), `holds "../../etc"`) {
			t.Errorf("= %q %v %v, want %s and the garbled latest reported", p, skipped, err, good)
		}
		if _, err := Open(runDir); err == nil || !strings.Contains(err.Error(), "latest holds") {
			t.Errorf("Open(run directory) = %v", err)
		}
	})
	t.Run("all damaged", func(t *testing.T) {
		runDir, _, _ := twoSteps(t)
		os.Remove(filepath.Join(runDir, "step-000010", ShardFile(0)))
		os.Remove(filepath.Join(runDir, "step-000020", ShardFile(2)))
		p, skipped, err := Resolve(runDir, "auto")
		if p != "" || len(skipped) != 2 || err == nil || !strings.Contains(err.Error(), "no intact checkpoint in "+runDir) {
			t.Errorf("= %q %v %v, want an error and both reported", p, skipped, err)
		}
	})
	t.Run("explicit", func(t *testing.T) {
		runDir, _, b := twoSteps(t)
		p, skipped, err := Resolve(runDir, runDir)
		if p != filepath.Join(runDir, "step-000020") || skipped != nil || err != nil {
			t.Errorf("Resolve(run directory) = %q %v %v", p, skipped, err)
		}
		checkContents(t, p, b)
		if _, _, err := Resolve(runDir, filepath.Join(runDir, "step-000099")); err == nil || !strings.Contains(err.Error(), "step-000099") {
			t.Errorf("Resolve(missing) = %v", err)
		}
		if _, _, err := Resolve(runDir, t.TempDir()); err == nil || !strings.Contains(err.Error(), "neither a checkpoint") {
			t.Errorf("Resolve(empty directory) = %v", err)
		}
	})
}

var errKilled = errors.New("killed by the test")

// TestCommitCrash stops a save after each stage of Commit, as a kill would: `latest` still
// names the previous step (or, from the stage that moves it on, the new one), which loads;
// the next save succeeds and clears what the stopped one left.
func TestCommitCrash(t *testing.T) {
	a := newTensors(1, map[string]int{"params": 200, "adam.m": 100})
	b := newTensors(2, map[string]int{"params": 200, "adam.m": 100})
	c := newTensors(3, map[string]int{"params": 200, "adam.m": 100})
	moved := slices.Index(commitStages, stageLatestRenamed)
	for i, stage := range commitStages {
		t.Run(stage, func(t *testing.T) {
			runDir := t.TempDir()
			mustSave(t, runDir, 1, a, chunkPieces(a, 2), Options{}, 1)
			commitHook = func(s string) error {
				if s == stage {
					return errKilled
				}
				return nil
			}
			_, err := save(t, runDir, 2, b, chunkPieces(b, 3), Options{}, 1)
			commitHook = nil
			if !errors.Is(err, errKilled) {
				t.Fatalf("save = %v, want it stopped", err)
			}
			wantStep, want := "step-000001", a
			if i >= moved {
				wantStep, want = "step-000002", b
			}
			p, skipped, err := Resolve(runDir, "auto")
			if p != filepath.Join(runDir, wantStep) || skipped != nil || err != nil {
				t.Fatalf("Resolve auto = %s %v %v, want %s", p, skipped, err, wantStep)
			}
			checkContents(t, p, want)

			mustSave(t, runDir, 3, c, chunkPieces(c, 2), Options{}, 1)
			entries, _ := os.ReadDir(runDir)
			var names []string
			for _, e := range entries {
				names = append(names, e.Name())
			}
			if !slices.Equal(names, []string{LatestFile, "step-000003"}) {
				t.Errorf("after the next save the run directory holds %v", names)
			}
			checkContents(t, runDir, c)
		})
	}
	t.Run("replacing a step", func(t *testing.T) {
		runDir := t.TempDir()
		mustSave(t, runDir, 1, a, chunkPieces(a, 2), Options{}, 0)
		commitHook = func(s string) error {
			if s == stageReplacedRemove {
				return errKilled
			}
			return nil
		}
		_, err := save(t, runDir, 1, b, chunkPieces(b, 2), Options{}, 0)
		commitHook = nil
		if !errors.Is(err, errKilled) {
			t.Fatalf("save = %v, want it stopped", err)
		}
		checkContents(t, runDir, b)
		mustSave(t, runDir, 2, c, chunkPieces(c, 2), Options{}, 0)
		if entries, _ := os.ReadDir(runDir); len(entries) != 3 {
			t.Errorf("run directory holds %d entries, want latest and two steps", len(entries))
		}
	})
}

// killLens are the tensors the save loop of TestKillDuringSave writes: large enough that a
// save takes a few milliseconds.
var killLens = map[string]int{"params": 150_000, "adam.m": 150_000, "adam.v": 150_000}

// TestSaveLoopProcess is not a test: TestKillDuringSave runs the test binary with
// CKPT_SAVE_LOOP_DIR set to make it save step after step into that directory, printing
// each step it completes, until it is killed.
func TestSaveLoopProcess(t *testing.T) {
	runDir := os.Getenv("CKPT_SAVE_LOOP_DIR")
	if runDir == "" {
		return
	}
	step := 0
	if c, _, err := ResolveOpen(runDir, "auto"); err == nil && c != nil {
		step = c.Manifest().Step
	}
	for {
		step++
		ts := newTensors(uint64(step), killLens)
		t0 := time.Now()
		mustSave(t, runDir, step, ts, chunkPieces(ts, 3), Options{Level: 1, FrameElems: 1 << 14}, 2)
		fmt.Println("saved", step, time.Since(t0).Nanoseconds())
	}
}

// TestKillDuringSave SIGKILLs a process that saves checkpoints in a loop, at random moments,
// several times over: every time, `latest` is an intact checkpoint (nothing skipped) whose
// contents are those of its step, and the restarted process carries on from it.
func TestKillDuringSave(t *testing.T) {
	runDir := t.TempDir()
	r := rand.New(rand.NewPCG(5, 5))
	last := 0
	for round := range 8 {
		cmd := exec.Command(os.Args[0], "-test.run=^TestSaveLoopProcess$")
		cmd.Env = append(os.Environ(), "CKPT_SAVE_LOOP_DIR="+runDir)
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		// Wait for one save, then kill it at a random moment of the next one or two
		// (a save takes about as long as the first one, which includes making the data).
		line, err := bufio.NewReader(out).ReadString('\n')
		var first int
		var took time.Duration
		if _, serr := fmt.Sscanf(line, "saved %d %d", &first, &took); err != nil || serr != nil {
			cmd.Process.Kill()
			cmd.Wait()
			t.Fatalf("round %d: the save loop printed %q, %v", round, line, err)
		}
		time.Sleep(time.Duration(r.Float64() * 2 * float64(took)))
		cmd.Process.Kill()
		cmd.Wait()
		tmps, _ := filepath.Glob(filepath.Join(runDir, "step-*.tmp"))

		c, skipped, err := ResolveOpen(runDir, "auto")
		if err != nil || c == nil || skipped != nil {
			t.Fatalf("round %d: Resolve auto = %v, skipped %v, %v", round, c, skipped, err)
		}
		step := c.Manifest().Step
		if step < first || step <= last {
			t.Errorf("round %d: resumed at step %d; it reported step %d saved, and the previous round ended at %d", round, step, first, last)
		}
		last = step
		ts := newTensors(uint64(step), killLens)
		for _, ti := range ts.infos {
			got, err := c.ReadTensor(ti.Name)
			if err != nil {
				t.Fatal(err)
			}
			if i := sameBits(got, ts.data[ti.Name]); i >= 0 {
				t.Fatalf("round %d, step %d: %s[%d] is not that step's", round, step, ti.Name, i)
			}
		}
		c.Close()
		t.Logf("round %d: a save takes %v; killed with %d unfinished saves left; resumed from step %d", round, took, len(tmps), step)
	}
}

// TestOpenRefusesSymlinkedShard: a checkpoint shard that is a link (here to an identical copy
// elsewhere) is refused by Open, naming the file.
func TestOpenRefusesSymlinkedShard(t *testing.T) {
	run := t.TempDir()
	tmp, err := BeginStep(run, 1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := WriteShard(tmp, 0, []Piece{{"w", 0, []float32{1, 2}}}, Options{}); err != nil {
		t.Fatal(err)
	}
	m := Manifest{Version: Version, Step: 1, Config: []byte(`{}`), State: []byte(`{}`), World: WorldLayout{Size: 1, SequenceParallel: 1, DataParallel: 1},
		Tensors: []TensorInfo{{"w", 2, "f32"}}}
	dir, err := Commit(run, tmp, m, 0)
	if err != nil {
		t.Fatal(err)
	}
	shard := filepath.Join(dir, ShardFile(0))
	elsewhere := filepath.Join(t.TempDir(), "copy.zst")
	if err := os.Rename(shard, elsewhere); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(elsewhere, shard); err != nil {
		t.Fatal(err)
	}
	_, err = Open(dir)
	if err == nil || !strings.Contains(err.Error(), shard) || !strings.Contains(err.Error(), "not a regular file") {
		t.Fatalf("Open of a symlinked shard: %v", err)
	}
}
