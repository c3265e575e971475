package ckpt

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"testing"
)

// benchElems is the size of each benchmark tensor: 64 MiB of float32.
const benchElems = 16 << 20

// benchTensors holds trained-like state of the kinds a checkpoint stores: parameters
// (normal, σ 0.02, as LLaMA initialises them), Adam's first moment (gradient-sized, normal
// σ 1e-4) and second moment (squared gradients averaged: positive, ~1e-8).
var benchTensors = sync.OnceValue(func() map[string][]float32 {
	r := rand.New(rand.NewPCG(1, 2))
	out := map[string][]float32{}
	for _, kind := range []string{"params", "adam.m", "adam.v"} {
		x := make([]float32, benchElems)
		for i := range x {
			switch kind {
			case "params":
				x[i] = float32(r.NormFloat64() * 0.02)
			case "adam.m":
				x[i] = float32(r.NormFloat64() * 1e-4)
			case "adam.v":
				s := 0.0
				for range 4 {
					z := r.NormFloat64() * 1e-4
					s += z * z
				}
				x[i] = float32(s / 4)
			}
		}
		out[kind] = x
	}
	return out
})

// benchLevels are zstd levels that pick each of the encoder's four strengths.
var benchLevels = []int{1, 3, 7, 11}

// benchSave saves tensor x (named kind) from a world of 4 ranks, each its chunk.
func benchSave(b *testing.B, runDir string, step int, kind string, x []float32, level int) string {
	ts := tensorSet{infos: []TensorInfo{{Name: kind, Len: int64(len(x)), DType: "f32"}}, data: map[string][]float32{kind: x}}
	return mustSave(b, runDir, step, ts, chunkPieces(ts, 4), Options{Level: level}, 1)
}

// compressedSize is the total size of the shard files of the checkpoint in dir.
func compressedSize(b *testing.B, dir string) int64 {
	files, _ := filepath.Glob(filepath.Join(dir, "rank-*.zst"))
	var n int64
	for _, f := range files {
		fi, err := os.Stat(f)
		if err != nil {
			b.Fatal(err)
		}
		n += fi.Size()
	}
	return n
}

// BenchmarkSave measures saving 64 MiB of one kind of tensor from 4 ranks at once (WriteShard
// each, then Commit): MB/s of raw float32, and the compression ratio.
func BenchmarkSave(b *testing.B) {
	for _, kind := range []string{"params", "adam.m", "adam.v"} {
		for _, level := range benchLevels {
			b.Run(fmt.Sprintf("%s/level=%d", kind, level), func(b *testing.B) {
				x := benchTensors()[kind]
				runDir := b.TempDir()
				b.SetBytes(int64(4 * len(x)))
				var path string
				step := 0
				for b.Loop() {
					step++
					path = benchSave(b, runDir, step, kind, x, level)
				}
				b.ReportMetric(float64(4*len(x))/float64(compressedSize(b, path)), "ratio")
			})
		}
	}
}

// BenchmarkLoad measures loading it back: Open (which hashes every shard file) and 4 ranks
// reading their chunks at once; MB/s of raw float32.
func BenchmarkLoad(b *testing.B) {
	for _, kind := range []string{"params", "adam.m", "adam.v"} {
		for _, level := range benchLevels {
			b.Run(fmt.Sprintf("%s/level=%d", kind, level), func(b *testing.B) {
				x := benchTensors()[kind]
				path := benchSave(b, b.TempDir(), 1, kind, x, level)
				dst := make([]float32, len(x))
				b.SetBytes(int64(4 * len(x)))
				for b.Loop() {
					c, err := Open(path)
					if err != nil {
						b.Fatal(err)
					}
					var wg sync.WaitGroup
					for r := range 4 {
						lo, hi := Chunk(int64(len(x)), 4, r)
						wg.Go(func() {
							if err := c.Read(kind, lo, dst[lo:hi]); err != nil {
								b.Error(err)
							}
						})
					}
					wg.Wait()
					c.Close()
				}
				if i := sameBits(dst, x); i >= 0 {
					b.Fatalf("element %d read back wrong", i)
				}
			})
		}
	}
}
