package weights

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"distflash/ckpt"
	"distflash/sysmem"
	"distflash/weights/safetensors"
)

// Hugging Face export: whole model directories.

// ParseSize reads a byte size as Hugging Face's max_shard_size does: a number with an
// optional unit, decimal (B, KB, MB, GB, TB: powers of 1000) or binary (KiB, MiB, GiB, TiB).
func ParseSize(s string) (int64, error) {
	t := strings.TrimSpace(s)
	i := strings.IndexFunc(t, func(r rune) bool { return (r < '0' || r > '9') && r != '.' })
	num, unit := t, ""
	if i >= 0 {
		num, unit = t[:i], strings.TrimSpace(t[i:])
	}
	mult := map[string]float64{"": 1, "B": 1, "KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12,
		"KIB": 1 << 10, "MIB": 1 << 20, "GIB": 1 << 30, "TIB": 1 << 40}[strings.ToUpper(unit)]
	v, err := strconv.ParseFloat(num, 64)
	if mult == 0 || err != nil || !(v > 0) || v*mult > math.MaxInt64/2 {
		return 0, fmt.Errorf("size %q: want a positive number with an optional unit (B, KB, MB, GB, TB, KiB, MiB, GiB, TiB), e.g. 5GB", s)
	}
	return int64(v * mult), nil
}

// HFExport is what WriteHF puts in a Hugging Face model directory.
type HFExport struct {
	Config  []byte                // config.json, as it is written
	Tensors []safetensors.WTensor // the weights, in the order they are stored
	DType   string                // safetensors.DTypeF32 or safetensors.DTypeBF16
	// MaxShardSize is the most bytes of tensor data per safetensors file (Hugging Face's
	// max_shard_size); 0 means one file. Above it the weights are split into
	// model-0000k-of-0000n.safetensors, in order, with model.safetensors.index.json; a tensor
	// larger than the limit gets a file of its own.
	MaxShardSize int64
	// Copy names files to copy in (tokenizer files): name in the directory → source path.
	Copy map[string]string
	// Hooks, when set, hear of the temporary directory and of stale ones removed.
	Hooks *HFHooks
}

// HFHooks are what WriteHF tells its caller while it writes.
type HFHooks struct {
	// Temp is called with the temporary directory as soon as it exists, so that a signal
	// handler can remove it (an interrupted export then leaves nothing behind either), and
	// with "" once it is renamed to the output.
	Temp func(path string)
	// Stale is called for each temporary directory of an earlier export of the same
	// directory that ended without removing it (killed), before WriteHF removes it.
	Stale func(path string, bytes int64)
	// Guard, when set, runs the two steps that change what is at and beside dir: making the
	// temporary directory (Temp hears of it within the step) and the commit (commit true),
	// which renames it to dir. A signal handler that removes the temporary directory under
	// the same lock (cli.Guard.Do) then finds either nothing at dir or dir whole.
	Guard func(commit bool, step func() error) error
}

// shardFile is the name of shard i (0-based) of n, as transformers names them.
func shardFile(i, n int) string {
	if n == 1 {
		return "model.safetensors"
	}
	return fmt.Sprintf("model-%05d-of-%05d.safetensors", i+1, n)
}

// WriteHF writes a Hugging Face model directory at dir: config.json, the weights (one
// model.safetensors, or shards with model.safetensors.index.json) and the files to copy.
// Everything is written into a temporary directory beside dir, synced, and renamed to dir
// only when complete, so a failed export leaves nothing behind. dir must not exist or be an
// empty directory. While it writes, the temporary directory is locked, so the unlocked
// temporary directories of dir it finds (.NAME.tmp-*) belong to no running export: an export
// killed before it could clean up left them, and WriteHF removes them (e.Hooks.Stale hears of
// each). It returns the names of the files written, in order.
func WriteHF(dir string, e HFExport) ([]string, error) {
	size, err := safetensors.ElemBytes(e.DType)
	if err != nil {
		return nil, err
	}
	need := int64(len(e.Config))
	for _, t := range e.Tensors {
		need += int64(len(t.Data) * size)
	}
	for _, src := range e.Copy {
		if fi, err := os.Stat(src); err == nil {
			need += fi.Size()
		}
	}
	parent := filepath.Dir(filepath.Clean(dir))
	free, freeOK := sysmem.DiskFree(parent)
	files, err := writeHF(dir, e, size)
	if errors.Is(err, syscall.ENOSPC) {
		had := "an unknown amount"
		if freeOK {
			had = fmt.Sprintf("%.1f MB", float64(free)/1e6)
		}
		return nil, fmt.Errorf("weights: disk full: the export to %s needs %.1f MB and %s was free when it began; the partial output is removed, nothing is at %s: free space or export elsewhere: %w",
			dir, float64(need)/1e6, had, dir, syscall.ENOSPC)
	}
	return files, err
}

// writeHF is WriteHF after the dtype is known to be good: size bytes per stored element.
func writeHF(dir string, e HFExport, size int) ([]string, error) {
	switch ents, err := os.ReadDir(dir); {
	case err == nil && len(ents) > 0:
		return nil, fmt.Errorf("weights: %s exists and is not empty (%d entries, e.g. %s): export writes a new directory", dir, len(ents), ents[0].Name())
	case err != nil && !errors.Is(err, fs.ErrNotExist):
		return nil, fmt.Errorf("weights: %w", err)
	}
	parent := filepath.Dir(filepath.Clean(dir))
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return nil, fmt.Errorf("weights: %w", err)
	}
	hooks := HFHooks{Temp: func(string) {}, Stale: func(string, int64) {}, Guard: func(_ bool, step func() error) error { return step() }}
	if e.Hooks != nil {
		hooks = *e.Hooks
	}
	prefix := "." + filepath.Base(filepath.Clean(dir)) + ".tmp-"
	var tmp string
	err := hooks.Guard(false, func() (err error) {
		if tmp, err = os.MkdirTemp(parent, prefix); err == nil {
			hooks.Temp(tmp)
		}
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("weights: %w", err)
	}
	// The temporary directory is locked (flock) while this export writes it, so another
	// export of dir tells a running export's directory from one a killed export left.
	held, err := os.Open(tmp)
	if err == nil {
		defer held.Close()
		_, err = ckpt.TryLock(held)
	}
	if err != nil {
		os.RemoveAll(tmp)
		return nil, fmt.Errorf("weights: lock %s: %w", tmp, err)
	}
	stale, _ := filepath.Glob(filepath.Join(parent, prefix+"*"))
	for _, p := range stale {
		if p == tmp || !unlocked(p) {
			continue
		}
		hooks.Stale(p, sysmem.TreeBytes(p))
		if err := os.RemoveAll(p); err != nil {
			os.RemoveAll(tmp)
			return nil, fmt.Errorf("weights: remove the partial export %s: %w", p, err)
		}
	}
	ok := false
	defer func() {
		if !ok {
			os.RemoveAll(tmp)
		}
	}()
	if err := os.Chmod(tmp, 0o755); err != nil {
		return nil, fmt.Errorf("weights: %w", err)
	}

	// Shards: consecutive tensors while they fit in MaxShardSize.
	var shards [][]safetensors.WTensor
	var cur int64
	for _, t := range e.Tensors {
		b := int64(len(t.Data) * size)
		if len(shards) == 0 || e.MaxShardSize > 0 && cur > 0 && cur+b > e.MaxShardSize {
			shards = append(shards, nil)
			cur = 0
		}
		shards[len(shards)-1] = append(shards[len(shards)-1], t)
		cur += b
	}
	var files []string
	write := func(name string, data []byte) error {
		if err := ckpt.WriteFileAtomic(filepath.Join(tmp, name), data); err != nil {
			return err
		}
		files = append(files, name)
		return nil
	}
	if err := write(HFConfigFile, e.Config); err != nil {
		return nil, err
	}
	weightMap := map[string]string{}
	var total int64
	for i, s := range shards {
		name := shardFile(i, len(shards))
		if err := safetensors.Write(filepath.Join(tmp, name), s, e.DType, map[string]string{"format": "pt"}); err != nil {
			return nil, err
		}
		files = append(files, name)
		for _, t := range s {
			weightMap[t.Name] = name
			total += int64(len(t.Data) * size)
		}
	}
	if len(shards) > 1 {
		index := struct {
			Metadata  map[string]int64  `json:"metadata"`
			WeightMap map[string]string `json:"weight_map"`
		}{map[string]int64{"total_size": total}, weightMap}
		js, err := json.MarshalIndent(index, "", "  ")
		if err != nil {
			return nil, fmt.Errorf("weights: %w", err)
		}
		if err := write(HFIndexFile, append(js, '\n')); err != nil {
			return nil, err
		}
	}
	for _, name := range slices.Sorted(maps.Keys(e.Copy)) {
		if name == "" || filepath.Base(name) != name {
			return nil, fmt.Errorf("weights: file to copy %q: want a plain file name", name)
		}
		data, err := os.ReadFile(e.Copy[name])
		if err != nil {
			return nil, fmt.Errorf("weights: copy %s: %w", name, err)
		}
		if err := write(name, data); err != nil {
			return nil, err
		}
	}
	if err := ckpt.SyncDir(tmp); err != nil {
		return nil, err
	}
	err = hooks.Guard(true, func() error { // the commit: before it nothing is at dir, after it dir is whole
		if err := os.Remove(dir); err != nil && !errors.Is(err, fs.ErrNotExist) { // an empty directory
			return err
		}
		if err := os.Rename(tmp, dir); err != nil {
			return err
		}
		ok = true
		hooks.Temp("") // renamed: nothing temporary is left
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("weights: %w", err)
	}
	if err := ckpt.SyncDir(parent); err != nil {
		return files, err
	}
	return files, nil
}

// RemoveTemp removes tmp, the temporary directory of a WriteHF that may still be writing into
// it (a signal handler's, which holds HFHooks.Guard's lock, so the writer cannot commit):
// while the writer makes a file in it between RemoveAll's reading and its removal of the
// directory, it tries again; once the directory is gone the writer can make nothing in it.
func RemoveTemp(tmp string) error {
	var err error
	for try := 0; try < 200; try++ {
		if err = os.RemoveAll(tmp); err == nil {
			return nil
		}
		time.Sleep(5 * time.Millisecond)
	}
	return err
}

// unlocked reports whether no process holds the lock of directory path (an export writing it).
func unlocked(path string) bool {
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	ok, err := ckpt.TryLock(f)
	return ok && err == nil
}
