//go:build cuda

package cuda

import "embed"

// Cubins holds the machine code scripts/build_cuda.sh compiles from this directory's .cu files
// beside the PTX: NAME_sm80.cubin (runs on compute capability 8.x) and NAME_sm90a.cubin (sm_90a:
// exactly 9.0, the target Hopper's wgmma, TMA and setmaxnreg need). The backend loads them
// instead of the PTX when DISTFLASH_CUDA_IMAGE=cubin.
//
//go:embed *.cubin
var Cubins embed.FS
