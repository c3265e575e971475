// Package world assembles what every command runs on, once, for train, eval and generate
// alike: the launch (the ranks as goroutines of this process, or this process as one rank of
// several started by mpirun or srun, with NCCL bootstrapped over MPI on top), the parallel
// dimensions (parallel.Dims), each rank's device and communicators (Open), and each rank's
// model with its attention schedule and parameter store: FSDP's chunks, a 16-bit cast copy,
// or the model's own weights (Build). Nothing else in distflash builds ranks.
//
// A world's life: Launch (the processes), Open (the devices and communicators: after it the
// memory each rank has is known), Build (the models), then Run as often as the command needs,
// and at the end CloseComms (after a run that went well) and Finalize.
//
// Layer: world imports config, kernels, model, parallel, parallel/transport, plan (the GPU
// catalogue's memory) and sysmem. Packages train and evaluate import it.
package world

import (
	"errors"
	"fmt"
	"io"
	"strconv"

	"distflash/config"
	"distflash/kernels"
	"distflash/parallel"
	"distflash/parallel/transport"
	"distflash/plan"
	"distflash/sysmem"
)

// World is the ranks of a run and what this process holds of them.
type World struct {
	Dims   parallel.Dims
	Device config.DeviceConfig
	Par    config.ParallelismConfig // as launched: backend "mpi" when an MPI launcher started the process
	boot   transport.Comm           // this process's MPI communicator; nil when every rank is in this process
	local  *transport.World         // the in-process world; nil under MPI
	ranks  []*Rank                  // this process's ranks, in rank order (after Open)
	// Wrap, when set before Open (tests), wraps each rank's backend: the rank, its model and
	// its optimizer call the wrapper, while its communicator keeps the device's own backend
	// (a staged communicator's host copies are the transport's, not the rank's).
	Wrap func(kernels.Backend) kernels.Backend
}

// Launch starts the world cfg asks for: MPI when parallelism.backend is "mpi", or when an MPI
// launcher (mpirun, srun) started this process together with others, in which case a config
// that says "inproc" is run as "mpi" (said on stderr) and cfg is changed to say so, and one
// that says "nccl" bootstraps NCCL over MPI; otherwise every rank is a goroutine of this
// process (under "nccl" too: NCCL bootstrapped over the in-process world). It refuses what
// cannot run: processes that were not started alike (agree: another config, flags, binary or
// data), a launch of another number of processes than parallelism.world_size, several GPU
// ranks in one process.
func Launch(cfg *config.Config, stderr io.Writer) (*World, error) {
	dims, err := cfg.Parallelism.Dims()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", cfg.Origin(""), err)
	}
	launch, err := transport.MPIEnv()
	if err != nil {
		return nil, err
	}
	started := launch != nil && (launch.Size > 1 || launch.Rank > 0)
	p := &cfg.Parallelism
	if p.Backend != "mpi" && !started { // in-process: also NCCL over the in-process world
		if cfg.Device.Kind == "cuda" && dims.World > 1 {
			return nil, fmt.Errorf("%s: device.kind = \"cuda\" with parallelism.world_size = %d in one process: a GPU rank is a process; launch them with mpirun -np %d (or srun), each takes the GPU of its local rank",
				cfg.Origin(""), dims.World, dims.World)
		}
		return &World{Dims: dims, Device: cfg.Device, Par: *p, local: transport.NewWorld(dims.World)}, nil
	}
	if p.Backend == "inproc" {
		if launch.Rank == 0 {
			fmt.Fprintf(stderr, "mpi: started by %s; using parallelism.backend = \"mpi\" instead of %q\n", launch.Launcher, p.Backend)
		}
		p.Backend = "mpi"
	}
	if p.Backend != "mpi" && p.Backend != "nccl" {
		return nil, fmt.Errorf("%s: parallelism.backend = %q, but this process was started by %s (%v): use \"mpi\"",
			cfg.Origin(""), p.Backend, launch.Launcher, launch.Vars)
	}
	if err := transport.CheckLaunch(); err != nil {
		return nil, err
	}
	comm, err := transport.InitMPI()
	if err != nil {
		return nil, fmt.Errorf("%s: parallelism.backend = %q (over MPI): %w", cfg.Origin("parallelism.backend"), p.Backend, err)
	}
	w := &World{Dims: dims, Device: cfg.Device, Par: *p, boot: comm}
	if err := agree(cfg); err != nil {
		return w, err
	}
	if comm.Size() != dims.World {
		return w, fmt.Errorf("%s: parallelism.world_size = %d, but the launcher started %d processes: make them equal (mpirun -np %d)",
			cfg.Origin(""), dims.World, comm.Size(), dims.World)
	}
	return w, nil
}

// MPI reports whether this process is one rank of several processes (MPI).
func (w *World) MPI() bool { return w.boot != nil }

// Leader reports whether this process speaks for the world: it holds rank 0.
func (w *World) Leader() bool { return w.boot == nil || w.boot.Rank() == 0 }

// LocalRanks is how many of the world's ranks this process runs: all of them in process, one
// under MPI.
func (w *World) LocalRanks() int {
	if w.boot != nil {
		return 1
	}
	return w.Dims.World
}

// Boot is this process's MPI communicator (nil in process): what carries agreements between
// processes before and beside the ranks' own communicators.
func (w *World) Boot() transport.Comm { return w.boot }

// Ranks are this process's ranks, in rank order (nil before Open).
func (w *World) Ranks() []*Rank { return w.ranks }

// First is this process's first rank: rank 0 on the leader.
func (w *World) First() *Rank { return w.ranks[0] }

// Run calls fn on every rank of this process, concurrently, and returns the first error,
// naming the rank; a collective that failed (transport.Failure) is such an error. Collective calls inside fn meet the other ranks' (in this process, or in the
// other processes' Runs).
func (w *World) Run(fn func(r *Rank) error) error {
	if w.local == nil {
		if err := runRank(fn, w.ranks[0]); err != nil {
			return fmt.Errorf("rank %d: %w", w.ranks[0].ID, err)
		}
		return nil
	}
	return w.local.Run(func(c transport.Comm) error { return fn(w.ranks[c.Rank()]) })
}

// runRank is fn(r), with a failed collective (a *transport.Failure) returned as its error.
func runRank(fn func(r *Rank) error, r *Rank) (err error) {
	defer transport.Recover(&err)
	return fn(r)
}

// Open makes this process's ranks: each one's backend from [device] (a GPU: the local rank's,
// modulo the GPUs the process sees, its attention path device.attention), its communicator of the whole world (NCCL's, bootstrapped
// over MPI or the in-process world, under parallelism.backend = "nccl"; else the host
// communicator, through host copies for a device whose memory it cannot read:
// transport.Staged), and its sequence group. It is collective: every rank splits off its
// group.
func (w *World) Open() error {
	if w.ranks != nil {
		return errors.New("world: opened twice")
	}
	open := func(c transport.Comm) (*Rank, error) {
		be, err := kernels.NewDevice(w.Device.Kind, transport.LocalRank())
		if err != nil {
			return nil, err
		}
		if ar, ok := be.(kernels.AttentionRouter); ok {
			if w.Device.Attention != "" {
				if err := ar.SetAttention(w.Device.Attention); err != nil {
					return nil, fmt.Errorf("device.attention = %q: %w", w.Device.Attention, err)
				}
			}
			ar.SetDeterministicAttention(w.Device.DeterministicAttention)
		}
		if w.Par.Backend == "nccl" {
			// NCCL moves the device buffers itself; c (MPI, or the in-process world of one
			// rank) bootstraps it and carries its splits' agreements
			lib, ok := be.(transport.NCCLLib)
			if !ok {
				return nil, fmt.Errorf("parallelism.backend = \"nccl\" needs device.kind = \"cuda\" (device %s has no NCCL)", be.Name())
			}
			opt, err := transport.NCCLOptionsFromEnv()
			if err != nil {
				return nil, err
			}
			if c, err = transport.NewNCCL(c, lib, opt); err != nil {
				return nil, err
			}
		} else if hm, ok := be.(interface{ HostMemory() bool }); !ok || !hm.HostMemory() {
			// the in-process and MPI communicators move host memory: device buffers go through
			// host copies, the same bytes at every call site
			c = transport.Staged(c, be)
		}
		if w.Wrap != nil {
			be = w.Wrap(be)
		}
		r := &Rank{ID: c.Rank(), Replica: w.Dims.Replica(c.Rank()), Comm: c, Backend: be, dims: w.Dims}
		r.Seq = w.Dims.SequenceGroup(c)
		return r, nil
	}
	if w.boot != nil {
		r, err := open(w.boot)
		if err != nil {
			return fmt.Errorf("rank %d: %w", w.boot.Rank(), err)
		}
		w.ranks = []*Rank{r}
		return nil
	}
	ranks := make([]*Rank, w.Dims.World)
	err := w.local.Run(func(c transport.Comm) error {
		r, err := open(c)
		ranks[c.Rank()] = r
		return err
	})
	if err != nil {
		return err
	}
	w.ranks = ranks
	return nil
}

// Memory is the memory each of this process's ranks has, in bytes, where it is known, and where
// the figure comes from: the host memory available to the process (sysmem: MemAvailable, or
// the room under its cgroup's limit) shared by its ranks on device.kind cpu and cpu-device,
// or the memory of the GPU a CUDA backend names, from plan's catalogue (after Open). ok is
// false when it is not known.
func (w *World) Memory() (bytes float64, source string, ok bool) {
	if w.Device.Kind == "cuda" {
		if w.ranks == nil {
			return 0, "", false
		}
		d, isGPU := w.ranks[0].Backend.(interface{ DeviceName() string })
		if !isGPU {
			return 0, "", false
		}
		g, found := plan.GPUByDevice(d.DeviceName())
		if !found {
			return 0, "", false
		}
		return g.MemBytes, fmt.Sprintf("%s, %s in plan's catalogue", d.DeviceName(), g.Name), true
	}
	avail, source, ok := sysmem.Available()
	if !ok {
		return 0, "", false
	}
	if n := w.LocalRanks(); n > 1 {
		source += fmt.Sprintf(", shared by %d in-process ranks", n)
	}
	return float64(avail) / float64(w.LocalRanks()), source, true
}

// SharedMemory is Memory agreed by every process of the world: the least memory any of its
// ranks has, and where the figure comes from, so that what a run decides by it
// (checkpoint.activation = "auto": plan.Choose) is decided alike on every rank. In process it is
// Memory; under MPI every process sends its figure (a collective of every process, after Open),
// and one that does not know its memory makes it unknown (ok false) for all.
func (w *World) SharedMemory() (bytes float64, source string, ok bool) {
	bytes, source, ok = w.Memory()
	if w.boot == nil {
		return bytes, source, ok
	}
	if !ok {
		bytes = 0
	}
	all, err := transport.AllGatherBytes([]byte(strconv.FormatFloat(bytes, 'g', -1, 64)))
	if err != nil {
		return 0, "", false
	}
	least := bytes
	for _, b := range all {
		v, err := strconv.ParseFloat(string(b), 64)
		if err != nil || v <= 0 {
			return 0, "", false
		}
		least = min(least, v)
	}
	if least < bytes {
		source = fmt.Sprintf("the least of the world's %d processes", len(all))
	}
	return least, source, ok
}

// CloseComms releases the communicators that hold resources of their own (NCCL's: each rank's
// communicators and streams) at the end of a run that went well; after a failure the process's
// exit releases them, as a destroy would wait for peers that may be gone.
func (w *World) CloseComms() error {
	for _, r := range w.ranks {
		if c, ok := r.Comm.(interface{ Close() error }); ok {
			if err := c.Close(); err != nil {
				return fmt.Errorf("rank %d: %w", r.ID, err)
			}
		}
	}
	return nil
}

// Finalize ends MPI when this process is one rank of several; otherwise it does nothing.
func (w *World) Finalize() error {
	if w.boot == nil {
		return nil
	}
	return transport.FinalizeMPI()
}
