package kernels

import "fmt"

// NewDevice returns the backend of config device.kind: "cpu" (the pure-Go backend), "cuda"
// (in a binary built with -tags cuda: GPU number localRank modulo the GPUs the process sees,
// so the ranks of a host spread over its GPUs and share them when they outnumber them) or
// "cpu-device" (NewDeviceCPU: the CPU posing as a device, the GPU path's staging on CPUs).
func NewDevice(kind string, localRank int) (Backend, error) {
	switch kind {
	case "cpu":
		return NewCPU(), nil
	case "cpu-device":
		return NewDeviceCPU(), nil
	case "cuda":
		return newCUDADevice(localRank)
	}
	return nil, fmt.Errorf("kernels: device.kind = %q: want cpu, cuda or cpu-device", kind)
}
