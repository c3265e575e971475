package plan

import (
	"strings"

	"distflash/model"
)

// FLOPsPerToken is the model FLOPs of training on one token of a seqLen-token sequence, the
// count that MFU divides by (PaLM's appendix B, as torchtitan, llm.c and nanoGPT count it):
// 6 per parameter (the forward and backward of every product, the head included) and, per
// layer, 6·q·S·v for causal attention (q = heads × head_dim, S = seqLen, v the fraction of the
// causal pairs a sliding window leaves visible; 1 without one). Recomputation (activation
// checkpointing), document masks and idle ranks are not counted: they are what the system
// spends, not what the model needs, so a better system shows a higher MFU.
func FLOPsPerToken(m model.Config, seqLen int) float64 {
	f := 6 * float64(m.NumParams())
	for l := range m.NLayers {
		f += 6 * float64(m.QDim()) * float64(seqLen) * windowVisible(seqLen, m.Window(l))
	}
	return f
}

// PeakFLOPS is the dense bf16 peak of the GPU a CUDA backend names (cuDeviceGetName, e.g.
// "NVIDIA H200"), from the presets of --cluster, or 0 when the name is not one of them.
func PeakFLOPS(device string) float64 {
	g, _ := GPUByDevice(device)
	return g.FLOPS
}

// GPUByDevice is the preset of --cluster for the GPU a CUDA backend names ("NVIDIA H100 80GB
// HBM3", "NVIDIA A100-SXM4-40GB"): the one whose model is in the name, and of several (A100's
// 40 and 80 GB) the one whose memory the name gives too, else the first. ok is false when no
// preset is in the name.
func GPUByDevice(device string) (g GPUType, ok bool) {
	for _, t := range gpuTypes {
		gpu, mem, _ := strings.Cut(t.Name, "-")
		if !strings.Contains(device, gpu) {
			continue
		}
		if !ok || strings.Contains(device, mem) {
			g, ok = t, true
		}
		if strings.Contains(device, mem) {
			break
		}
	}
	return g, ok
}
