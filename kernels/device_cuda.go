//go:build cuda

package kernels

import (
	"fmt"
	"os"

	"distflash/kernels/cuda"
)

// CUDABuilt reports whether this binary has the CUDA backend (built with -tags cuda).
const CUDABuilt = true

// newCUDADevice opens GPU localRank modulo the visible GPUs.
func newCUDADevice(localRank int) (Backend, error) {
	n, err := cuda.DeviceCount()
	if err != nil {
		return nil, fmt.Errorf("kernels: cuda: %w", err)
	}
	if n < 1 {
		return nil, fmt.Errorf("kernels: cuda: the driver shows no CUDA device (CUDA_VISIBLE_DEVICES=%q)", os.Getenv("CUDA_VISIBLE_DEVICES"))
	}
	return NewCUDA(localRank % n)
}

// NCCLAvailable reports whether this binary can use NCCL (parallelism.backend = nccl): nil
// once NCCL's library (libnccl.so.2, or the file $DISTFLASH_LIBNCCL names) is loaded, else why
// it does not load and how to install it. A failed load is tried again at the next call.
func NCCLAvailable() error {
	if err := cuda.LoadNCCL(); err != nil {
		return fmt.Errorf("kernels: cuda: %w", err)
	}
	return nil
}
