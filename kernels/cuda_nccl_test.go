//go:build cuda

package kernels

import (
	"os"
	"strings"
	"testing"

	"distflash/kernels/cuda"
)

// TestCUDAHostNCCLLibrary loads the NCCL library that DISTFLASH_LIBNCCL names and reads its
// version, which needs no GPU: every entry point of kernels/cuda/nccl_abi_funcs.h resolves in
// the real file (LoadNCCL names the first missing one), ncclCommSplit too from 2.18 on. The GPU
// check sets DISTFLASH_LIBNCCL to the pack's NCCL (scripts/build_nccl.sh), on the GPU and in
// its dry run; without it the test skips, since CI has no NCCL library (TestCUDAHostNCCLMissing
// in parallel/transport checks the error of a missing one).
func TestCUDAHostNCCLLibrary(t *testing.T) {
	file := os.Getenv("DISTFLASH_LIBNCCL")
	if file == "" {
		t.Skip("DISTFLASH_LIBNCCL is not set: no NCCL library to load")
	}
	if err := NCCLAvailable(); err != nil {
		t.Fatalf("DISTFLASH_LIBNCCL=%s: %v", file, err)
	}
	v, err := cuda.NCCLVersion()
	if err != nil {
		t.Fatalf("ncclGetVersion of %s: %v", file, err)
	}
	if v < 20900 {
		t.Fatalf("%s: ncclGetVersion gives %d, older than NCCL 2.9 (which LoadNCCL should have refused)", file, v)
	}
	if split := cuda.NCCLHasSplit(); split != (v >= 21800) {
		t.Errorf("%s, NCCL %d: ncclCommSplit resolved = %v, want %v (it came with 2.18)", file, v, split, v >= 21800)
	}
	t.Logf("%s: NCCL %d.%d.%d, every entry point resolved", file, v/10000, v%10000/100, v%100)
}

// TestCUDAHostNCCLNoDevice drives the NCCL methods on the fake device, which has no NCCL: each
// returns an error saying so (no panic), and a buffer of another backend is refused first.
func TestCUDAHostNCCLNoDevice(t *testing.T) {
	c, _ := newFakeCUDA(t)
	buf := c.Alloc(8)
	_, idErr := c.NCCLUniqueID()
	_, initErr := c.NCCLInit(2, [128]byte{}, 0)
	_, splitErr := c.NCCLSplit(1, 0, 0)
	for name, err := range map[string]error{
		"NCCLUniqueID": idErr, "NCCLInit": initErr, "NCCLSplit": splitErr,
		"NCCLGroupStart": c.NCCLGroupStart(1), "NCCLGroupEnd": c.NCCLGroupEnd(1),
		"NCCLSend": c.NCCLSend(1, buf, 1), "NCCLRecv": c.NCCLRecv(1, buf, 1),
		"NCCLAllReduce": c.NCCLAllReduce(1, buf), "NCCLAllGather": c.NCCLAllGather(1, buf, c.Slice(buf, 0, 4)),
		"NCCLReduceScatter": c.NCCLReduceScatter(1, c.Slice(buf, 0, 4), buf), "NCCLJoin": c.NCCLJoin(1),
		"NCCLSync": c.NCCLSync(1), "NCCLDestroy": c.NCCLDestroy(1),
	} {
		if err == nil || err.Error() != "kernels: cuda: this device has no NCCL" {
			t.Errorf("%s on the fake device: %v", name, err)
		}
	}
	err := c.NCCLSend(1, HostBuf(make([]float32, 4)), 1)
	if err == nil || !strings.Contains(err.Error(), "is not a CUDA buffer") {
		t.Errorf("NCCLSend of a host buffer: %v", err)
	}
}
