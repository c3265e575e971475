// Package ckpt is distflash's own checkpoint format: one zstd file per rank and a checksummed
// manifest per step, committed atomically behind a `latest` pointer (BeginStep, WriteShard,
// Commit), verified on Open, readable by any new world size (Checkpoint.Read re-shards); the
// run directory's identity (run.json) and lock, and the file helpers other writers share
// (WriteFileAtomic, SyncDir, TryLock). Every other model format (Hugging Face directories,
// safetensors, export) is package weights'.
package ckpt

import (
	"bytes"
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// Version is the checkpoint format version this package writes and reads.
const Version = 1

// ManifestFile is the name of the manifest in a step directory.
const ManifestFile = "manifest.json"

// Manifest describes one checkpoint: what was trained (the config), where (step, world
// layout), which flat tensors it holds and where each element range lies in the rank
// files, and the small training state that is not a tensor.
type Manifest struct {
	// Checksum is the SHA-256 of manifest.json as written with this field set to 64
	// zeros; Commit sets it, Open verifies it. It comes first in the file.
	Checksum string    `json:"checksum"`
	Version  int       `json:"version"`
	Step     int       `json:"step"`
	Time     time.Time `json:"time"` // when Commit wrote it, UTC
	// Config is the run's whole configuration as JSON, after defaults and derived values
	// are filled in; CheckConfig compares it with the config of a resumed run.
	Config json.RawMessage `json:"config"`
	// ConfigHash is HashConfig(Config): it changes exactly when a key that must match
	// on resume changes.
	ConfigHash string       `json:"config_hash"`
	World      WorldLayout  `json:"world"`
	Tensors    []TensorInfo `json:"tensors"`
	// State is the training state that is not a tensor — data-loader position, RNG
	// state, loss scaler, LR schedule position — as the trainer encodes it; ckpt
	// stores it untouched.
	State json.RawMessage `json:"state"`
	// Run is the run that saved the checkpoint (zero in checkpoints of older versions).
	Run    RunID       `json:"run"`
	Shards []ShardInfo `json:"shards"` // one per rank, in rank order
}

// WorldLayout is how the ranks that wrote a checkpoint were arranged. Size is the number of
// shard files; a resumed run may use another layout (Read re-shards).
type WorldLayout struct {
	Size             int  `json:"size"`              // ranks in all
	SequenceParallel int  `json:"sequence_parallel"` // ranks sharing one sequence
	DataParallel     int  `json:"data_parallel"`     // replicas (Size / SequenceParallel)
	FSDP             bool `json:"fsdp"`              // parameters and optimizer state sharded
}

const checksumKey = `"checksum": "`

var zeroSum = strings.Repeat("0", 2*sha256.Size)

// encodeManifest renders m as manifest.json with its checksum filled in.
func encodeManifest(m Manifest) ([]byte, error) {
	m.Checksum = zeroSum
	b, err := json.MarshalIndent(m, "", " ")
	if err != nil {
		return nil, fmt.Errorf("ckpt: manifest of step %d: %w", m.Step, err)
	}
	b = append(b, '\n')
	i := bytes.Index(b, []byte(checksumKey+zeroSum+`"`))
	if i < 0 {
		return nil, fmt.Errorf("ckpt: manifest of step %d: checksum field not found", m.Step)
	}
	sum := sha256.Sum256(b)
	hex.Encode(b[i+len(checksumKey):], sum[:])
	return b, nil
}

// readManifest reads and checks path: the stored checksum must match the file's bytes
// before anything in it is believed.
func readManifest(path string) (Manifest, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return Manifest{}, fmt.Errorf("ckpt: %s: no %s: not a complete checkpoint", filepath.Dir(path), ManifestFile)
	}
	if err != nil {
		return Manifest{}, fmt.Errorf("ckpt: read manifest: %w", err)
	}
	i := bytes.Index(b, []byte(checksumKey))
	end := i + len(checksumKey) + 2*sha256.Size
	if i < 0 || end >= len(b) || b[end] != '"' {
		return Manifest{}, fmt.Errorf("ckpt: %s: no %s<64 hex digits>\" field: damaged or not a distflash manifest", path, checksumKey)
	}
	stored := string(b[i+len(checksumKey) : end])
	zeroed := bytes.Clone(b)
	copy(zeroed[i+len(checksumKey):], zeroSum)
	sum := sha256.Sum256(zeroed)
	if got := hex.EncodeToString(sum[:]); got != stored {
		return Manifest{}, fmt.Errorf("ckpt: %s: checksum mismatch: the file hashes to %s, it records %s: the manifest is damaged", path, got, stored)
	}
	var m Manifest
	if err := json.Unmarshal(b, &m); err != nil {
		return Manifest{}, fmt.Errorf("ckpt: %s: %w", path, err)
	}
	if m.Version != Version {
		return Manifest{}, fmt.Errorf("ckpt: %s: format version %d, this program reads version %d", path, m.Version, Version)
	}
	return m, nil
}

// validate checks that m is consistent: the world has Size shards in rank order, every
// piece lies inside its shard file and its tensor, and the pieces of all shards cover every
// tensor exactly once. Errors start with what (a path or a description) and name the
// shard file and tensor concerned.
func validate(what string, m Manifest) error {
	if m.World.Size < 1 {
		return fmt.Errorf("ckpt: %s: world size %d, want >= 1", what, m.World.Size)
	}
	if m.Step < 0 {
		return fmt.Errorf("ckpt: %s: step %d is negative", what, m.Step)
	}
	tensors := map[string]TensorInfo{}
	for _, t := range m.Tensors {
		if t.Name == "" {
			return fmt.Errorf("ckpt: %s: a tensor has no name", what)
		}
		if _, dup := tensors[t.Name]; dup {
			return fmt.Errorf("ckpt: %s: tensor %q listed twice", what, t.Name)
		}
		if t.DType != "f32" {
			return fmt.Errorf("ckpt: %s: tensor %q has dtype %q; this version stores \"f32\"", what, t.Name, t.DType)
		}
		if t.Len < 0 || t.Len > math.MaxInt64/4 {
			return fmt.Errorf("ckpt: %s: tensor %q has length %d", what, t.Name, t.Len)
		}
		tensors[t.Name] = t
	}
	if len(m.Shards) != m.World.Size {
		return fmt.Errorf("ckpt: %s: %d shards for a world of %d ranks", what, len(m.Shards), m.World.Size)
	}
	type span struct {
		off, n int64
		file   string
	}
	spans := map[string][]span{}
	for r, s := range m.Shards {
		if s.Rank != r || s.File != ShardFile(r) {
			return fmt.Errorf("ckpt: %s: shard %d is rank %d in file %q, want rank %d in %s", what, r, s.Rank, s.File, r, ShardFile(r))
		}
		if s.Encoding != Encoding {
			return fmt.Errorf("ckpt: %s: %s has encoding %q; this version reads %q", what, s.File, s.Encoding, Encoding)
		}
		at := int64(0)
		for _, p := range s.Pieces {
			t, ok := tensors[p.Tensor]
			if !ok {
				return fmt.Errorf("ckpt: %s: %s holds a piece of tensor %q, which the manifest does not list", what, s.File, p.Tensor)
			}
			if p.N <= 0 || p.Off < 0 || p.Off > t.Len || p.N > t.Len-p.Off {
				return fmt.Errorf("ckpt: %s: %s: piece [%d, %d) of tensor %q is outside its %d elements", what, s.File, p.Off, p.Off+p.N, p.Tensor, t.Len)
			}
			if p.N > MaxFrameElems {
				return fmt.Errorf("ckpt: %s: %s: piece [%d, %d) of tensor %q is one frame of %d elements: at most %d are read", what, s.File, p.Off, p.Off+p.N, p.Tensor, p.N, MaxFrameElems)
			}
			if p.At != at || p.Size <= 0 || p.Size > s.Size-at {
				return fmt.Errorf("ckpt: %s: %s: piece [%d, %d) of tensor %q is at byte %d size %d, want the next frame at byte %d", what, s.File, p.Off, p.Off+p.N, p.Tensor, p.At, p.Size, at)
			}
			at += p.Size
			spans[p.Tensor] = append(spans[p.Tensor], span{p.Off, p.N, s.File})
		}
		if at != s.Size {
			return fmt.Errorf("ckpt: %s: %s: its frames end at byte %d, its size is %d", what, s.File, at, s.Size)
		}
	}
	for _, t := range m.Tensors {
		ss := spans[t.Name]
		slices.SortFunc(ss, func(a, b span) int { return cmp.Compare(a.off, b.off) })
		next := int64(0)
		for i, s := range ss {
			if s.off > next {
				return fmt.Errorf("ckpt: %s: tensor %q: elements [%d, %d) are in no shard", what, t.Name, next, s.off)
			}
			if s.off < next {
				return fmt.Errorf("ckpt: %s: tensor %q: elements [%d, %d) are in both %s and %s", what, t.Name, s.off, min(next, s.off+s.n), ss[i-1].file, s.file)
			}
			next = s.off + s.n
		}
		if next != t.Len {
			return fmt.Errorf("ckpt: %s: tensor %q: elements [%d, %d) are in no shard", what, t.Name, next, t.Len)
		}
	}
	return nil
}
