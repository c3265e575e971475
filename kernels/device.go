package kernels

import "fmt"

// NewDevice returns the backend of config device.kind: "cpu" (the pure-Go backend) or
// "cuda" (GPU index, in a binary built with -tags cuda).
func NewDevice(kind string, index int) (Backend, error) {
	switch kind {
	case "cpu":
		return NewCPU(), nil
	case "cuda":
		return newCUDADevice(index)
	}
	return nil, fmt.Errorf("kernels: device.kind = %q: want cpu or cuda", kind)
}
