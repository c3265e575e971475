//go:build !mpi

package transport

import (
	"errors"
	"os"
)

// MPIBuilt reports whether this binary has the MPI communicator (built with -tags mpi).
const MPIBuilt = false

var errNoMPI = errors.New("parallel: parallelism.backend = \"mpi\" needs a binary built with MPI: rebuild with -tags mpi (go build -tags mpi .), which needs an MPI library (Debian: apt-get install openmpi-bin libopenmpi-dev)")

// InitMPI returns the MPI communicator; this binary was built without MPI, so it returns an
// error that says how to rebuild.
func InitMPI() (Comm, error) { return nil, errNoMPI }

// InitMPIWith is InitMPI with explicit options; without MPI it returns the same error.
func InitMPIWith(MPIOptions) (Comm, error) { return nil, errNoMPI }

// FinalizeMPI ends MPI; without MPI there is nothing to end.
func FinalizeMPI() error { return nil }

// AbortMPI ends every rank of the job with code: without MPI, this process, and the others
// MPICH's launcher Hydra started with it (hydraAbort).
func AbortMPI(code int) {
	hydraAbort(code)
	os.Exit(code)
}

// MPIInfo describes the MPI in use, for a log line; without MPI it says so.
func MPIInfo() string { return "built without MPI (-tags mpi)" }

// ErrorBoard carries a failing rank's error to rank 0 (mpiboard.go); without MPI there are no
// other ranks, and OpenErrorBoard says how to rebuild.
type ErrorBoard struct{}

// OpenErrorBoard makes the board; without MPI it returns the error InitMPI does.
func OpenErrorBoard() (*ErrorBoard, error) { return nil, errNoMPI }

// Messages delivers nothing without MPI.
func (b *ErrorBoard) Messages() <-chan BoardMessage { return nil }

// Post does nothing without MPI.
func (b *ErrorBoard) Post(string) {}

// AllGatherBytes gives every process's bytes to every process of an MPI job; without MPI it
// returns the error InitMPI does.
func AllGatherBytes([]byte) ([][]byte, error) { return nil, errNoMPI }

// MPIBuiltWith names the MPI this binary was compiled against; built without MPI, it is "".
func MPIBuiltWith() string { return "" }

// MPILibrary names the MPI library this process loaded; built without MPI, it is "".
func MPILibrary() string { return "" }
