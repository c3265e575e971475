//go:build mpi && !mpicc

package transport

// The MPI build takes MPI's compiler and linker flags from pkg-config's generic name mpi,
// which Debian and Ubuntu give to whichever MPI `update-alternatives --config mpi` selects:
// Open MPI when it is installed (libopenmpi-dev), else MPICH (libmpich-dev). With the tag
// mpicc this file is left out, and the flags come from the C compiler instead: CC=mpicc (the
// MPI's compiler wrapper) or CGO_CFLAGS and CGO_LDFLAGS (docs/cluster.md).

// #cgo pkg-config: mpi
import "C"
