//go:build !cuda

package kernels

import "errors"

// CUDABuilt reports whether this binary has the CUDA backend (built with -tags cuda).
const CUDABuilt = false

func newCUDADevice(int) (Backend, error) {
	return nil, errors.New(`kernels: device.kind = "cuda" needs a binary built with -tags cuda (see README: CUDA backend)`)
}
