package train

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
)

// profiler writes Go CPU and heap profiles (pprof) of a window of steps, from rank 0's
// process: cpu.pprof covers steps from..to (1-based, inclusive), heap.pprof is the heap after
// step to (after a collection, as `go tool pprof -sample_index=inuse_space` reads it). The
// in-process world's ranks all run in this process, so their work is in the profile too.
// Reading them: `go tool pprof -top DIR/cpu.pprof`, or `-http=:8080` for the graph.
type profiler struct {
	dir      string
	from, to int
	cpu      *os.File // open while the CPU profile runs
	done     bool
}

// begin starts the CPU profile when step is the window's first.
func (p *profiler) begin(step int, stderr io.Writer) error {
	if p == nil || p.done || step != p.from {
		return nil
	}
	if err := os.MkdirAll(p.dir, 0o755); err != nil {
		return fmt.Errorf("--profile %s: %w", p.dir, err)
	}
	f, err := os.Create(filepath.Join(p.dir, "cpu.pprof"))
	if err != nil {
		return fmt.Errorf("--profile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return fmt.Errorf("--profile: %w", err)
	}
	p.cpu = f
	fmt.Fprintf(stderr, "profile: CPU of steps %d–%d into %s\n", p.from, p.to, f.Name())
	return nil
}

// end stops the profile and writes the heap's when step is the window's last.
func (p *profiler) end(step int, stderr io.Writer) {
	if p != nil && step == p.to {
		p.stop(stderr)
	}
}

// stop ends a running CPU profile (the run ended inside the window too) and writes the heap
// profile; a profile that cannot be written is said, not fatal: the training goes on.
func (p *profiler) stop(stderr io.Writer) {
	if p == nil || p.cpu == nil {
		return
	}
	pprof.StopCPUProfile()
	err := p.cpu.Close()
	p.cpu, p.done = nil, true
	heap := filepath.Join(p.dir, "heap.pprof")
	if err == nil {
		var f *os.File
		if f, err = os.Create(heap); err == nil {
			runtime.GC()
			err = pprof.WriteHeapProfile(f)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
		}
	}
	if err != nil {
		fmt.Fprintf(stderr, "profile: %v\n", err)
		return
	}
	fmt.Fprintf(stderr, "profile: wrote %s and %s (go tool pprof -top %s)\n", filepath.Join(p.dir, "cpu.pprof"), heap, filepath.Join(p.dir, "cpu.pprof"))
}

// ParseProfileSteps reads --profile-steps FIRST..LAST: two steps counted from 1 with FIRST <=
// LAST.
func ParseProfileSteps(s string) ([2]int, error) {
	a, b, ok := strings.Cut(s, "..")
	first, err1 := strconv.Atoi(a)
	last, err2 := strconv.Atoi(b)
	if !ok || err1 != nil || err2 != nil || first < 1 || last < first {
		return [2]int{}, fmt.Errorf("want FIRST..LAST, two steps with 1 <= FIRST <= LAST, e.g. 3..7")
	}
	return [2]int{first, last}, nil
}
