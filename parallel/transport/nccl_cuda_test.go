//go:build cuda

package transport

import (
	"strings"
	"testing"

	"distflash/kernels"
)

// The CUDA backend is the NCCL library of a GPU rank.
var _ NCCLLib = (*kernels.CUDA)(nil)

// TestCUDAHostNCCLMissing points DISTFLASH_LIBNCCL at a file that does not exist (as on a
// machine without NCCL): the error names the file and says how to install NCCL. Needs no GPU.
func TestCUDAHostNCCLMissing(t *testing.T) {
	const missing = "/nonexistent/libnccl.so.2"
	t.Setenv("DISTFLASH_LIBNCCL", missing)
	err := kernels.NCCLAvailable()
	if err == nil {
		t.Skip("NCCL was loaded earlier in this process (a loaded library stays)")
	}
	for _, want := range []string{"kernels: cuda: ", "cannot load NCCL's library " + missing, "DISTFLASH_LIBNCCL",
		"No such file", "pip install nvidia-nccl-cu12", "LD_LIBRARY_PATH"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("NCCLAvailable() with DISTFLASH_LIBNCCL=%s: %q does not contain %q", missing, err, want)
		}
	}
	t.Log(err)
}
