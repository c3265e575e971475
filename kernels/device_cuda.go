//go:build cuda

package kernels

// CUDABuilt reports whether this binary has the CUDA backend (built with -tags cuda).
const CUDABuilt = true

func newCUDADevice(index int) (Backend, error) { return NewCUDA(index) }
