//go:build cuda

package kernels

import (
	"strings"
	"testing"
)

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
