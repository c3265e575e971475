//go:build !cuda

package kernels

import "errors"

// CUDABuilt reports whether this binary has the CUDA backend (built with -tags cuda).
const CUDABuilt = false

func newCUDADevice(int) (Backend, error) {
	return nil, errors.New(`kernels: device.kind = "cuda" needs a binary built with -tags cuda (see README: CUDA backend)`)
}

// NCCLAvailable reports whether this binary can use NCCL (parallelism.backend = nccl): a
// binary built without -tags cuda cannot.
func NCCLAvailable() error {
	return errors.New("kernels: parallelism.backend = nccl needs a build with -tags cuda")
}
