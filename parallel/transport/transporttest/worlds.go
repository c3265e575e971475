package transporttest

import (
	"time"

	"distflash/parallel/transport"
)

// NCCLVersions are the library versions tests run NCCL communicators at: one with
// ncclCommSplit (2.23.4) and one before it (2.17.1), whose splits make a communicator per
// group from its own unique id.
var NCCLVersions = []int{22304, 21701}

// NCCLWorld runs fn on P in-process ranks, each on an NCCL communicator over a FakeNCCL of
// the given version bootstrapped from the in-process world, closes the communicators and
// returns the libraries.
func NCCLWorld(P, version int, fn func(c transport.Comm) error) ([]*FakeNCCL, error) {
	libs := NCCLLibs(P, version)
	return libs, RunNCCL(libs, fn)
}

// NCCLLibs returns the libraries of P ranks sharing one FakeNet.
func NCCLLibs(P, version int) []*FakeNCCL {
	net := NewFakeNet()
	libs := make([]*FakeNCCL, P)
	for r := range libs {
		libs[r] = net.Lib(r, version)
	}
	return libs
}

// RunNCCL runs fn on len(libs) in-process ranks, rank r on an NCCL communicator over libs[r]
// bootstrapped from the in-process world, and closes the communicators.
func RunNCCL(libs []*FakeNCCL, fn func(c transport.Comm) error) error {
	return transport.NewWorld(len(libs)).Run(func(boot transport.Comm) error {
		// the watchdog polls every millisecond beside the operations (a minute: it never fires)
		c, err := transport.NewNCCL(boot, libs[boot.Rank()], transport.NCCLOptions{Timeout: time.Minute, Every: time.Millisecond})
		if err != nil {
			return err
		}
		if err := fn(c); err != nil {
			return err
		}
		return c.(interface{ Close() error }).Close()
	})
}

// NCCLRun adapts NCCLWorld to the runners that schedule and FSDP tests take: it runs a function
// on every rank of a P-rank NCCL world.
func NCCLRun(P, version int) func(func(transport.Comm) error) error {
	return func(fn func(transport.Comm) error) error {
		_, err := NCCLWorld(P, version, fn)
		return err
	}
}
