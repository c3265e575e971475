package ckpt

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync"

	"github.com/klauspost/compress/zstd"

	"distflash/sysmem"
)

// Checkpoint is an opened, verified checkpoint. Its methods may be called from several
// goroutines at once (each rank of an in-process world reading its part).
type Checkpoint struct {
	dir   string
	m     Manifest
	index map[string][]ref // each tensor's frames, by element offset
	files []*os.File       // by rank
	dec   *zstd.Decoder
}

// ref is one frame of a tensor: which shard holds it and where.
type ref struct {
	rank int
	PieceInfo
}

// Open opens the checkpoint in path — a step directory, or a run directory, whose `latest`
// pointer then names the step — and verifies it before anything is read: the manifest's
// checksum and consistency (every tensor covered exactly once), and every shard file's
// presence, size and SHA-256. So a truncated, missing or altered file is found here, and the
// error names the file and the problem (all damaged files, when there are several). Close
// releases the open files.
func Open(path string) (*Checkpoint, error) {
	dir := path
	if _, err := os.Stat(filepath.Join(path, ManifestFile)); errors.Is(err, fs.ErrNotExist) {
		if _, lerr := os.Stat(filepath.Join(path, LatestFile)); lerr != nil {
			if _, derr := os.Stat(path); errors.Is(derr, fs.ErrNotExist) {
				return nil, fmt.Errorf("ckpt: %s does not exist: %s", path, holds(filepath.Dir(path)))
			} else if derr != nil {
				return nil, fmt.Errorf("ckpt: open checkpoint: %w", derr)
			}
			return nil, fmt.Errorf("ckpt: %s: neither a checkpoint (no %s) nor a run directory (no %s)", path, ManifestFile, LatestFile)
		}
		name, err := readLatest(path)
		if err != nil {
			return nil, err
		}
		dir = filepath.Join(path, name)
		if _, err := os.Stat(dir); errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("ckpt: %s names %s, which does not exist: %s", filepath.Join(path, LatestFile), name, holds(path))
		} else if err != nil {
			return nil, fmt.Errorf("ckpt: %s names %s: %w", filepath.Join(path, LatestFile), name, err)
		}
	}
	m, err := readManifest(filepath.Join(dir, ManifestFile))
	if err != nil {
		return nil, err
	}
	if err := validate(filepath.Join(dir, ManifestFile), m); err != nil {
		return nil, err
	}
	c := &Checkpoint{dir: dir, m: m, index: map[string][]ref{}, files: make([]*os.File, len(m.Shards))}
	if err := c.verifyShards(); err != nil {
		c.Close()
		return nil, err
	}
	maxN := int64(1)
	for r, s := range m.Shards {
		for _, p := range s.Pieces {
			c.index[p.Tensor] = append(c.index[p.Tensor], ref{r, p})
			maxN = max(maxN, p.N)
		}
	}
	for _, refs := range c.index {
		slices.SortFunc(refs, func(a, b ref) int { return cmp.Compare(a.Off, b.Off) })
	}
	c.dec, err = zstd.NewReader(nil, zstd.WithDecoderConcurrency(0), zstd.WithDecodeAllCapLimit(true),
		zstd.WithDecoderMaxMemory(uint64(4*maxN)+1<<20))
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("ckpt: open %s: %w", dir, err)
	}
	return c, nil
}

// verifyShards opens every shard file and checks its size and SHA-256 against the
// manifest, hashing several files at once. The files stay open for Read.
func (c *Checkpoint) verifyShards() error {
	errs := make([]error, len(c.m.Shards))
	sem := make(chan struct{}, runtime.GOMAXPROCS(0))
	var wg sync.WaitGroup
	for r, s := range c.m.Shards {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			c.files[r], errs[r] = verifyShard(filepath.Join(c.dir, s.File), s)
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

func verifyShard(path string, s ShardInfo) (*os.File, error) {
	if fi, err := os.Lstat(path); err == nil && !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("ckpt: %s: not a regular file (%s): a shard must be a file in the step directory, not a link", path, fi.Mode().Type())
	}
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("ckpt: %s: missing: the manifest lists it as rank %d's shard", path, s.Rank)
	}
	if err != nil {
		return nil, fmt.Errorf("ckpt: %w", err)
	}
	fail := func(format string, args ...any) (*os.File, error) {
		f.Close()
		return nil, fmt.Errorf("ckpt: %s: "+format, append([]any{path}, args...)...)
	}
	fi, err := f.Stat()
	if err != nil {
		return fail("%w", err)
	}
	if fi.Size() < s.Size {
		return fail("truncated: %d bytes, the manifest says %d", fi.Size(), s.Size)
	}
	if fi.Size() > s.Size {
		return fail("%d bytes, the manifest says %d", fi.Size(), s.Size)
	}
	h := sha256.New()
	if _, err := io.Copy(h, io.NewSectionReader(f, 0, s.Size)); err != nil {
		return fail("%w", err)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != s.SHA256 {
		return fail("checksum mismatch: sha256 %s, the manifest says %s: the file is damaged", got, s.SHA256)
	}
	return f, nil
}

// Close closes the shard files. The Checkpoint cannot be read after.
func (c *Checkpoint) Close() error {
	var errs []error
	for i, f := range c.files {
		if f != nil {
			errs = append(errs, f.Close())
			c.files[i] = nil
		}
	}
	if c.dec != nil {
		c.dec.Close()
	}
	return errors.Join(errs...)
}

// Dir returns the step directory the checkpoint is in.
func (c *Checkpoint) Dir() string { return c.dir }

// Manifest returns the checkpoint's manifest.
func (c *Checkpoint) Manifest() Manifest { return c.m }

// Tensor returns the description of the tensor called name.
func (c *Checkpoint) Tensor(name string) (TensorInfo, bool) {
	for _, t := range c.m.Tensors {
		if t.Name == name {
			return t, true
		}
	}
	return TensorInfo{}, false
}

// Read fills dst with elements [off, off+len(dst)) of tensor, from whichever shard files
// hold them, whatever world size wrote them: this is how a run resumes on another number of
// ranks. Only the frames that overlap the range are read and decompressed; each frame's
// CRC-32C is checked again, so a file changed after Open is still caught.
func (c *Checkpoint) Read(tensor string, off int64, dst []float32) error {
	t, ok := c.Tensor(tensor)
	if !ok {
		return fmt.Errorf("ckpt: %s: no tensor %q", c.dir, tensor)
	}
	end := off + int64(len(dst))
	if off < 0 || end > t.Len {
		return fmt.Errorf("ckpt: %s: read %s[%d:%d]: outside its %d elements", c.dir, tensor, off, end, t.Len)
	}
	refs := c.index[tensor]
	i := sort.Search(len(refs), func(i int) bool { return refs[i].Off+refs[i].N > off })
	for ; i < len(refs) && refs[i].Off < end; i++ {
		if err := c.readFrame(refs[i], off, dst); err != nil {
			return err
		}
	}
	return nil
}

// readFrame decompresses frame r and copies its overlap with elements [off, off+len(dst))
// into dst.
func (c *Checkpoint) readFrame(r ref, off int64, dst []float32) error {
	f := c.files[r.rank]
	path := filepath.Join(c.dir, c.m.Shards[r.rank].File)
	if f == nil {
		return fmt.Errorf("ckpt: read %s: the checkpoint is closed", path)
	}
	where := func() string {
		return fmt.Sprintf("%s: frame %s[%d:%d] at byte %d", path, r.Tensor, r.Off, r.Off+r.N, r.At)
	}
	comp := getBuf(int(r.Size))
	defer putBuf(comp)
	if _, err := f.ReadAt(comp, r.At); err != nil {
		return fmt.Errorf("ckpt: %s: %w", where(), err)
	}
	if got := crc32.Checksum(comp, castagnoli); got != r.CRC32C {
		return fmt.Errorf("ckpt: %s: CRC-32C %08x, the manifest says %08x: the file changed after it was opened", where(), got, r.CRC32C)
	}
	planes, err := c.dec.DecodeAll(comp, getBuf(int(4 * r.N))[:0])
	defer putBuf(planes)
	if err != nil {
		return fmt.Errorf("ckpt: %s: %w", where(), err)
	}
	if int64(len(planes)) != 4*r.N {
		return fmt.Errorf("ckpt: %s: %d bytes decompressed, want %d", where(), len(planes), 4*r.N)
	}
	lo := max(r.Off, off)
	hi := min(r.Off+r.N, off+int64(len(dst)))
	fromPlanes(planes, int(r.N), int(lo-r.Off), dst[lo-off:hi-off])
	return nil
}

// ReadTensor returns the whole tensor called name.
func (c *Checkpoint) ReadTensor(name string) ([]float32, error) {
	t, ok := c.Tensor(name)
	if !ok {
		return nil, fmt.Errorf("ckpt: %s: no tensor %q", c.dir, name)
	}
	if err := sysmem.Check(fmt.Sprintf("ckpt: %s: tensor %q of %d elements", c.dir, name, t.Len), 4*float64(t.Len)); err != nil {
		return nil, err
	}
	dst := make([]float32, t.Len)
	return dst, c.Read(name, 0, dst)
}

// holds says which checkpoints directory dir holds, for an error that names one it does not:
// its step directories, newest first (the first few), and which is `latest`.
func holds(dir string) string {
	names, err := stepDirs(dir)
	switch {
	case err != nil:
		return err.Error()
	case len(names) == 0:
		if _, err := os.Stat(dir); err != nil {
			return dir + " does not exist"
		}
		return dir + " holds no checkpoint"
	}
	const most = 5
	list := strings.Join(names[:min(len(names), most)], ", ")
	if len(names) > most {
		list += fmt.Sprintf(" and %d older", len(names)-most)
	}
	if latest, err := readLatest(dir); err == nil {
		list += "; `latest` is " + latest
	}
	return fmt.Sprintf("%s holds %s (--resume auto takes the newest intact one)", dir, list)
}

// Resolve implements --resume. spec "" means no resume: ("", nil, nil). spec "auto" means
// the newest intact checkpoint under runDir: the step `latest` names if it verifies,
// otherwise the older step directories, newest first, until one verifies; skipped lists
// why each checkpoint passed over was (so the caller can say so), and a run directory
// with no checkpoint at all gives ("", nil, nil). Unfinished saves (step-*.tmp) are never
// considered. Any other spec is a checkpoint or run directory that must verify: its
// error is returned, with no fallback. path is the step directory.
//
// Resolve verifies by opening; ResolveOpen returns the opened checkpoint instead, which
// saves reading every shard a second time.
func Resolve(runDir, spec string) (path string, skipped []error, err error) {
	c, skipped, err := ResolveOpen(runDir, spec)
	if c == nil {
		return "", skipped, err
	}
	c.Close()
	return c.Dir(), skipped, err
}

// ResolveOpen is Resolve returning the opened checkpoint (nil when there is none).
func ResolveOpen(runDir, spec string) (*Checkpoint, []error, error) {
	return ResolveOpenRun(runDir, spec, RunID{})
}

// ResolveOpenRun is ResolveOpen for the run run: with spec "auto" it passes over the
// checkpoints another run saved (a *ForeignError in skipped for each), so that a checkpoint
// directory two runs share never continues one from the other's checkpoint. A zero run
// accepts every checkpoint. A checkpoint named by its path is opened whoever saved it.
func ResolveOpenRun(runDir, spec string, run RunID) (*Checkpoint, []error, error) {
	switch spec {
	case "":
		return nil, nil, nil
	case "auto":
	default:
		c, err := Open(spec)
		return c, nil, err
	}
	names, err := stepDirs(runDir)
	if err != nil {
		return nil, nil, err
	}
	var skipped []error
	damaged := false
	// foreign reports (and records) a checkpoint of another run.
	foreign := func(dir string) bool {
		if run.ID == "" {
			return false
		}
		m, err := readManifest(filepath.Join(dir, ManifestFile))
		if err != nil || belongs(m.Run, run) { // a damaged manifest is Open's to report
			return false
		}
		skipped = append(skipped, &ForeignError{Dir: dir, Owner: m.Run, Run: run})
		return true
	}
	older := -1 // with a readable latest, fall back only to steps older than it
	latest, lerr := readLatest(runDir)
	switch {
	case lerr == nil:
		dir := filepath.Join(runDir, latest)
		if foreign(dir) {
			break
		}
		c, err := Open(dir)
		if err == nil {
			return c, nil, nil
		}
		skipped = append(skipped, fmt.Errorf("%s names %s: %w", filepath.Join(runDir, LatestFile), latest, err))
		damaged = true
		older = parseStepDir(latest)
	case !errors.Is(lerr, fs.ErrNotExist):
		skipped = append(skipped, lerr)
		damaged = true
	}
	for _, n := range names {
		dir := filepath.Join(runDir, n)
		if older >= 0 && parseStepDir(n) >= older || n == latest && lerr == nil || foreign(dir) {
			continue
		}
		c, err := Open(dir)
		if err == nil {
			return c, skipped, nil
		}
		skipped = append(skipped, err)
		damaged = true
	}
	if damaged {
		return nil, skipped, fmt.Errorf("ckpt: no intact checkpoint in %s: %w", runDir, errors.Join(skipped...))
	}
	return nil, skipped, nil
}
