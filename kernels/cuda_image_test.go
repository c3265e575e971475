//go:build cuda

package kernels

import (
	"bytes"
	"debug/elf"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"distflash/kernels/cuda"
)

// TestCUDAHostImageLayout checks the layout of the kernels' image (kernels/cuda/image, written
// by scripts/build_cuda.sh): per module exactly one PTX (NAME.ptx) and one cubin per target
// (NAME.sm_80.cubin, NAME.sm_90a.cubin), PTXAS.md, and nothing else; the modules are those the
// backend loads (ptxKernels), and no kernel is defined by two of them. On disk, no generated
// file sits beside the sources in kernels/cuda, and every source there is a module of the image.
func TestCUDAHostImageLayout(t *testing.T) {
	ents, err := fs.ReadDir(cuda.Image, cuda.ImageDir)
	if err != nil {
		t.Fatal(err)
	}
	ptx := map[string]int{}
	cubins := map[string]map[string]int{}
	var other []string
	for _, e := range ents {
		name := e.Name()
		if mod, ok := strings.CutSuffix(name, ".ptx"); ok && !strings.Contains(mod, ".") {
			ptx[mod]++
			continue
		}
		if rest, ok := strings.CutSuffix(name, ".cubin"); ok {
			mod, target, ok := strings.Cut(rest, ".")
			if ok && slices.Contains(cuda.CubinTargets, target) {
				if cubins[mod] == nil {
					cubins[mod] = map[string]int{}
				}
				cubins[mod][target]++
				continue
			}
		}
		if name != "PTXAS.md" {
			other = append(other, name)
		}
	}
	if len(other) > 0 {
		t.Errorf("the image holds files that are neither a module's PTX or cubin nor PTXAS.md: %v", other)
	}
	mods := moduleNames()
	if got := slices.Sorted(maps.Keys(ptx)); !slices.Equal(got, mods) {
		t.Errorf("the image has the PTX of modules %v, the backend loads %v", got, mods)
	}
	if got := cuda.Modules(); !slices.Equal(got, mods) {
		t.Errorf("cuda.Modules() = %v, the backend loads %v", got, mods)
	}
	for _, mod := range mods {
		if ptx[mod] != 1 {
			t.Errorf("module %s: %d PTX files, want 1", mod, ptx[mod])
		}
		for _, target := range cuda.CubinTargets {
			if n := cubins[mod][target]; n != 1 {
				t.Errorf("module %s: %d %s cubins, want 1", mod, n, target)
			}
		}
	}
	for mod := range cubins {
		if !slices.Contains(mods, mod) {
			t.Errorf("the image has cubins of %s, which is no module the backend loads", mod)
		}
	}
	owner := map[string]string{}
	for _, mod := range mods {
		for _, k := range ptxKernels[mod] {
			if o, ok := owner[k]; ok {
				t.Errorf("kernel %s is in modules %s and %s", k, o, mod)
			}
			owner[k] = mod
		}
	}

	// The sources' directory (the GPU check's pack ships the ABI headers there, no sources).
	files, err := os.ReadDir("cuda")
	if err != nil {
		t.Fatal(err)
	}
	var sources []string
	for _, f := range files {
		name := f.Name()
		switch ext := filepath.Ext(name); {
		case ext == ".ptx" || ext == ".cubin" || ext == ".fatbin" || name == "PTXAS.md":
			t.Errorf("kernels/cuda/%s: a generated file beside the sources (it belongs in kernels/cuda/%s)", name, cuda.ImageDir)
		case ext == ".cu":
			sources = append(sources, strings.TrimSuffix(name, ext))
		}
	}
	if len(sources) == 0 {
		t.Logf("kernels/cuda has no .cu sources here (a pack): the sources are not compared with the image")
	} else if !slices.Equal(sources, mods) {
		t.Errorf("kernels/cuda has the sources %v, the image the modules %v", sources, mods)
	}
}

// TestCUDAHostPTX checks the embedded PTX: every module's targets sm_80 (compute_80, which
// the driver JIT-compiles for any later GPU), is of a PTX ISA a CUDA 13.0 driver (580) loads
// (≤ 9.0), and defines exactly the kernels the backend loads.
func TestCUDAHostPTX(t *testing.T) {
	entry := regexp.MustCompile(`\.visible \.entry (\w+)\(`)
	version := regexp.MustCompile(`(?m)^\.version (\d+)\.(\d+)$`)
	for _, mod := range moduleNames() {
		file := cuda.PTXFile(mod)
		ptx, err := cuda.PTX(mod)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Contains(ptx, []byte("\n.target sm_80\n")) {
			t.Errorf("%s: no .target sm_80 line", file)
		}
		m := version.FindSubmatch(ptx)
		if m == nil {
			t.Fatalf("%s: no .version", file)
		}
		major, _ := strconv.Atoi(string(m[1]))
		minor, _ := strconv.Atoi(string(m[2]))
		if major*10+minor > 90 {
			t.Errorf("%s: PTX ISA %d.%d, newer than a CUDA 13.0 driver (580) loads (9.0)", file, major, minor)
		}
		var got []string
		for _, m := range entry.FindAllStringSubmatch(string(ptx), -1) {
			got = append(got, m[1])
		}
		slices.Sort(got)
		if want := slices.Sorted(slices.Values(ptxKernels[mod])); !slices.Equal(got, want) {
			t.Errorf("%s defines %v, the backend loads %v", file, got, want)
		}
	}
}

// TestCUDAHostPTXArch checks the compute capabilities the embedded PTX serves: 8.0 and later.
func TestCUDAHostPTXArch(t *testing.T) {
	for _, c := range []struct {
		major, minor int
		want         string
	}{{8, 0, "compute_80"}, {8, 6, "compute_80"}, {8, 9, "compute_80"}, {9, 0, "compute_80"}, {10, 0, "compute_80"},
		{12, 0, "compute_80"}, {7, 5, ""}} {
		got, err := ptxArch(c.major, c.minor)
		if got != c.want || (err != nil) != (c.want == "") {
			t.Errorf("ptxArch(%d, %d) = %q, %v; want %q", c.major, c.minor, got, err, c.want)
		}
	}
}

// TestCUDAHostCubins checks the embedded machine code: every module has cubins for sm_80 and
// sm_90a (ELF for NVIDIA CUDA, the architecture in e_flags) that define every kernel the
// backend loads, and a GPU gets the cubin of its exact architecture (DISTFLASH_CUDA_IMAGE=cubin).
func TestCUDAHostCubins(t *testing.T) {
	for _, mod := range moduleNames() {
		for _, c := range []struct {
			target string
			sm     uint32
		}{{"sm_80", 80}, {"sm_90a", 90}} {
			file := cuda.CubinFile(mod, c.target)
			img, err := cuda.Cubin(mod, c.target)
			if err != nil {
				t.Fatal(err)
			}
			f, err := elf.NewFile(bytes.NewReader(img))
			if err != nil {
				t.Fatalf("%s: %v", file, err)
			}
			if f.Machine != elf.EM_CUDA {
				t.Errorf("%s: ELF machine %v, want EM_CUDA", file, f.Machine)
			}
			// e_flags: the SM in bits 8-15 (ELF ABI version 1) or 0-7 (earlier); sm_90a also
			// sets its architecture-specific bit
			flags := binary32(img[48:52])
			if sm := (flags >> 8) & 0xff; sm != c.sm && flags&0xff != c.sm {
				t.Errorf("%s: e_flags %#x does not name sm_%d", file, flags, c.sm)
			}
			syms, err := f.Symbols()
			if err != nil {
				t.Fatalf("%s: %v", file, err)
			}
			have := map[string]bool{}
			for _, s := range syms {
				have[s.Name] = true
			}
			for _, k := range ptxKernels[mod] {
				if !have[k] {
					t.Errorf("%s: no kernel %s", file, k)
				}
			}
		}
	}
	for _, c := range []struct {
		major, minor int
		want         string
	}{{8, 0, "image/x.sm_80.cubin"}, {8, 9, "image/x.sm_80.cubin"}, {9, 0, "image/x.sm_90a.cubin"}, {9, 1, ""}, {10, 0, ""}, {12, 0, ""}} {
		if got := cubinFile("x", c.major, c.minor); got != c.want {
			t.Errorf("cubinFile(x, %d, %d) = %q, want %q", c.major, c.minor, got, c.want)
		}
	}
}

func binary32(b []byte) uint32 {
	return uint32(b[0]) | uint32(b[1])<<8 | uint32(b[2])<<16 | uint32(b[3])<<24
}
