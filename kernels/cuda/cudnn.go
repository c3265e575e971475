//go:build cuda

package cuda

// cuDNN's backend (graph) API, opened at run time like the driver, cuBLAS and NCCL:
// libcudnn.so.9 is loaded at the first LoadCUDNN, never before, so a -tags cuda binary on a
// machine without cuDNN starts and runs everything else. Its declarations come from
// cudnn_abi.h, not cuDNN's headers. The library is looked for in this order: the file
// $DISTFLASH_LIBCUDNN names (then nowhere else); libcudnn.so.9 on the loader's path; the usual
// system directories (/usr/local/cuda/lib64, /usr/lib/x86_64-linux-gnu, ...); the
// nvidia/cudnn/lib directory of a pip-installed nvidia-cudnn-cu12/-cu13 wheel (PyTorch's) in
// the site-packages of python3. The wheel's library finds its sub-libraries and NVRTC through
// its own run path.
//
// This file's C helpers have their own pointer to cuCtxSetCurrent (cgo compiles each file's
// preamble apart), resolved in the driver library (libcuda.so.1 or $DISTFLASH_LIBCUDA): cuDNN
// runs on the context current on the calling thread, so every helper that reaches the device
// (handle creation, plan finalisation, execution) makes the device's context current first.

/*
#cgo LDFLAGS: -ldl
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
static const char* dfd_error_string(int st) { return p_cudnnGetErrorString((cudnnStatus_t)st); }
static void dfd_last_error(char* msg, size_t n) { p_cudnnGetLastErrorString(msg, n); }

// dfd_status is a helper's outcome: the step that failed (0 for none: -1 is cuCtxSetCurrent)
// and its result.
typedef struct {
	int step;
	int code;
} dfd_status;

#define DFD_CTX(c) \
	do { CUresult r_ = pd_cuCtxSetCurrent(c); if (r_ != CUDA_SUCCESS) return (dfd_status){-1, (int)r_}; } while (0)
#define DFD_CALL(step, call) \
	do { cudnnStatus_t s_ = call; if (s_ != CUDNN_STATUS_SUCCESS) return (dfd_status){step, (int)s_}; } while (0)
#define DFD_DONE return (dfd_status){0, 0}

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

static int dfd_new(int type, cudnnBackendDescriptor_t* d) { return p_cudnnBackendCreateDescriptor(type, d); }
static int dfd_free(cudnnBackendDescriptor_t d) { return p_cudnnBackendDestroyDescriptor(d); }
static int dfd_set(cudnnBackendDescriptor_t d, int attr, int type, int64_t n, const void* v) {
	return p_cudnnBackendSetAttribute(d, attr, type, n, v);
}
static int dfd_get(cudnnBackendDescriptor_t d, int attr, int type, int64_t req, int64_t* n, void* v) {
	return p_cudnnBackendGetAttribute(d, attr, type, req, n, v);
}

// dfd_set_descs sets an attribute to n descriptors (Go passes their addresses as integers).
static int dfd_set_descs(cudnnBackendDescriptor_t d, int attr, int64_t n, const uint64_t* v) {
	cudnnBackendDescriptor_t ds[64];
	if (n > 64) return CUDNN_STATUS_BAD_PARAM;
	for (int64_t i = 0; i < n; i++) ds[i] = (cudnnBackendDescriptor_t)(uintptr_t)v[i];
	return p_cudnnBackendSetAttribute(d, attr, CUDNN_TYPE_BACKEND_DESCRIPTOR, n, ds);
}

// dfd_set_handle sets a handle attribute.
static int dfd_set_handle(cudnnBackendDescriptor_t d, int attr, cudnnHandle_t h) {
	return p_cudnnBackendSetAttribute(d, attr, CUDNN_TYPE_HANDLE, 1, &h);
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
static int dfd_heuristics(cudnnBackendDescriptor_t heur, int max, cudnnBackendDescriptor_t* cfgs, int64_t* n) {
	for (int i = 0; i < max; i++) {
		int st = p_cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, &cfgs[i]);
		if (st != CUDNN_STATUS_SUCCESS) {
			for (int j = 0; j < i; j++) {
				p_cudnnBackendDestroyDescriptor(cfgs[j]);
				cfgs[j] = NULL;
			}
			return st;
		}
	}
	*n = 0;
	int st = p_cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, max, n, cfgs);
	if (st != CUDNN_STATUS_SUCCESS) *n = 0;
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
	if (n > 64) return (dfd_status){1, CUDNN_STATUS_BAD_PARAM};
	for (int64_t i = 0; i < n; i++) ps[i] = (void*)(uintptr_t)ptrs[i];
	DFD_CTX(c);
	DFD_CALL(1, p_cudnnBackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &vp));
	dfd_status st = {0, 0};
	cudnnStatus_t s;
	if ((s = p_cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, n, uids)) != 0)
		st = (dfd_status){2, s};
	else if ((s = p_cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, n, ps)) != 0)
		st = (dfd_status){3, s};
	else if ((s = p_cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &w)) != 0)
		st = (dfd_status){4, s};
	else if ((s = p_cudnnBackendFinalize(vp)) != 0)
		st = (dfd_status){5, s};
	else if ((s = p_cudnnBackendExecute(h, plan, vp)) != 0)
		st = (dfd_status){6, s};
	p_cudnnBackendDestroyDescriptor(vp);
	return st;
}
*/
import "C"

import (
	"context"
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

// Error names the call, its cudnnStatus_t and cuDNN's description of it.
func (e CUDNNError) Error() string {
	s := fmt.Sprintf("%s: cudnnStatus_t %d", e.Call, e.Code)
	if cudnnLib.loaded {
		if d := C.dfd_error_string(C.int(e.Code)); d != nil {
			s += " (" + C.GoString(d) + ")"
		}
	}
	if e.Last != "" {
		s += ": " + e.Last
	}
	return s
}

// NotSupported reports whether cuDNN said it cannot compute what it was asked
// (CUDNN_STATUS_NOT_SUPPORTED and its sub-codes 3000-3999).
func (e CUDNNError) NotSupported() bool { return e.Code >= 3000 && e.Code < 4000 }

// lastError is cuDNN's message about the latest failure on this thread.
func lastError() string {
	var buf [512]C.char
	C.dfd_last_error(&buf[0], C.size_t(len(buf)))
	return strings.TrimSpace(C.GoString(&buf[0]))
}

func cudnnErr(call string, st C.int) error {
	if st == C.CUDNN_STATUS_SUCCESS {
		return nil
	}
	return CUDNNError{Call: call, Code: int(st), Last: lastError()}
}

// cudnnLib is the loaded cuDNN library. A failed load is remembered: LoadCUDNN returns the
// same error on every later call (the fallback to the own kernel is decided once per process).
var cudnnLib struct {
	once    sync.Once
	err     error
	loaded  bool
	file    string
	version int
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
	for _, dir := range []string{"/usr/local/cuda/lib64", "/usr/local/cuda/targets/x86_64-linux/lib",
		"/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/local/lib"} {
		if f := filepath.Join(dir, "libcudnn.so.9"); exists(f) {
			c = append(c, f)
		}
	}
	return c, false
}

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
// package makes, then checks its version (cudnnGetVersion) against MinCUDNN. It returns the
// version (major·10000 + minor·100 + patch) and the file loaded. A failure, which names every
// file tried and how to install cuDNN, is returned again by every later call.
func LoadCUDNN() (version int, file string, err error) {
	cudnnLib.once.Do(func() {
		cudnnLib.err = loadCUDNN()
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

// CUDNNVersionString writes a cudnnGetVersion code as major.minor.patch.
func CUDNNVersionString(v int) string {
	return fmt.Sprintf("%d.%d.%d", v/10000, v%10000/100, v%100)
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
	if err := n.status("cudnnCreate/cudnnSetStream", C.dfd_create(ctx, stream, &n.h)); err != nil {
		return nil, err
	}
	return n, nil
}

// status returns nil for a helper that succeeded, else the failure of the call it names.
func (n *DNN) status(call string, st C.dfd_status) error {
	switch {
	case st.step == 0:
		return nil
	case st.step < 0:
		return Error{Call: "cuCtxSetCurrent", Code: int(st.code)}
	}
	return CUDNNError{Call: call, Code: int(st.code), Last: lastError()}
}

// The cgo calls of the graph builder (cudnn_graph.go), which cannot reach this file's C helpers.

func descNew(t int, d *C.cudnnBackendDescriptor_t) C.int { return C.dfd_new(C.int(t), d) }
func descFree(d C.cudnnBackendDescriptor_t) C.int        { return C.dfd_free(d) }

func descSet(d C.cudnnBackendDescriptor_t, attr, typ, count int, p unsafe.Pointer) C.int {
	return C.dfd_set(d, C.int(attr), C.int(typ), C.int64_t(count), p)
}

func descGet(d C.cudnnBackendDescriptor_t, attr, typ int, req int64, n *C.int64_t, p unsafe.Pointer) C.int {
	return C.dfd_get(d, C.int(attr), C.int(typ), C.int64_t(req), n, p)
}

func descSetDescs(d C.cudnnBackendDescriptor_t, attr int, v []C.uint64_t) C.int {
	return C.dfd_set_descs(d, C.int(attr), C.int64_t(len(v)), &v[0])
}

func descSetHandle(d C.cudnnBackendDescriptor_t, attr int, h C.cudnnHandle_t) C.int {
	return C.dfd_set_handle(d, C.int(attr), h)
}

func heuristics(heur C.cudnnBackendDescriptor_t, cfgs []C.cudnnBackendDescriptor_t, n *C.int64_t) C.int {
	return C.dfd_heuristics(heur, C.int(len(cfgs)), &cfgs[0], n)
}

func engineIndex(cfg C.cudnnBackendDescriptor_t) int64 { return int64(C.dfd_engine_index(cfg)) }

// finalize finalises d with the device's context current; call names it in an error.
func (n *DNN) finalize(d C.cudnnBackendDescriptor_t, call string) error {
	return n.status(call, C.dfd_finalize(n.ctx, d))
}

// execute runs plan with the variant pack uids/addrs and the workspace ws.
func (n *DNN) execute(plan C.cudnnBackendDescriptor_t, uids []C.int64_t, addrs []C.uint64_t, ws C.uint64_t) error {
	return n.status("cudnnBackendExecute", C.dfd_execute(n.ctx, n.h, plan, C.int64_t(len(uids)), &uids[0], &addrs[0], ws))
}

// Close destroys the handle.
func (n *DNN) Close() error {
	if n.h == nil {
		return nil
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	err := n.status("cudnnDestroy", C.dfd_destroy(n.ctx, n.h))
	n.h = nil
	return err
}
