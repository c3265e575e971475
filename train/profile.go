package train

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"

	"distflash/kernels"
	"distflash/parallel/transport"
)

// profiler writes Go CPU and heap profiles (pprof) of a window of steps, from rank 0's
// process: cpu.pprof covers steps from..to (1-based, inclusive), heap.pprof is the heap after
// step to (after a collection, as `go tool pprof -sample_index=inuse_space` reads it). The
// in-process world's ranks all run in this process, so their work is in the profile too.
// Reading them: `go tool pprof -top DIR/cpu.pprof`, or `-http=:8080` for the graph.
//
// With rank set (rank 0), it also writes the per-op table of rank 0's work in the window
// (ops.txt, ops.json; kernels.OpProfile): the model's backend calls by op class and phase,
// the optimizer, the weights' 16-bit refresh and rank 0's collectives, timed on the backend's
// clock (CUDA events on a GPU: the host waits for them once, at the end of each profiled
// step), each beside its floor at the ceilings measured when the window opens
// (kernels.Calibrate). Outside the window nothing is bracketed or timed.
type profiler struct {
	dir      string
	from, to int
	cpu      *os.File // open while the CPU profile runs
	done     bool
	rank     *rank // rank 0 of this process; nil: no per-op table

	ops   *kernels.OpProfile // while the window is open
	comm  transport.Comm     // rank 0's Comm, while a timing one stands in for it
	timer kernels.OpTimer    // the per-op clock; nil: kernels.TimerOf(rank's backend) (tests set a fake)
	ceil  *kernels.Ceilings  // the floors' ceilings; nil: measured (tests set them)
}

// begin starts the CPU profile and the per-op table when step is the window's first, and the
// per-op table's step when step is in the window.
func (p *profiler) begin(step int, stderr io.Writer) error {
	if p == nil || p.done || step < p.from || step > p.to {
		return nil
	}
	if step == p.from {
		if err := p.start(stderr); err != nil {
			return err
		}
	}
	p.ops.BeginStep()
	return nil
}

// start opens the window: the CPU profile, then the per-op table's bracketing.
func (p *profiler) start(stderr io.Writer) error {
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
	p.attach()
	return nil
}

// end ends the per-op table's step, and, when step is the window's last, the profiles (and
// writes them).
func (p *profiler) end(step int, stderr io.Writer) {
	if p == nil || p.done || step < p.from || step > p.to {
		return
	}
	p.ops.EndStep()
	if step == p.to {
		p.stop(stderr)
	}
}

// stop ends a running CPU profile (the run ended inside the window too) and writes the heap
// profile and the per-op table; a profile that cannot be written is said, not fatal: the
// training goes on.
func (p *profiler) stop(stderr io.Writer) {
	if p == nil || p.cpu == nil {
		return
	}
	p.detach(stderr)
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

// attach brackets rank 0's ops from now on: its model, optimizer, 16-bit weight copy and
// collectives record into a new OpProfile, whose ceilings are measured first.
func (p *profiler) attach() {
	r := p.rank
	if r == nil {
		return
	}
	t := p.timer
	if t == nil {
		t = kernels.TimerOf(r.Backend)
	}
	var c kernels.Ceilings
	if p.ceil != nil {
		c = *p.ceil
	} else {
		c = kernels.Calibrate(r.Backend, t, kernels.CalibrationFor(r.Backend))
		runtime.GC() // the calibration's buffers (device memory on a GPU) go back now
	}
	p.ops = kernels.NewOpProfile(t, c)
	r.Model.Ops, r.opt.Ops = p.ops, p.ops
	if r.Cast != nil {
		r.Cast.Ops = p.ops
	}
	p.comm, r.Comm = r.Comm, timedComm{r.Comm, p.ops}
}

// detach ends the bracketing and writes the per-op table into ops.txt and ops.json.
func (p *profiler) detach(stderr io.Writer) {
	r := p.rank
	if r == nil || p.ops == nil {
		return
	}
	r.Model.Ops, r.opt.Ops, r.Comm = nil, nil, p.comm
	if r.Cast != nil {
		r.Cast.Ops = nil
	}
	device := r.Backend.Name()
	if d, ok := r.Backend.(interface{ Device() string }); ok {
		device = d.Device()
	}
	tab := p.ops.Table(device)
	p.ops = nil
	txt, js := filepath.Join(p.dir, "ops.txt"), filepath.Join(p.dir, "ops.json")
	b, err := json.MarshalIndent(tab, "", " ")
	if err == nil {
		err = os.WriteFile(js, append(b, '\n'), 0o644)
	}
	if err == nil {
		err = os.WriteFile(txt, []byte(tab.Text()), 0o644)
	}
	if err != nil {
		fmt.Fprintf(stderr, "profile: %v\n", err)
		return
	}
	fmt.Fprintf(stderr, "profile: per-op table of %d steps in %s (and %s)\n", tab.Steps, txt, js)
}

// timedComm is rank 0's Comm with its collectives bracketed as communication. A collective's
// bytes are those that cross between ranks, as NCCL's bus bandwidth counts them: (P−1)/P of
// the gathered or scattered buffer, 2(P−1)/P of an all-reduced one, for P ranks; none for one
// rank, whose collectives have no floor and no ratio in the table.
type timedComm struct {
	transport.Comm
	ops *kernels.OpProfile
}

// wire is the bytes of n float32 values, times k(P−1)/P.
func (c timedComm) wire(n, k int) int64 {
	p := int64(c.Size())
	return 4 * int64(k) * int64(n) * (p - 1) / p
}

func (c timedComm) AllGather(dst, src kernels.Buf, site string) {
	c.ops.Begin(kernels.OpComm, kernels.PhaseStep)
	c.Comm.AllGather(dst, src, site)
	c.ops.End(kernels.OpCost{Bytes: c.wire(dst.Len(), 1)})
}

func (c timedComm) ReduceScatter(dst, src kernels.Buf, site string) {
	c.ops.Begin(kernels.OpComm, kernels.PhaseStep)
	c.Comm.ReduceScatter(dst, src, site)
	c.ops.End(kernels.OpCost{Bytes: c.wire(src.Len(), 1)})
}

func (c timedComm) AllReduce(buf kernels.Buf, site string) {
	c.ops.Begin(kernels.OpComm, kernels.PhaseStep)
	c.Comm.AllReduce(buf, site)
	c.ops.End(kernels.OpCost{Bytes: c.wire(buf.Len(), 2)})
}

func (c timedComm) AllToAll(dst, src kernels.Buf, site string) {
	c.ops.Begin(kernels.OpComm, kernels.PhaseStep)
	c.Comm.AllToAll(dst, src, site)
	c.ops.End(kernels.OpCost{Bytes: c.wire(src.Len(), 1)})
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
