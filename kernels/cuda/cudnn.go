//go:build cuda

package cuda

// cuDNN's backend (graph) API, opened at run time like the driver, cuBLAS and NCCL:
// libcudnn.so.9 is loaded at the first LoadCUDNN, never before, so a -tags cuda binary on a
// machine without cuDNN starts and runs everything else. Its declarations come from
// cudnn_abi.h, not cuDNN's headers. The library is looked for in this order: the file
// $DISTFLASH_LIBCUDNN names (then nowhere else); libcudnn.so.9 on the loader's path; the usual
// system directories (/usr/local/cuda/lib64, /usr/lib/x86_64-linux-gnu, ...); the
// nvidia/cudnn/lib directory of a pip-installed nvidia-cudnn-cu12/-cu13 wheel (PyTorch's) in
// the site-packages of python3. The wheel's library finds its sub-libraries through its own
// run path.
//
// NVRTC. The fused attention graphs run only on cuDNN's runtime-compiled engines: at the first
// plan finalisation cuDNN dlopens libnvrtc.so.<CUDA major> and NVRTC dlopens
// libnvrtc-builtins.so.<major>.<minor>. Neither is on the cuDNN wheel's run path (NVRTC comes in
// its own wheel, nvidia-cuda-nvrtc-cu12 or nvidia-cuda-nvrtc for CUDA 13; PyTorch preloads both
// for the same reason), and without them every plan fails (CUDNN_STATUS_NOT_SUPPORTED_RUNTIME_
// PREREQUISITE_MISSING, 3008, or INTERNAL_ERROR_COMPILATION_FAILED, 4001). So LoadCUDNN, right
// after opening cuDNN and before any handle or graph, loads both with RTLD_GLOBAL (a later
// dlopen by soname then finds them loaded), for the CUDA major cuDNN was built for
// (cudnnGetCudartVersion), from NVRTCCandidates. cuDNN 9 loads its sub-libraries and NVRTC
// lazily, at first use, so loading NVRTC after cuDNN but before its first plan is in time. A
// cuDNN without a loadable NVRTC is refused as a whole: LoadCUDNN's error says which files were
// tried and how to install NVRTC, and the backend says once that cuDNN attention is off.
//
// This file's C helpers have their own pointer to cuCtxSetCurrent (cgo compiles each file's
// preamble apart), resolved in the driver library (libcuda.so.1 or $DISTFLASH_LIBCUDA): cuDNN
// runs on the context current on the calling thread, so every helper that reaches the device
// (handle creation, plan finalisation, execution) makes the device's context current first.
// cudnnGetLastErrorString is per thread: every helper that can fail reads it in the same C call
// as the failing cuDNN call, so the message cannot be lost to a goroutine that moved threads.

/*
#cgo LDFLAGS: -ldl
#define _GNU_SOURCE
#include "cudnn_abi.h"
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DFD_DECLARE(name, sym, ret, params) static ret(*p_##name) params;
DF_CUDNN_FUNCS(DFD_DECLARE)
static CUresult (*pd_cuCtxSetCurrent)(CUcontext);

// dfd_open opens lib and resolves cuDNN's entry points, and cuCtxSetCurrent in the driver
// library. It returns 0; 1 when lib does not load (dlerror's message in err); 2 when an entry
// point is missing (its name in err); 3 when the driver library does not load or lacks
// cuCtxSetCurrent (the message in err).
static int dfd_open(const char* lib, char* err, size_t n) {
	const char* cu = getenv("DISTFLASH_LIBCUDA");
	if (cu == NULL || cu[0] == 0) cu = "libcuda.so.1";
	void* d = dlopen(cu, RTLD_NOW | RTLD_GLOBAL);
	if (d == NULL) {
		snprintf(err, n, "cannot load the NVIDIA driver library %s: %s", cu, dlerror());
		return 3;
	}
	pd_cuCtxSetCurrent = (CUresult(*)(CUcontext))dlsym(d, "cuCtxSetCurrent");
	if (pd_cuCtxSetCurrent == NULL) {
		snprintf(err, n, "%s has no cuCtxSetCurrent", cu);
		return 3;
	}
	void* h = dlopen(lib, RTLD_NOW | RTLD_GLOBAL);
	if (h == NULL) {
		snprintf(err, n, "%s", dlerror());
		return 1;
	}
#define DFD_RESOLVE(name, sym, ret, params) \
	p_##name = (ret(*) params)dlsym(h, sym); \
	if (p_##name == NULL) { snprintf(err, n, "%s", sym); return 2; }
	DF_CUDNN_FUNCS(DFD_RESOLVE)
	return 0;
}

static size_t dfd_version(void) { return p_cudnnGetVersion(); }
static size_t dfd_cudart_version(void) { return p_cudnnGetCudartVersion(); }
static const char* dfd_error_string(int st) { return p_cudnnGetErrorString((cudnnStatus_t)st); }

// dfd_dlopen_global opens lib with RTLD_GLOBAL (its symbols then resolve for every later
// dlopen, and a dlopen of its soname finds it loaded); NULL and dlerror's message in err when it
// does not load.
static void* dfd_dlopen_global(const char* lib, char* err, size_t n) {
	void* h = dlopen(lib, RTLD_NOW | RTLD_GLOBAL);
	if (h == NULL) snprintf(err, n, "%s", dlerror());
	return h;
}

// dfd_nvrtc_version calls nvrtcVersion of the NVRTC library h and writes the path of the file
// that defines it into path (dladdr); 0, or 1 when h has no nvrtcVersion, 2 when it fails.
static int dfd_nvrtc_version(void* h, int* major, int* minor, char* path, size_t n) {
	int (*ver)(int*, int*) = (int (*)(int*, int*))dlsym(h, "nvrtcVersion");
	if (ver == NULL) return 1;
	if (ver(major, minor) != 0) return 2;
	Dl_info info;
	path[0] = 0;
	if (dladdr((void*)ver, &info) != 0 && info.dli_fname != NULL) snprintf(path, n, "%s", info.dli_fname);
	return 0;
}

// dfd_last is the message cuDNN keeps about the latest failure on this thread.
#define DFD_LAST_SIZE 512
typedef struct {
	char s[DFD_LAST_SIZE];
} dfd_last;

// dfd_status is a helper's outcome: the step that failed (0 for none: -1 is cuCtxSetCurrent),
// its result and cuDNN's message about it, read in the same call (on the same thread).
typedef struct {
	int step;
	int code;
	dfd_last last;
} dfd_status;

static dfd_status dfd_fail(int step, int code) {
	dfd_status st = {step, code, {{0}}};
	if (step > 0) p_cudnnGetLastErrorString(st.last.s, DFD_LAST_SIZE);
	return st;
}

// dfd_check turns a cuDNN result into a status (the message read on failure).
static dfd_status dfd_check(cudnnStatus_t s) {
	if (s != CUDNN_STATUS_SUCCESS) return dfd_fail(1, (int)s);
	return (dfd_status){0, 0, {{0}}};
}

#define DFD_CTX(c) \
	do { CUresult r_ = pd_cuCtxSetCurrent(c); if (r_ != CUDA_SUCCESS) return dfd_fail(-1, (int)r_); } while (0)
#define DFD_CALL(step, call) \
	do { cudnnStatus_t s_ = call; if (s_ != CUDNN_STATUS_SUCCESS) return dfd_fail(step, (int)s_); } while (0)
#define DFD_DONE return (dfd_status){0, 0, {{0}}}

// dfd_create makes a handle bound to stream s (cudnnCreate, cudnnSetStream).
static dfd_status dfd_create(CUcontext c, CUstream s, cudnnHandle_t* h) {
	DFD_CTX(c);
	DFD_CALL(1, p_cudnnCreate(h));
	DFD_CALL(2, p_cudnnSetStream(*h, (cudaStream_t)s));
	DFD_DONE;
}

static dfd_status dfd_destroy(CUcontext c, cudnnHandle_t h) {
	DFD_CTX(c);
	DFD_CALL(1, p_cudnnDestroy(h));
	DFD_DONE;
}

static dfd_status dfd_new(int type, cudnnBackendDescriptor_t* d) { return dfd_check(p_cudnnBackendCreateDescriptor(type, d)); }
static int dfd_free(cudnnBackendDescriptor_t d) { return p_cudnnBackendDestroyDescriptor(d); }
static dfd_status dfd_set(cudnnBackendDescriptor_t d, int attr, int type, int64_t n, const void* v) {
	return dfd_check(p_cudnnBackendSetAttribute(d, attr, type, n, v));
}
static dfd_status dfd_get(cudnnBackendDescriptor_t d, int attr, int type, int64_t req, int64_t* n, void* v) {
	return dfd_check(p_cudnnBackendGetAttribute(d, attr, type, req, n, v));
}

// dfd_set_descs sets an attribute to n descriptors (Go passes their addresses as integers).
static dfd_status dfd_set_descs(cudnnBackendDescriptor_t d, int attr, int64_t n, const uint64_t* v) {
	cudnnBackendDescriptor_t ds[64];
	if (n > 64) return (dfd_status){1, CUDNN_STATUS_BAD_PARAM, {"more than 64 descriptors"}};
	for (int64_t i = 0; i < n; i++) ds[i] = (cudnnBackendDescriptor_t)(uintptr_t)v[i];
	return dfd_check(p_cudnnBackendSetAttribute(d, attr, CUDNN_TYPE_BACKEND_DESCRIPTOR, n, ds));
}

// dfd_set_handle sets a handle attribute.
static dfd_status dfd_set_handle(cudnnBackendDescriptor_t d, int attr, cudnnHandle_t h) {
	return dfd_check(p_cudnnBackendSetAttribute(d, attr, CUDNN_TYPE_HANDLE, 1, &h));
}

// dfd_finalize finalises d with the device's context current (an execution plan compiles its
// kernels then).
static dfd_status dfd_finalize(CUcontext c, cudnnBackendDescriptor_t d) {
	DFD_CTX(c);
	DFD_CALL(1, p_cudnnBackendFinalize(d));
	DFD_DONE;
}

// dfd_heuristics asks an engine-heuristics descriptor for up to max engine configurations,
// which it creates in cfgs; *n is how many the heuristics returned (cfgs beyond it are freed
// and set to NULL).
static dfd_status dfd_heuristics(cudnnBackendDescriptor_t heur, int max, cudnnBackendDescriptor_t* cfgs, int64_t* n) {
	for (int i = 0; i < max; i++) {
		int st = p_cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, &cfgs[i]);
		if (st != CUDNN_STATUS_SUCCESS) {
			dfd_status f = dfd_fail(1, st);
			for (int j = 0; j < i; j++) {
				p_cudnnBackendDestroyDescriptor(cfgs[j]);
				cfgs[j] = NULL;
			}
			return f;
		}
	}
	*n = 0;
	dfd_status st = dfd_check(p_cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, max, n, cfgs));
	if (st.step != 0) *n = 0;
	if (*n > max) *n = max;
	for (int i = *n; i < max; i++) {
		p_cudnnBackendDestroyDescriptor(cfgs[i]);
		cfgs[i] = NULL;
	}
	return st;
}

// dfd_ptr turns an address Go holds as an integer (a stub's context or stream in the host-side
// tests) into a pointer.
static void* dfd_ptr(uintptr_t p) { return (void*)p; }

// dfd_engine_index returns the global index of an engine configuration's engine (-1 when it
// cannot be read).
static int64_t dfd_engine_index(cudnnBackendDescriptor_t cfg) {
	cudnnBackendDescriptor_t e = NULL;
	int64_t n = 0, idx = -1;
	if (p_cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINE_DESCRIPTOR, &e) != CUDNN_STATUS_SUCCESS) return -1;
	if (p_cudnnBackendGetAttribute(cfg, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n, &e) ==
	        CUDNN_STATUS_SUCCESS &&
	    n == 1)
		p_cudnnBackendGetAttribute(e, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &n, &idx);
	p_cudnnBackendDestroyDescriptor(e);
	return idx;
}

// dfd_execute runs plan with a variant pack of n tensors (uids[i] at address ptrs[i]: device
// memory, or host memory for a by-value tensor) and the workspace at ws, on the handle's
// stream. The variant pack is made, finalised, used and destroyed here, as cudnn-frontend does
// at each execution.
static dfd_status dfd_execute(CUcontext c, cudnnHandle_t h, cudnnBackendDescriptor_t plan, int64_t n,
                              const int64_t* uids, const uint64_t* ptrs, uint64_t ws) {
	void* ps[64];
	void* w = (void*)(uintptr_t)ws;
	cudnnBackendDescriptor_t vp = NULL;
	if (n > 64) return (dfd_status){1, CUDNN_STATUS_BAD_PARAM, {"a variant pack of more than 64 tensors"}};
	for (int64_t i = 0; i < n; i++) ps[i] = (void*)(uintptr_t)ptrs[i];
	DFD_CTX(c);
	DFD_CALL(1, p_cudnnBackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &vp));
	dfd_status st = {0, 0, {{0}}};
	cudnnStatus_t s;
	if ((s = p_cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, n, uids)) != 0)
		st = dfd_fail(2, s);
	else if ((s = p_cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, n, ps)) != 0)
		st = dfd_fail(3, s);
	else if ((s = p_cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &w)) != 0)
		st = dfd_fail(4, s);
	else if ((s = p_cudnnBackendFinalize(vp)) != 0)
		st = dfd_fail(5, s);
	else if ((s = p_cudnnBackendExecute(h, plan, vp)) != 0)
		st = dfd_fail(6, s);
	p_cudnnBackendDestroyDescriptor(vp);
	return st;
}
*/
import "C"

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"time"
	"unsafe"
)

// MinCUDNN is the oldest cuDNN this package drives: 9.0.0, the first release of libcudnn.so.9
// and of the graph API as cudnn_abi.h declares it.
const MinCUDNN = 90000

// CUDNNError is a failed cuDNN call.
type CUDNNError struct {
	Call string // the cuDNN function (and what it was doing)
	Code int    // its cudnnStatus_t
	Last string // cudnnGetLastErrorString right after the failure, if any
}

// Error names the call, its cudnnStatus_t, cuDNN's description of it and, for the statuses a
// missing or broken NVRTC gives, what that means.
func (e CUDNNError) Error() string {
	s := fmt.Sprintf("%s: cudnnStatus_t %d", e.Call, e.Code)
	if cudnnLib.loaded {
		if d := C.dfd_error_string(C.int(e.Code)); d != nil {
			s += " (" + C.GoString(d) + ")"
		}
	}
	if h := StatusHint(e.Code); h != "" {
		s += " [" + h + "]"
	}
	if e.Last != "" {
		s += ": " + e.Last
	}
	return s
}

// NotSupported reports whether cuDNN said it cannot compute what it was asked
// (CUDNN_STATUS_NOT_SUPPORTED and its sub-codes 3000-3999).
func (e CUDNNError) NotSupported() bool { return e.Code >= 3000 && e.Code < 4000 }

// StatusHint says what a cudnnStatus_t means for the fused attention where the status name
// alone does not: the runtime-compiled engines' missing NVRTC (3008), a compilation that
// failed (4001, usually a libnvrtc-builtins that does not match libnvrtc), a misaligned
// pointer (2003). "" for the other statuses.
func StatusHint(code int) string {
	switch code {
	case C.CUDNN_STATUS_NOT_SUPPORTED_RUNTIME_PREREQUISITE_MISSING:
		return "a library cuDNN loads at run time is missing: for the fused attention engines, NVRTC " +
			"(libnvrtc.so and libnvrtc-builtins.so of cuDNN's CUDA major)"
	case C.CUDNN_STATUS_INTERNAL_ERROR_COMPILATION_FAILED:
		return "cuDNN could not compile its fused attention kernel with NVRTC: libnvrtc-builtins missing " +
			"or of another CUDA version than libnvrtc"
	case C.CUDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER:
		return "a tensor's address is not aligned to its declared byte alignment"
	}
	return ""
}

// statusErr is the error of a helper's status (nil for success); the message cuDNN gave was
// read in the helper's own call, on the thread that failed.
func statusErr(call string, st C.dfd_status) error {
	switch {
	case st.step == 0:
		return nil
	case st.step < 0:
		return Error{Call: "cuCtxSetCurrent", Code: int(st.code)}
	}
	return CUDNNError{Call: call, Code: int(st.code), Last: strings.TrimSpace(C.GoString(&st.last.s[0]))}
}

// cudnnLib is the loaded cuDNN library. A failed load is remembered: LoadCUDNN returns the
// same error on every later call (the fallback to the own kernel is decided once per process).
var cudnnLib struct {
	once    sync.Once
	err     error
	loaded  bool
	file    string
	version int
	nvrtc   NVRTC
}

// NVRTC is the NVRTC LoadCUDNN loaded for cuDNN's runtime-compiled engines.
type NVRTC struct {
	File     string // libnvrtc.so.<major>
	Builtins string // libnvrtc-builtins.so.<major>.<minor>
	Major    int    // NVRTC's version (nvrtcVersion)
	Minor    int
}

// CUDNNCandidates lists the files LoadCUDNN tries, in order: $DISTFLASH_LIBCUDNN alone when
// set; else libcudnn.so.9 on the loader's path, the system directories that hold it, and the
// nvidia/cudnn/lib/libcudnn.so.9 of each site-packages directory of python3 (found by running
// python3 with a 10-second limit, when it is on PATH; LoadCUDNN runs it only when nothing
// before loads).
func CUDNNCandidates() []string {
	c, env := systemCandidates()
	if env {
		return c
	}
	return append(c, siteCandidates()...)
}

// systemCandidates returns $DISTFLASH_LIBCUDNN (and true) when set, else libcudnn.so.9 and the
// system directories' copies.
func systemCandidates() ([]string, bool) {
	if f := os.Getenv("DISTFLASH_LIBCUDNN"); f != "" {
		return []string{f}, true
	}
	c := []string{"libcudnn.so.9"}
	for _, dir := range systemLibDirs {
		if f := filepath.Join(dir, "libcudnn.so.9"); exists(f) {
			c = append(c, f)
		}
	}
	return c, false
}

// systemLibDirs are the system directories searched for cuDNN and NVRTC, after the loader's
// own path: the CUDA toolkit's and the distribution's library directories.
var systemLibDirs = []string{"/usr/local/cuda/lib64", "/usr/local/cuda/targets/x86_64-linux/lib",
	"/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/local/lib"}

// siteCandidates returns the libcudnn.so.9 of the nvidia-cudnn wheels in python3's
// site-packages.
func siteCandidates() []string {
	var c []string
	for _, dir := range sitePackages() {
		if f := filepath.Join(dir, "nvidia", "cudnn", "lib", "libcudnn.so.9"); exists(f) {
			c = append(c, f)
		}
	}
	return c
}

func exists(f string) bool {
	_, err := os.Stat(f)
	return err == nil
}

// sitePackages returns the site-packages directories of python3 (and the other directories of
// its sys.path), or nothing when there is no python3.
func sitePackages() []string {
	py, err := exec.LookPath("python3")
	if err != nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, py, "-c",
		"import site, sys\nfor p in site.getsitepackages() + [site.getusersitepackages()] + sys.path: print(p)").Output()
	if err != nil {
		return nil
	}
	var dirs []string
	seen := map[string]bool{}
	for _, d := range strings.Split(string(out), "\n") {
		if d = strings.TrimSpace(d); d != "" && !seen[d] {
			seen[d] = true
			dirs = append(dirs, d)
		}
	}
	return dirs
}

// LoadCUDNN opens cuDNN (the first of CUDNNCandidates that loads) and resolves the calls this
// package makes, checks its version (cudnnGetVersion) against MinCUDNN, then loads the NVRTC of
// cuDNN's CUDA major with RTLD_GLOBAL (the first of NVRTCCandidates that loads, and its
// libnvrtc-builtins). It returns the version (major·10000 + minor·100 + patch) and the file
// loaded. A failure, which names every file tried and how to install what is missing, is
// returned again by every later call.
func LoadCUDNN() (version int, file string, err error) {
	cudnnLib.once.Do(func() {
		cudnnLib.err = loadCUDNN()
		if cudnnLib.err == nil {
			cudnnLib.err = loadNVRTC()
		}
	})
	return cudnnLib.version, cudnnLib.file, cudnnLib.err
}

func loadCUDNN() error {
	const msgSize = 1024
	msg := (*C.char)(C.calloc(1, msgSize))
	defer C.free(unsafe.Pointer(msg))
	var tried []string
	from := ""
	if os.Getenv("DISTFLASH_LIBCUDNN") != "" {
		from = " (DISTFLASH_LIBCUDNN)"
	}
	// python3's site-packages are asked only when nothing before loads
	candidates, asked := systemCandidates()
	for i := 0; i < len(candidates); i++ {
		f := candidates[i]
		cf := C.CString(f)
		r := C.dfd_open(cf, msg, msgSize)
		C.free(unsafe.Pointer(cf))
		switch r {
		case 0:
			if err := cudnnGraphLoads(f); err != nil {
				return fmt.Errorf("%s%s: %w", f, from, err)
			}
			cudnnLib.loaded = true
			cudnnLib.file = f
			cudnnLib.version = int(C.dfd_version())
			if v := cudnnLib.version; v < MinCUDNN {
				return fmt.Errorf("cuDNN %s (%s%s) is too old: fused attention needs cuDNN %s or later (libcudnn.so.9's graph API)",
					CUDNNVersionString(v), f, from, CUDNNVersionString(MinCUDNN))
			}
			return nil
		case 1:
			tried = append(tried, C.GoString(msg))
			if i == len(candidates)-1 && !asked {
				candidates = append(candidates, siteCandidates()...)
				asked = true
			}
		case 2:
			return fmt.Errorf("%s%s has no %s: it is not cuDNN 9", f, from, C.GoString(msg))
		default:
			return fmt.Errorf("cudnn: %s", C.GoString(msg))
		}
	}
	return fmt.Errorf("cannot load cuDNN (tried %s): install cuDNN 9 (e.g. pip install nvidia-cudnn-cu12, or PyTorch, "+
		"whose site-packages hold nvidia/cudnn/lib) or set DISTFLASH_LIBCUDNN to the path of libcudnn.so.9",
		strings.Join(tried, "; "))
}

// cudnnGraphLoads checks that cuDNN 9's libcudnn.so.9 at f can reach its sub-library
// libcudnn_graph.so.9: the library forwards every call there, finding it through its run path
// ($ORIGIN) or the loader's, and aborts the process at the first call when it cannot. So it must
// be beside f (or the file f links to), or load by its name.
func cudnnGraphLoads(f string) error {
	const graph = "libcudnn_graph.so.9"
	if strings.Contains(f, "/") {
		real, err := filepath.EvalSymlinks(f)
		if exists(filepath.Join(filepath.Dir(f), graph)) || (err == nil && exists(filepath.Join(filepath.Dir(real), graph))) {
			return nil
		}
	}
	msg := (*C.char)(C.calloc(1, 1024))
	defer C.free(unsafe.Pointer(msg))
	cg := C.CString(graph)
	defer C.free(unsafe.Pointer(cg))
	if C.dfd_dlopen_global(cg, msg, 1024) == nil {
		return fmt.Errorf("cuDNN's sub-library %s is neither beside it nor on the loader's path (%s): libcudnn.so.9 alone cannot run "+
			"(it would abort at its first call); point DISTFLASH_LIBCUDNN at the libcudnn.so.9 of a whole cuDNN install or wheel", graph, C.GoString(msg))
	}
	return nil
}

// LoadedNVRTC is the NVRTC LoadCUDNN loaded (zero before, or when it failed).
func LoadedNVRTC() NVRTC { return cudnnLib.nvrtc }

// CUDNNVersionString writes a cudnnGetVersion code as major.minor.patch.
func CUDNNVersionString(v int) string {
	return fmt.Sprintf("%d.%d.%d", v/10000, v%10000/100, v%100)
}

// CUDACompiledFor is the CUDA major version the loaded cuDNN was built for (from
// cudnnGetCudartVersion: 12 for the -cu12 builds, 13 for -cu13), 0 before LoadCUDNN.
func CUDACompiledFor() int {
	if !cudnnLib.loaded {
		return 0
	}
	return int(C.dfd_cudart_version()) / 1000
}

// NVRTCCandidates lists the files LoadCUDNN tries for the NVRTC of CUDA major (12 or 13) that
// cuDNN at cudnnFile dlopens, in order: $DISTFLASH_LIBNVRTC alone when set; else the pip wheels'
// folders beside cuDNN's (cudnnFile's nvidia/cudnn/lib → nvidia/cuda_nvrtc/lib, and
// nvidia/cu13/lib for CUDA 13), libnvrtc.so.<major> on the loader's path (LD_LIBRARY_PATH, the
// loader's cache), the directories of $LD_LIBRARY_PATH and the system ones that hold it
// (/usr/local/cuda/lib64, ...), then the same wheel folders in python3's site-packages
// (python3 is asked only when nothing before loads; nvrtcSite lists them).
func NVRTCCandidates(cudnnFile string, major int) []string {
	c, env := nvrtcLocal(cudnnFile, major)
	if env {
		return c
	}
	return append(c, nvrtcSite(major)...)
}

// nvrtcWheelDirs are the folders of an nvidia/ wheel tree that hold NVRTC for CUDA major.
func nvrtcWheelDirs(nvidia string, major int) []string {
	d := []string{filepath.Join(nvidia, "cuda_nvrtc", "lib")}
	if major >= 13 {
		d = append(d, filepath.Join(nvidia, fmt.Sprintf("cu%d", major), "lib"))
	}
	return d
}

// nvrtcLocal returns $DISTFLASH_LIBNVRTC (and true) when set, else the candidates that need
// no python3.
func nvrtcLocal(cudnnFile string, major int) ([]string, bool) {
	if f := os.Getenv("DISTFLASH_LIBNVRTC"); f != "" {
		return []string{f}, true
	}
	name := fmt.Sprintf("libnvrtc.so.%d", major)
	var c []string
	seen := map[string]bool{}
	add := func(dir string) {
		f := filepath.Join(dir, name)
		if !seen[f] && exists(f) {
			seen[f] = true
			c = append(c, f)
		}
	}
	if strings.Contains(cudnnFile, "/") {
		lib := filepath.Dir(cudnnFile) // …/nvidia/cudnn/lib
		add(lib)
		for _, d := range nvrtcWheelDirs(filepath.Dir(filepath.Dir(lib)), major) {
			add(d)
		}
	}
	c = append(c, name)
	for _, d := range filepath.SplitList(os.Getenv("LD_LIBRARY_PATH")) {
		if d != "" {
			add(d)
		}
	}
	for _, d := range systemLibDirs {
		add(d)
	}
	return c, false
}

// nvrtcSite returns the libnvrtc.so.<major> of the NVRTC wheels in python3's site-packages.
func nvrtcSite(major int) []string {
	var c []string
	for _, dir := range sitePackages() {
		for _, d := range nvrtcWheelDirs(filepath.Join(dir, "nvidia"), major) {
			if f := filepath.Join(d, fmt.Sprintf("libnvrtc.so.%d", major)); exists(f) {
				c = append(c, f)
			}
		}
	}
	return c
}

// loadNVRTC loads the NVRTC of the CUDA major cuDNN was built for, and its builtins, with
// RTLD_GLOBAL (LoadCUDNN's doc comment says why).
func loadNVRTC() error {
	major := CUDACompiledFor()
	if major < 11 {
		return fmt.Errorf("cuDNN %s (%s) reports CUDA runtime version %d (cudnnGetCudartVersion): cannot tell which NVRTC it loads",
			CUDNNVersionString(cudnnLib.version), cudnnLib.file, int(C.dfd_cudart_version()))
	}
	const msgSize = 1024
	msg := (*C.char)(C.calloc(1, msgSize))
	defer C.free(unsafe.Pointer(msg))
	open := func(f string) (unsafe.Pointer, error) {
		cf := C.CString(f)
		defer C.free(unsafe.Pointer(cf))
		h := C.dfd_dlopen_global(cf, msg, msgSize)
		if h == nil {
			return nil, errors.New(C.GoString(msg))
		}
		return h, nil
	}
	var tried []string
	candidates, asked := nvrtcLocal(cudnnLib.file, major)
	for i := 0; i < len(candidates); i++ {
		f := candidates[i]
		h, err := open(f)
		if err != nil {
			tried = append(tried, err.Error())
			if i == len(candidates)-1 && !asked {
				candidates = append(candidates, nvrtcSite(major)...)
				asked = true
			}
			continue
		}
		var maj, min C.int
		path := (*C.char)(C.calloc(1, 4096))
		r := C.dfd_nvrtc_version(h, &maj, &min, path, 4096)
		where := C.GoString(path)
		C.free(unsafe.Pointer(path))
		if r != 0 {
			return fmt.Errorf("%s is not NVRTC (no working nvrtcVersion): cuDNN's fused attention needs libnvrtc.so.%d", f, major)
		}
		if where == "" {
			where = f
		}
		n := NVRTC{File: where, Major: int(maj), Minor: int(min)}
		if n.Major != major {
			return fmt.Errorf("%s is NVRTC %d.%d, cuDNN %s (%s) was built for CUDA %d and loads libnvrtc.so.%d",
				where, n.Major, n.Minor, CUDNNVersionString(cudnnLib.version), cudnnLib.file, major, major)
		}
		// NVRTC dlopens its builtins by this name at its first compilation: beside it (wheels and
		// toolkits keep them in one folder), else wherever the loader finds it
		builtins := fmt.Sprintf("libnvrtc-builtins.so.%d.%d", n.Major, n.Minor)
		var btried []string
		for _, b := range []string{filepath.Join(filepath.Dir(where), builtins), builtins} {
			if _, err := open(b); err != nil {
				btried = append(btried, err.Error())
				continue
			}
			n.Builtins = b
			break
		}
		if n.Builtins == "" {
			return fmt.Errorf("NVRTC %d.%d (%s) loads, but its %s does not (tried %s): cuDNN's fused attention compiles its kernels with both; "+
				"reinstall the NVRTC wheel (pip install %s) or put the toolkit's lib64 on LD_LIBRARY_PATH",
				n.Major, n.Minor, where, builtins, strings.Join(btried, "; "), nvrtcWheel(major))
		}
		cudnnLib.nvrtc = n
		return nil
	}
	return fmt.Errorf("cuDNN %s (%s) was found, but not the NVRTC it compiles its fused attention kernels with (tried %s): "+
		"install it (pip install %s, which PyTorch's CUDA wheels bring) or set DISTFLASH_LIBNVRTC to the path of libnvrtc.so.%d",
		CUDNNVersionString(cudnnLib.version), cudnnLib.file, strings.Join(tried, "; "), nvrtcWheel(major), major)
}

// nvrtcWheel names the pip package with NVRTC for CUDA major.
func nvrtcWheel(major int) string {
	if major >= 13 {
		return fmt.Sprintf("nvidia-cuda-nvrtc==%d.*", major)
	}
	return fmt.Sprintf("nvidia-cuda-nvrtc-cu%d", major)
}

// DNN is cuDNN on one device: a handle whose work is queued on the device's compute stream, so
// that it is ordered with every kernel and copy of the Device. Its methods may be called from
// any goroutine, not concurrently.
type DNN struct {
	Version int    // cudnnGetVersion of the library loaded
	File    string // the library loaded

	ctx    C.CUcontext
	stream C.CUstream
	h      C.cudnnHandle_t
}

// DNN loads cuDNN (LoadCUDNN) and returns a handle on d's compute stream.
func (d *Device) DNN() (*DNN, error) {
	if d.closed.Load() {
		return nil, fmt.Errorf("cudnn: device %d (%s) is closed", d.Ordinal, d.Name)
	}
	return openDNN(d.ctx, d.stream)
}

// OpenDNNOn is DNN for a context and stream given as raw handles: a stub's, in the host-side
// tests, whose backend runs on a fake device.
func OpenDNNOn(ctx, stream uintptr) (*DNN, error) {
	return openDNN(C.CUcontext(C.dfd_ptr(C.uintptr_t(ctx))), C.CUstream(C.dfd_ptr(C.uintptr_t(stream))))
}

func openDNN(ctx C.CUcontext, stream C.CUstream) (*DNN, error) {
	v, f, err := LoadCUDNN()
	if err != nil {
		return nil, err
	}
	n := &DNN{Version: v, File: f, ctx: ctx, stream: stream}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := statusErr("cudnnCreate/cudnnSetStream", C.dfd_create(ctx, stream, &n.h)); err != nil {
		return nil, err
	}
	return n, nil
}

// finalize finalises d with the device's context current; call names it in an error.
func (n *DNN) finalize(d C.cudnnBackendDescriptor_t, call string) error {
	return statusErr(call, C.dfd_finalize(n.ctx, d))
}

// execute runs plan with the variant pack uids/addrs and the workspace ws.
func (n *DNN) execute(plan C.cudnnBackendDescriptor_t, uids []C.int64_t, addrs []C.uint64_t, ws C.uint64_t) error {
	return statusErr("cudnnBackendExecute", C.dfd_execute(n.ctx, n.h, plan, C.int64_t(len(uids)), &uids[0], &addrs[0], ws))
}

// Close destroys the handle.
func (n *DNN) Close() error {
	if n.h == nil {
		return nil
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	err := statusErr("cudnnDestroy", C.dfd_destroy(n.ctx, n.h))
	n.h = nil
	return err
}

// The cgo calls of the graph builder (cudnn_graph.go), which cannot reach this file's C helpers.
// Each returns the failure with cuDNN's message, read in the same C call.

func descNew(what string, t int, d *C.cudnnBackendDescriptor_t) error {
	return statusErr("cudnnBackendCreateDescriptor("+what+")", C.dfd_new(C.int(t), d))
}

func descFree(d C.cudnnBackendDescriptor_t) C.int { return C.dfd_free(d) }

func descSet(what string, d C.cudnnBackendDescriptor_t, attr, typ, count int, p unsafe.Pointer) error {
	return statusErr("cudnnBackendSetAttribute("+what+")", C.dfd_set(d, C.int(attr), C.int(typ), C.int64_t(count), p))
}

func descGet(what string, d C.cudnnBackendDescriptor_t, attr, typ int, req int64, n *C.int64_t, p unsafe.Pointer) error {
	return statusErr("cudnnBackendGetAttribute("+what+")", C.dfd_get(d, C.int(attr), C.int(typ), C.int64_t(req), n, p))
}

func descSetDescs(what string, d C.cudnnBackendDescriptor_t, attr int, v []C.uint64_t) error {
	return statusErr("cudnnBackendSetAttribute("+what+")", C.dfd_set_descs(d, C.int(attr), C.int64_t(len(v)), &v[0]))
}

func descSetHandle(what string, d C.cudnnBackendDescriptor_t, attr int, h C.cudnnHandle_t) error {
	return statusErr("cudnnBackendSetAttribute("+what+")", C.dfd_set_handle(d, C.int(attr), h))
}

func heuristics(heur C.cudnnBackendDescriptor_t, cfgs []C.cudnnBackendDescriptor_t, n *C.int64_t) error {
	return statusErr("cudnnBackendGetAttribute(engine heuristics results)", C.dfd_heuristics(heur, C.int(len(cfgs)), &cfgs[0], n))
}

func engineIndex(cfg C.cudnnBackendDescriptor_t) int64 { return int64(C.dfd_engine_index(cfg)) }
