//go:build cuda

package cuda

import (
	"embed"
	"fmt"
	"io/fs"
	"path"
	"slices"
	"strings"
)

// The kernels' image: what scripts/build_cuda.sh compiles from this directory's .cu files, in
// image/ (the sources alone stay here). Per module NAME (NAME.cu):
//
//	image/NAME.ptx          PTX for compute_80; the driver JIT-compiles it for the GPU at hand
//	                        (compute capability 8.0 and later) when Device.LoadModule loads it
//	image/NAME.sm_80.cubin  machine code for sm_80 (runs on compute capability 8.x)
//	image/NAME.sm_90a.cubin machine code for sm_90a (exactly 9.0: the target Hopper's wgmma,
//	                        TMA and setmaxnreg need)
//
// and image/PTXAS.md, ptxas's registers, spills and shared memory of every kernel. The backend
// loads the PTX, or the cubin of the GPU's exact architecture when DISTFLASH_CUDA_IMAGE=cubin.
//
//go:embed image/*.ptx image/*.cubin image/PTXAS.md
var Image embed.FS

// ImageDir is the directory of Image that holds the files.
const ImageDir = "image"

// PTXTarget is the virtual architecture the image's PTX is compiled for.
const PTXTarget = "compute_80"

// CubinTargets are the real architectures the image has machine code for, each a cubin per
// module: sm_80 runs on every GPU of compute capability 8.x, sm_90a on 9.0 only.
var CubinTargets = []string{"sm_80", "sm_90a"}

// PTXFile is the name in Image of module name's PTX.
func PTXFile(module string) string { return path.Join(ImageDir, module+".ptx") }

// CubinFile is the name in Image of module name's cubin for target (one of CubinTargets).
func CubinFile(module, target string) string {
	return path.Join(ImageDir, module+"."+target+".cubin")
}

// PTX returns module name's PTX.
func PTX(module string) ([]byte, error) {
	b, err := Image.ReadFile(PTXFile(module))
	if err != nil {
		return nil, fmt.Errorf("the kernels' image has no PTX of module %q: %w", module, err)
	}
	return b, nil
}

// Cubin returns module name's machine code for target (one of CubinTargets).
func Cubin(module, target string) ([]byte, error) {
	b, err := Image.ReadFile(CubinFile(module, target))
	if err != nil {
		return nil, fmt.Errorf("the kernels' image has no %s cubin of module %q: %w", target, module, err)
	}
	return b, nil
}

// Modules lists the modules of the image (those with a PTX file), sorted.
func Modules() []string {
	ents, err := fs.ReadDir(Image, ImageDir)
	if err != nil {
		panic(err) // the directory is embedded: it exists
	}
	var mods []string
	for _, e := range ents {
		if name, ok := strings.CutSuffix(e.Name(), ".ptx"); ok {
			mods = append(mods, name)
		}
	}
	slices.Sort(mods)
	return mods
}
