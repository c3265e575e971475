package ckpt

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"sync"

	"github.com/klauspost/compress/zstd"
)

// Piece is elements [Off, Off+len(Data)) of the flat global tensor named Tensor: the part of
// it that one rank saves.
type Piece struct {
	Tensor string
	Off    int64
	Data   []float32
}

// TensorInfo describes one flat global tensor of a checkpoint.
type TensorInfo struct {
	Name  string `json:"name"`
	Len   int64  `json:"len"`   // elements
	DType string `json:"dtype"` // "f32" (the only one this version stores)
}

// Options control how WriteShard encodes a shard.
type Options struct {
	// Level is the zstd compression level, 1..22 as the zstd command line counts them
	// (config checkpoint.compression_level); 0 means DefaultLevel. The encoder has four
	// strengths, so levels map to them in bands: 1–2 fastest, 3–5 default, 6–9 better,
	// 10–22 best (about zstd levels 1, 3, 7 and 11). On trained-like float32 state the
	// ratio barely moves (about 1.17 for parameters at every level, 1.19 at best) while
	// best is ten times slower, so the default is the sensible choice; see BenchmarkSave.
	Level int
	// FrameElems is the most elements one zstd frame holds; 0 means DefaultFrameElems.
	// Read decompresses whole frames, so smaller frames make small reads cheaper and
	// the index longer.
	FrameElems int
	// Workers is how many frames are compressed at once; 0 means GOMAXPROCS. Each holds
	// WorkerBytes(FrameElems) while it compresses.
	Workers int
}

// ProcessWorkers is how many frames a training process compresses at once over all the
// shards its ranks write together (the ranks share them; each has one at least), so that the
// writer's memory is bounded whatever the machine's cores: WorkerBytes each.
const ProcessWorkers = 4

// window is the zstd window: frames are compressed apart (EncodeAll), and a match further
// back than 1 MiB in a float32 byte plane is rare, so the ratio is the same as at the
// default 8 MiB at every level (BenchmarkSave) while the encoder's history buffer is the
// frame's size instead of 16 MiB.
const window = 1 << 20

// WorkerBytes is the memory one compressing worker holds for a frame of frameElems float32
// (0 means DefaultFrameElems): the byte planes, the encoder's history of them and the
// compressed output (each at most the frame's 4 bytes an element), and the encoder's match
// tables (under 2 MiB at every level).
func WorkerBytes(frameElems int) int64 {
	if frameElems <= 0 {
		frameElems = DefaultFrameElems
	}
	return 3*4*int64(frameElems) + 2<<20
}

// DefaultLevel is the compression level used when Options.Level is 0.
const DefaultLevel = 3

// DefaultFrameElems is the frame size used when Options.FrameElems is 0: 4 MiB of float32.
const DefaultFrameElems = 1 << 20

// MaxFrameElems is the most elements a frame may hold (1 GiB of float32): Open refuses a
// manifest with a larger frame, whose decompression would need that much memory at once.
const MaxFrameElems = 1 << 28

// Encoding names how a shard file stores float32 values: each frame holds one piece's
// values as 4 byte planes (all lowest bytes of the little-endian float32 values, then all
// second bytes, …) compressed as one zstd frame. Splitting the planes lets zstd compress
// the sign and exponent bytes, which it cannot find when the bytes are interleaved.
const Encoding = "f32-byteplanes-zstd"

// ShardInfo is the index of one rank's shard file: its name, size and SHA-256, and where
// each piece's frame lies in it. WriteShard returns it and stores it beside the shard as
// rank-RRRRR.json; Commit copies every rank's ShardInfo into the manifest.
type ShardInfo struct {
	Rank     int         `json:"rank"`
	File     string      `json:"file"` // base name, rank-RRRRR.zst
	Size     int64       `json:"size"` // bytes
	SHA256   string      `json:"sha256"`
	Encoding string      `json:"encoding"`
	Level    int         `json:"level"`
	Pieces   []PieceInfo `json:"pieces"`
}

// PieceInfo is one frame of a shard file: elements [Off, Off+N) of Tensor, stored as Size
// compressed bytes starting at byte At of the file, whose CRC-32C is CRC32C.
type PieceInfo struct {
	Tensor string `json:"tensor"`
	Off    int64  `json:"off"`
	N      int64  `json:"n"`
	At     int64  `json:"at"`
	Size   int64  `json:"size"`
	CRC32C uint32 `json:"crc32c"`
}

// ShardFile is the name of rank's shard file in a step directory.
func ShardFile(rank int) string { return fmt.Sprintf("rank-%05d.zst", rank) }

// sidecarFile is the name of the file WriteShard leaves its ShardInfo in.
func sidecarFile(rank int) string { return fmt.Sprintf("rank-%05d.json", rank) }

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// encoderLevel maps a zstd command-line level to the encoder's strengths.
func encoderLevel(level int) (int, zstd.EncoderLevel, error) {
	if level == 0 {
		level = DefaultLevel
	}
	if level < 1 || level > 22 {
		return 0, 0, fmt.Errorf("ckpt: compression level %d: want 1..22 (0 = %d)", level, DefaultLevel)
	}
	return level, zstd.EncoderLevelFromZstd(level), nil
}

// frame is one frame to write: a run of at most FrameElems values of one piece.
type frame struct {
	tensor string
	off    int64
	data   []float32
}

// compressed is a frame after compression.
type compressed struct {
	frame
	bytes []byte
}

// WriteShard writes rank's pieces into dir, the step's temporary directory from BeginStep:
// one file rank-RRRRR.zst holding every piece as zstd frames of at most opt.FrameElems
// elements (see Encoding), then the index of those frames with the file's size and SHA-256
// as rank-RRRRR.json. Both are fsynced, and the index is written under a temporary name and
// renamed, so its presence means the shard is complete. Pieces may come in any order and
// need not be contiguous; empty pieces are skipped. Ranks may call WriteShard at the same
// time, from goroutines or from processes sharing dir.
func WriteShard(dir string, rank int, pieces []Piece, opt Options) (ShardInfo, error) {
	level, elevel, err := encoderLevel(opt.Level)
	if err != nil {
		return ShardInfo{}, err
	}
	if rank < 0 {
		return ShardInfo{}, fmt.Errorf("ckpt: WriteShard: rank %d is negative", rank)
	}
	frameElems := opt.FrameElems
	if frameElems == 0 {
		frameElems = DefaultFrameElems
	}
	if frameElems < 0 || frameElems > MaxFrameElems {
		return ShardInfo{}, fmt.Errorf("ckpt: WriteShard: FrameElems %d: want 0 to %d", frameElems, MaxFrameElems)
	}
	workers := opt.Workers
	if workers <= 0 {
		workers = runtime.GOMAXPROCS(0)
	}
	var frames []frame
	for i, p := range pieces {
		if p.Tensor == "" || p.Off < 0 {
			return ShardInfo{}, fmt.Errorf("ckpt: WriteShard rank %d: piece %d (tensor %q, offset %d): want a tensor name and an offset >= 0", rank, i, p.Tensor, p.Off)
		}
		for lo := 0; lo < len(p.Data); lo += frameElems {
			hi := min(lo+frameElems, len(p.Data))
			frames = append(frames, frame{p.Tensor, p.Off + int64(lo), p.Data[lo:hi]})
		}
	}

	enc, err := zstd.NewWriter(nil, zstd.WithEncoderLevel(elevel), zstd.WithEncoderConcurrency(workers),
		zstd.WithEncoderCRC(true), zstd.WithWindowSize(window), zstd.WithZeroFrames(true))
	if err != nil {
		return ShardInfo{}, fmt.Errorf("ckpt: WriteShard rank %d: %w", rank, err)
	}
	defer enc.Close()

	name := ShardFile(rank)
	path := filepath.Join(dir, name)
	f, err := os.Create(path)
	if err != nil {
		return ShardInfo{}, fmt.Errorf("ckpt: WriteShard rank %d: %w", rank, err)
	}
	info := ShardInfo{Rank: rank, File: name, Encoding: Encoding, Level: level, Pieces: []PieceInfo{}}
	sum := sha256.New()
	w := io.MultiWriter(f, sum)

	// Compress up to workers frames at once and write them in order: the queue holds
	// one result channel per frame, in file order, and bounds the frames in flight.
	queue := make(chan chan compressed, workers)
	go func() {
		for _, fr := range frames {
			c := make(chan compressed, 1)
			queue <- c
			go func() {
				planes := toPlanes(fr.data, getBuf(4*len(fr.data)))
				out := enc.EncodeAll(planes, make([]byte, 0, len(planes)/8*7))
				putBuf(planes)
				c <- compressed{fr, out}
			}()
		}
		close(queue)
	}()
	var werr error
	for c := range queue {
		cf := <-c
		if werr != nil {
			continue // drain the queue so its goroutines finish
		}
		if _, err := w.Write(cf.bytes); err != nil {
			werr = err
			continue
		}
		info.Pieces = append(info.Pieces, PieceInfo{Tensor: cf.tensor, Off: cf.off, N: int64(len(cf.data)),
			At: info.Size, Size: int64(len(cf.bytes)), CRC32C: crc32.Checksum(cf.bytes, castagnoli)})
		info.Size += int64(len(cf.bytes))
	}
	if werr == nil {
		werr = f.Sync()
	}
	if err := f.Close(); werr == nil {
		werr = err
	}
	if werr != nil {
		return ShardInfo{}, fmt.Errorf("ckpt: write %s: %w", path, werr)
	}
	info.SHA256 = hex.EncodeToString(sum.Sum(nil))

	js, err := json.MarshalIndent(info, "", " ")
	if err != nil {
		return ShardInfo{}, fmt.Errorf("ckpt: WriteShard rank %d: %w", rank, err)
	}
	if err := writeFileAtomic(filepath.Join(dir, sidecarFile(rank)), append(js, '\n'), nil); err != nil {
		return ShardInfo{}, err
	}
	if err := SyncDir(dir); err != nil {
		return ShardInfo{}, err
	}
	if err := hook(stageShardWritten); err != nil {
		return ShardInfo{}, err
	}
	return info, nil
}

// toPlanes stores x's float32 bits as 4 byte planes in b (len 4·len(x)): plane p holds byte p
// (little-endian) of every value.
func toPlanes(x []float32, b []byte) []byte {
	n := len(x)
	p0, p1, p2, p3 := b[:n], b[n:2*n], b[2*n:3*n], b[3*n:4*n]
	for i, v := range x {
		u := math.Float32bits(v)
		p0[i], p1[i], p2[i], p3[i] = byte(u), byte(u>>8), byte(u>>16), byte(u>>24)
	}
	return b
}

// fromPlanes reads elements [lo, lo+len(dst)) of the n values stored as byte planes in b.
func fromPlanes(b []byte, n int, lo int, dst []float32) {
	p0, p1, p2, p3 := b[lo:lo+len(dst)], b[n+lo:n+lo+len(dst)], b[2*n+lo:2*n+lo+len(dst)], b[3*n+lo:3*n+lo+len(dst)]
	for i := range dst {
		dst[i] = math.Float32frombits(uint32(p0[i]) | uint32(p1[i])<<8 | uint32(p2[i])<<16 | uint32(p3[i])<<24)
	}
}

var bufPool sync.Pool // *[]byte scratch buffers for byte planes

func getBuf(n int) []byte {
	if p, ok := bufPool.Get().(*[]byte); ok && cap(*p) >= n {
		return (*p)[:n]
	}
	return make([]byte, n)
}

func putBuf(b []byte) { bufPool.Put(&b) }

// WriteFileAtomic writes data to path through a temporary name in the same directory (write,
// fsync, rename): a reader, or a crash at any moment, sees the old file or the whole new one.
func WriteFileAtomic(path string, data []byte) error { return writeFileAtomic(path, data, nil) }

// writeFileAtomic writes data to path through a temporary name in the same directory:
// write, fsync, rename. A reader sees the old file or the whole new one, never a part.
// beforeRename, if not nil, runs between the fsync and the rename (Commit's stage hook).
func writeFileAtomic(path string, data []byte, beforeRename func() error) error {
	tmp := path + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return fmt.Errorf("ckpt: write %s: %w", path, err)
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("ckpt: write %s: %w", tmp, err)
	}
	if beforeRename != nil {
		if err := beforeRename(); err != nil {
			return err
		}
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("ckpt: write %s: %w", path, err)
	}
	return nil
}

// CheckWritable says, before the data to write exists, why WriteFileAtomic(path, …) would
// fail: path is a directory, its directory is missing or not one, or no file can be made in
// it (a file is made there and removed). nil when it would not.
func CheckWritable(path string) error {
	if fi, err := os.Stat(path); err == nil && fi.IsDir() {
		return errors.New("a directory: want the name of a file to write")
	}
	dir := filepath.Dir(path)
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		return fmt.Errorf("no directory %s to write it in", dir)
	}
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".check-*")
	if err != nil {
		return fmt.Errorf("cannot write in %s: %w", dir, err)
	}
	f.Close()
	return os.Remove(f.Name())
}

// SyncDir fsyncs a directory, making the renames and creations in it durable.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("ckpt: sync %s: %w", dir, err)
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("ckpt: sync %s: %w", dir, err)
	}
	return nil
}

// Chunk returns the element range [lo, hi) of part i when n elements are split into parts
// contiguous parts as evenly as possible (the first n mod parts parts hold one more): the
// range rank i of a world of parts ranks saves of a replicated tensor, or reads back after
// re-sharding.
func Chunk(n int64, parts, i int) (lo, hi int64) {
	p, k := int64(parts), int64(i)
	q, r := n/p, n%p
	lo = k*q + min(k, r)
	hi = lo + q
	if k < r {
		hi++
	}
	return lo, hi
}
