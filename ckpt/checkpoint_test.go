package ckpt

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
)

// state is a small training state of the kind that trainers store in Manifest.State.
type state struct {
	Loader struct{ Epoch, Index int64 } `json:"loader"`
	RNG    []uint64                     `json:"rng"`
	Scale  float64                      `json:"loss_scale"`
}

// testConfig is a run config in the shape the trainer passes: sections as objects.
func testConfig(dim int, steps int) json.RawMessage {
	return json.RawMessage(fmt.Sprintf(`{"model":{"dim":%d,"n_layers":2,"norm_eps":1e-05},"data":{"tokenizer":"byte","seq_len":128},"training":{"steps":%d},"parallelism":{"world_size":4}}`, dim, steps))
}

// tensorSet is the flat global tensors of a training state.
type tensorSet struct {
	infos []TensorInfo
	data  map[string][]float32
}

// newTensors makes tensors with the given lengths, filled with values seeded by seed: normal
// values plus the special ones that must survive bit-exactly (±0, ±Inf, NaN, subnormals).
func newTensors(seed uint64, lens map[string]int) tensorSet {
	r := rand.New(rand.NewPCG(seed, 7))
	ts := tensorSet{data: map[string][]float32{}}
	names := slices.Sorted(maps.Keys(lens))
	special := []float32{0, float32(math.Copysign(0, -1)), float32(math.Inf(1)), float32(math.Inf(-1)),
		float32(math.NaN()), math.Float32frombits(1), math.MaxFloat32}
	for _, n := range names {
		x := make([]float32, lens[n])
		for i := range x {
			x[i] = float32(r.NormFloat64() * 0.02)
			if r.IntN(50) == 0 {
				x[i] = special[r.IntN(len(special))]
			}
		}
		ts.infos = append(ts.infos, TensorInfo{Name: n, Len: int64(len(x)), DType: "f32"})
		ts.data[n] = x
	}
	return ts
}

// randomPieces cuts every tensor into pieces at random points and deals them to random
// ranks (a rank may get none).
func randomPieces(r *rand.Rand, ts tensorSet, world int) [][]Piece {
	out := make([][]Piece, world)
	for _, t := range ts.infos {
		x := ts.data[t.Name]
		for lo := 0; lo < len(x); {
			hi := min(len(x), lo+1+r.IntN(len(x)/3+1))
			rank := r.IntN(world)
			out[rank] = append(out[rank], Piece{t.Name, int64(lo), x[lo:hi]})
			lo = hi
		}
	}
	for _, ps := range out { // pieces in any order
		r.Shuffle(len(ps), func(i, j int) { ps[i], ps[j] = ps[j], ps[i] })
	}
	return out
}

// chunkPieces gives rank r chunk r of every tensor, as replicated training state is saved.
func chunkPieces(ts tensorSet, world int) [][]Piece {
	out := make([][]Piece, world)
	for _, t := range ts.infos {
		for r := range world {
			lo, hi := Chunk(t.Len, world, r)
			if hi > lo {
				out[r] = append(out[r], Piece{t.Name, lo, ts.data[t.Name][lo:hi]})
			}
		}
	}
	return out
}

// save writes one checkpoint the way a world of len(pieces) in-process ranks does: every
// rank's WriteShard at once, then Commit.
func save(t testing.TB, runDir string, step int, ts tensorSet, pieces [][]Piece, opt Options, keep int) (string, error) {
	t.Helper()
	tmp, err := BeginStep(runDir, step)
	if err != nil {
		t.Fatal(err)
	}
	errs := make([]error, len(pieces))
	var wg sync.WaitGroup
	for r := range pieces {
		wg.Go(func() { _, errs[r] = WriteShard(tmp, r, pieces[r], opt) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	var st state
	st.Loader.Epoch, st.Loader.Index = 2, int64(step)
	st.RNG = []uint64{uint64(step), math.MaxUint64}
	st.Scale = 65536
	sj, _ := json.Marshal(st)
	m := Manifest{Step: step, Config: testConfig(64, 1000), Tensors: ts.infos, State: sj,
		World: WorldLayout{Size: len(pieces), SequenceParallel: len(pieces), DataParallel: 1}}
	return Commit(runDir, tmp, m, keep)
}

func mustSave(t testing.TB, runDir string, step int, ts tensorSet, pieces [][]Piece, opt Options, keep int) string {
	t.Helper()
	path, err := save(t, runDir, step, ts, pieces, opt, keep)
	if err != nil {
		t.Fatal(err)
	}
	return path
}

// sameBits reports the first index where got and want differ bit for bit, or -1.
func sameBits(got, want []float32) int {
	for i := range want {
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			return i
		}
	}
	return -1
}

// checkContents opens path and checks every tensor is ts, bit for bit.
func checkContents(t *testing.T, path string, ts tensorSet) *Checkpoint {
	t.Helper()
	c, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	for _, ti := range ts.infos {
		got, err := c.ReadTensor(ti.Name)
		if err != nil {
			t.Fatal(err)
		}
		if i := sameBits(got, ts.data[ti.Name]); i >= 0 {
			t.Fatalf("%s: %s[%d] = %v, want %v", path, ti.Name, i, got[i], ts.data[ti.Name][i])
		}
	}
	return c
}

func TestRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		world, frame, level int
	}{
		{1, 0, 0}, {2, 7, 1}, {3, 64, 3}, {4, 5, 7}, {5, 1000, 19}, {8, 3, 22},
	} {
		t.Run(fmt.Sprintf("world=%d,frame=%d,level=%d", tc.world, tc.frame, tc.level), func(t *testing.T) {
			r := rand.New(rand.NewPCG(uint64(tc.world), uint64(tc.level)))
			ts := newTensors(uint64(tc.world), map[string]int{"params": 1000 + r.IntN(500), "adam.m": 700, "adam.v": 1, "empty": 0})
			runDir := t.TempDir()
			path := mustSave(t, runDir, 42, ts, randomPieces(r, ts, tc.world), Options{Level: tc.level, FrameElems: tc.frame}, 0)
			if path != filepath.Join(runDir, "step-000042") {
				t.Errorf("Commit returned %s", path)
			}
			c := checkContents(t, path, ts)
			m := c.Manifest()
			if m.Step != 42 || m.Version != Version || m.World.Size != tc.world || !slices.Equal(m.Tensors, ts.infos) {
				t.Errorf("manifest step %d version %d world %+v tensors %v", m.Step, m.Version, m.World, m.Tensors)
			}
			var st state
			if err := json.Unmarshal(m.State, &st); err != nil || st.Loader.Index != 42 || st.RNG[1] != math.MaxUint64 || st.Scale != 65536 {
				t.Errorf("state %s: %+v %v", m.State, st, err)
			}
			if want, _ := HashConfig(testConfig(64, 1000)); m.ConfigHash != want || m.Time.IsZero() {
				t.Errorf("config hash %s, want %s; time %v", m.ConfigHash, want, m.Time)
			}
			// The step directory holds the manifest and one file per rank, nothing else;
			// latest names it.
			entries, _ := os.ReadDir(path)
			var names []string
			for _, e := range entries {
				names = append(names, e.Name())
			}
			want := []string{ManifestFile}
			for r := range tc.world {
				want = append(want, ShardFile(r))
			}
			slices.Sort(want)
			if !slices.Equal(names, want) {
				t.Errorf("step directory holds %v, want %v", names, want)
			}
			if got, _ := os.ReadFile(filepath.Join(runDir, LatestFile)); string(got) != "step-000042\n" {
				t.Errorf("latest = %q", got)
			}
			if p, skipped, err := Resolve(runDir, "auto"); p != path || skipped != nil || err != nil {
				t.Errorf("Resolve auto = %s %v %v", p, skipped, err)
			}
		})
	}
}

// TestReshard writes with 4 ranks, each its chunk, and reads back as other world sizes
// would and at random ranges, across frame and shard boundaries, from several goroutines.
func TestReshard(t *testing.T) {
	ts := newTensors(3, map[string]int{"params": 1001, "adam.m": 1001, "adam.v": 1001})
	path := mustSave(t, t.TempDir(), 7, ts, chunkPieces(ts, 4), Options{FrameElems: 10}, 0)
	c := checkContents(t, path, ts)
	for _, world := range []int{1, 2, 3, 5, 8} {
		var wg sync.WaitGroup
		for rank := range world {
			wg.Go(func() {
				for _, ti := range ts.infos {
					lo, hi := Chunk(ti.Len, world, rank)
					got := make([]float32, hi-lo)
					if err := c.Read(ti.Name, lo, got); err != nil {
						t.Error(err)
						return
					}
					if i := sameBits(got, ts.data[ti.Name][lo:hi]); i >= 0 {
						t.Errorf("world %d rank %d: %s[%d] wrong", world, rank, ti.Name, lo+int64(i))
					}
				}
			})
		}
		wg.Wait()
	}
	r := rand.New(rand.NewPCG(1, 1))
	boundary := int64(251) // rank 0's chunk is [0, 251): reads around it span two files
	for k := range 300 {
		ti := ts.infos[r.IntN(len(ts.infos))]
		lo := r.Int64N(ti.Len + 1)
		if k%3 == 0 {
			lo = max(0, boundary-r.Int64N(15))
		}
		hi := lo + r.Int64N(ti.Len-lo+1)
		got := make([]float32, hi-lo)
		if err := c.Read(ti.Name, lo, got); err != nil {
			t.Fatal(err)
		}
		if i := sameBits(got, ts.data[ti.Name][lo:hi]); i >= 0 {
			t.Fatalf("%s[%d:%d]: element %d wrong", ti.Name, lo, hi, lo+int64(i))
		}
	}
}

func TestChunk(t *testing.T) {
	for _, n := range []int64{0, 1, 7, 10, 1001} {
		for parts := 1; parts <= 9; parts++ {
			next := int64(0)
			for i := range parts {
				lo, hi := Chunk(n, parts, i)
				if lo != next || hi-lo < n/int64(parts) || hi-lo > n/int64(parts)+1 {
					t.Fatalf("Chunk(%d, %d, %d) = [%d, %d), previous ended at %d", n, parts, i, lo, hi, next)
				}
				next = hi
			}
			if next != n {
				t.Fatalf("Chunk(%d, %d, ·) ends at %d", n, parts, next)
			}
		}
	}
}

func TestReadErrors(t *testing.T) {
	ts := newTensors(1, map[string]int{"params": 100})
	c := checkContents(t, mustSave(t, t.TempDir(), 1, ts, chunkPieces(ts, 2), Options{}, 0), ts)
	for _, tc := range []struct {
		tensor string
		off    int64
		n      int
		want   string
	}{
		{"nope", 0, 1, `no tensor "nope"`},
		{"params", -1, 1, "outside its 100 elements"},
		{"params", 90, 11, "read params[90:101]: outside"},
	} {
		err := c.Read(tc.tensor, tc.off, make([]float32, tc.n))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Read(%s, %d, %d) = %v, want %q", tc.tensor, tc.off, tc.n, err, tc.want)
		}
	}
	// Changing a shard after Open is caught by the frame's CRC.
	f := filepath.Join(c.Dir(), ShardFile(1))
	b, _ := os.ReadFile(f)
	b[len(b)/2] ^= 1
	os.WriteFile(f, b, 0o644)
	err := c.Read("params", 0, make([]float32, 100))
	if err == nil || !strings.Contains(err.Error(), "CRC-32C") || !strings.Contains(err.Error(), f) {
		t.Errorf("Read of a changed file: %v", err)
	}
	c.Close()
	if err := c.Read("params", 0, make([]float32, 1)); err == nil || !strings.Contains(err.Error(), "closed") {
		t.Errorf("Read after Close: %v", err)
	}
}

func TestWriteShardErrors(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		rank   int
		pieces []Piece
		opt    Options
		want   string
	}{
		{0, nil, Options{Level: 23}, "compression level 23: want 1..22"},
		{0, nil, Options{Level: -1}, "compression level -1"},
		{-1, nil, Options{}, "rank -1 is negative"},
		{0, []Piece{{"", 0, []float32{1}}}, Options{}, "want a tensor name"},
		{0, []Piece{{"x", -3, []float32{1}}}, Options{}, "offset -3"},
		{0, nil, Options{FrameElems: -1}, "FrameElems -1"},
	} {
		if _, err := WriteShard(dir, tc.rank, tc.pieces, tc.opt); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("WriteShard(rank %d, %v, %+v) = %v, want %q", tc.rank, tc.pieces, tc.opt, err, tc.want)
		}
	}
	if _, err := WriteShard(filepath.Join(dir, "missing"), 0, nil, Options{}); err == nil || !strings.Contains(err.Error(), "missing") {
		t.Errorf("WriteShard into a missing directory: %v", err)
	}
}

func TestCommitErrors(t *testing.T) {
	ts := newTensors(1, map[string]int{"params": 100, "adam.m": 100})
	for _, tc := range []struct {
		name   string
		pieces func() [][]Piece // pieces per rank; a nil rank does not call WriteShard
		edit   func(m *Manifest, tmp string) string
		want   string
	}{
		{"rank missing", func() [][]Piece { p := chunkPieces(ts, 3); p[2] = nil; return p }, nil,
			"rank 2 did not finish its shard: rank-00002.json is missing"},
		{"gap", func() [][]Piece { p := chunkPieces(ts, 2); p[1] = p[1][:1]; return p }, nil,
			`tensor "params": elements [50, 100) are in no shard`},
		{"overlap", func() [][]Piece {
			p := chunkPieces(ts, 2)
			p[1] = append(p[1], Piece{"params", 40, ts.data["params"][40:60]})
			return p
		}, nil, `tensor "params": elements [40, 50) are in both rank-00000.zst and rank-00001.zst`},
		{"unknown tensor", func() [][]Piece {
			p := chunkPieces(ts, 2)
			p[0] = append(p[0], Piece{"adam.x", 0, []float32{1}})
			return p
		}, nil, `rank-00000.zst holds a piece of tensor "adam.x", which the manifest does not list`},
		{"past the end", func() [][]Piece {
			p := chunkPieces(ts, 2)
			p[1] = append(p[1], Piece{"params", 100, []float32{1}})
			return p
		}, nil, `piece [100, 101) of tensor "params" is outside its 100 elements`},
		{"wrong tmp dir", func() [][]Piece { return chunkPieces(ts, 1) },
			func(m *Manifest, tmp string) string { m.Step = 2; return tmp }, StepDir(2) + ".tmp (from BeginStep)"},
		{"no config", func() [][]Piece { return chunkPieces(ts, 1) },
			func(m *Manifest, tmp string) string { m.Config = nil; return tmp }, "has no config"},
		{"bad dtype", func() [][]Piece { return chunkPieces(ts, 1) },
			func(m *Manifest, tmp string) string { m.Tensors[0].DType = "q4"; return tmp }, `dtype "q4"`},
		{"shard size changed", func() [][]Piece { return chunkPieces(ts, 1) },
			func(m *Manifest, tmp string) string {
				f, _ := os.OpenFile(filepath.Join(tmp, ShardFile(0)), os.O_APPEND|os.O_WRONLY, 0)
				f.Write([]byte{0})
				f.Close()
				return tmp
			}, "its index rank-00000.json says"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			runDir := t.TempDir()
			tmp, _ := BeginStep(runDir, 1)
			pieces := tc.pieces()
			for r, p := range pieces {
				if p != nil {
					if _, err := WriteShard(tmp, r, p, Options{}); err != nil {
						t.Fatal(err)
					}
				}
			}
			m := Manifest{Step: 1, Config: testConfig(8, 1), Tensors: slices.Clone(ts.infos), World: WorldLayout{Size: len(pieces)}}
			if tc.edit != nil {
				tmp = tc.edit(&m, tmp)
			}
			_, err := Commit(runDir, tmp, m, 0)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Commit = %v, want %q", err, tc.want)
			}
			if _, err := os.Stat(filepath.Join(runDir, LatestFile)); err == nil {
				t.Error("a failed Commit moved latest")
			}
		})
	}
}

// TestPrune keeps the newest N steps and removes unfinished saves.
func TestPrune(t *testing.T) {
	ts := newTensors(1, map[string]int{"params": 10})
	for _, keep := range []int{0, 1, 2, 3} {
		t.Run(fmt.Sprint("keep=", keep), func(t *testing.T) {
			runDir := t.TempDir()
			os.MkdirAll(filepath.Join(runDir, "step-000003.tmp"), 0o755) // a crashed save
			os.WriteFile(filepath.Join(runDir, "metrics.jsonl"), nil, 0o644)
			for step := 10; step <= 50; step += 10 {
				mustSave(t, runDir, step, ts, chunkPieces(ts, 2), Options{}, keep)
			}
			names, _ := stepDirs(runDir)
			want := []string{"step-000050", "step-000040", "step-000030", "step-000020", "step-000010"}
			if keep > 0 {
				want = want[:keep]
			}
			if !slices.Equal(names, want) {
				t.Errorf("steps %v, want %v", names, want)
			}
			if _, err := os.Stat(filepath.Join(runDir, "step-000003.tmp")); err == nil {
				t.Error("stale step-000003.tmp not removed")
			}
			if _, err := os.Stat(filepath.Join(runDir, "metrics.jsonl")); err != nil {
				t.Error("prune removed a file that is not a checkpoint")
			}
		})
	}
	// After resuming from an older step, the step just saved is kept even if higher
	// steps of the abandoned run are newer by number.
	runDir := t.TempDir()
	for _, step := range []int{100, 200, 150} {
		mustSave(t, runDir, step, ts, chunkPieces(ts, 1), Options{}, 2)
	}
	if names, _ := stepDirs(runDir); !slices.Equal(names, []string{"step-000200", "step-000150"}) {
		t.Errorf("steps %v, want step-000200 and the current step-000150", names)
	}
}

// TestResave saves a step that exists already (a run resumed from an older step reaching it
// again): the new one replaces it.
func TestResave(t *testing.T) {
	runDir := t.TempDir()
	a := newTensors(1, map[string]int{"params": 100})
	b := newTensors(2, map[string]int{"params": 100})
	mustSave(t, runDir, 5, a, chunkPieces(a, 2), Options{}, 0)
	path := mustSave(t, runDir, 5, b, chunkPieces(b, 3), Options{}, 0)
	checkContents(t, path, b)
	if c := checkContents(t, runDir, b); c.Manifest().World.Size != 3 {
		t.Errorf("world %d, want the new save's 3", c.Manifest().World.Size)
	}
	entries, _ := os.ReadDir(runDir)
	if len(entries) != 2 {
		t.Errorf("run directory holds %d entries, want step-000005 and latest", len(entries))
	}
}
