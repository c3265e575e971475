//go:build cuda

// Package cuda is the thin layer over the CUDA driver API and cuBLAS that the CUDA backend of
// package kernels (kernels/cuda*.go, build tag cuda) runs on: device and primary context, one
// stream, stream-ordered memory, copies, module loading, kernel launches and GEMMs, through cgo,
// with the driver and cuBLAS opened at run time (Load) rather than linked.
// It also holds the backend's CUDA C sources (*.cu) and embeds the PTX and cubins that
// scripts/build_cuda.sh compiles from them into image/ (Image, image.go).
//
// It is a package of its own because a Go package may not mix cgo with Go assembly, which
// package kernels has (its CPU GEMM). gorgonia.org/cu, the binding the design first named, is not
// available from this project's module proxy, so the few driver calls needed are bound here.
// Every C helper makes the device's context current on the calling OS thread before its driver
// call, because a goroutine may run each cgo call on a different thread.
package cuda

/*
#cgo LDFLAGS: -ldl
#include "cuda_abi.h"
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// The driver (libcuda.so.1) and cuBLAS are opened with dlopen at the first Open, not linked,
// and their declarations come from cuda_abi.h, not the toolkit's headers: the package builds
// with a C compiler alone, a -tags cuda binary starts, plans and trains on the CPU on a machine
// without the NVIDIA driver or the CUDA toolkit, and it runs on any cuBLAS major version from
// 11 on (the calls used here have kept their ABI). Each entry point NAME is a pointer p_NAME.
#define DF_DECLARE(name, sym, ret, params) static ret(*p_##name) params;
DF_CU_FUNCS(DF_DECLARE)
DF_CU_TIMING_FUNCS(DF_DECLARE)
DF_BLAS_FUNCS(DF_DECLARE)
DF_BLAS_OPTIONAL_FUNCS(DF_DECLARE)

// df_cublas_names are the cuBLAS libraries tried in order when DISTFLASH_CUBLAS names none.
static const char* df_cublas_names[] = {"libcublas.so.13", "libcublas.so.12", "libcublas.so.11", "libcublas.so"};

// df_open_libs opens libcuda.so.1 (or $DISTFLASH_LIBCUDA) and cuBLAS (or $DISTFLASH_CUBLAS) and
// resolves every entry point. It returns 0, or 1 with a message in err.
static int df_open_libs(char* err, size_t n) {
	const char* cu = getenv("DISTFLASH_LIBCUDA");
	if (cu == NULL || cu[0] == 0) cu = "libcuda.so.1";
	void* h = dlopen(cu, RTLD_NOW | RTLD_GLOBAL);
	if (h == NULL) {
		snprintf(err, n, "cannot load the NVIDIA driver library %s (is an NVIDIA driver installed? DISTFLASH_LIBCUDA names another path): %s", cu, dlerror());
		return 1;
	}
#define DF_RESOLVE_CU(name, sym, ret, params) \
	p_##name = (ret(*) params)dlsym(h, sym); \
	if (p_##name == NULL) { snprintf(err, n, "%s has no %s: the driver is older than CUDA 11.8", cu, sym); return 1; }
	DF_CU_FUNCS(DF_RESOLVE_CU)
	// The timer's entry points: the symbol, else the unversioned name; else NULL
	// (df_event_elapsed then fails with CUDA_ERROR_NOT_SUPPORTED).
#define DF_RESOLVE_TIMING(name, sym, ret, params) \
	p_##name = (ret(*) params)dlsym(h, sym); \
	if (p_##name == NULL) p_##name = (ret(*) params)dlsym(h, #name);
	DF_CU_TIMING_FUNCS(DF_RESOLVE_TIMING)
	const char* blas = getenv("DISTFLASH_CUBLAS");
	void* b = NULL;
	char tried[512] = "";
	if (blas != NULL && blas[0] != 0) {
		b = dlopen(blas, RTLD_NOW | RTLD_GLOBAL);
		if (b == NULL) snprintf(tried, sizeof tried, "%s", dlerror());
	} else {
		for (size_t i = 0; i < sizeof df_cublas_names / sizeof df_cublas_names[0] && b == NULL; i++) {
			blas = df_cublas_names[i];
			b = dlopen(blas, RTLD_NOW | RTLD_GLOBAL);
			if (b == NULL) {
				size_t len = strlen(tried);
				snprintf(tried + len, sizeof tried - len, "%s%s", len ? "; " : "", dlerror());
			}
		}
	}
	if (b == NULL) {
		snprintf(err, n, "cannot load cuBLAS (set LD_LIBRARY_PATH to its directory or DISTFLASH_CUBLAS to the file): %s", tried);
		return 1;
	}
#define DF_RESOLVE_BLAS(name, sym, ret, params) \
	p_##name = (ret(*) params)dlsym(b, sym); \
	if (p_##name == NULL) { snprintf(err, n, "%s has no %s", blas, sym); return 1; }
	DF_BLAS_FUNCS(DF_RESOLVE_BLAS)
	// cublasSetWorkspace (not in every cuBLAS 11): NULL when missing, and cuBLAS keeps its own
#define DF_RESOLVE_BLAS_OPTIONAL(name, sym, ret, params) p_##name = (ret(*) params)dlsym(b, sym);
	DF_BLAS_OPTIONAL_FUNCS(DF_RESOLVE_BLAS_OPTIONAL)
	return 0;
}

static CUresult df_init(void) { return p_cuInit(0); }
static CUresult df_device_count(int* n) { return p_cuDeviceGetCount(n); }
static CUresult df_device_get(CUdevice* d, int ordinal) { return p_cuDeviceGet(d, ordinal); }
static CUresult df_device_name(char* name, int len, CUdevice d) { return p_cuDeviceGetName(name, len, d); }
static CUresult df_device_attr(int* v, CUdevice_attribute a, CUdevice d) { return p_cuDeviceGetAttribute(v, a, d); }
static CUresult df_ctx_retain(CUcontext* c, CUdevice d) { return p_cuDevicePrimaryCtxRetain(c, d); }
static CUresult df_ctx_release(CUdevice d) { return p_cuDevicePrimaryCtxRelease(d); }
static CUresult df_ctx_current(CUcontext c) { return p_cuCtxSetCurrent(c); }
static CUresult df_stream_create(CUstream* s) { return p_cuStreamCreate(s, CU_STREAM_NON_BLOCKING); }
static CUresult df_stream_destroy(CUstream s) { return p_cuStreamDestroy(s); }
static CUresult df_module_unload(CUmodule m) { return p_cuModuleUnload(m); }

// df_error_name and df_error_string describe a CUresult (NULL before the driver is loaded).
static const char* df_error_name(CUresult r) {
	const char* s = NULL;
	if (p_cuGetErrorName != NULL) p_cuGetErrorName(r, &s);
	return s;
}
static const char* df_error_string(CUresult r) {
	const char* s = NULL;
	if (p_cuGetErrorString != NULL) p_cuGetErrorString(r, &s);
	return s;
}
static const char* df_blas_status_name(int st) { return p_cublasGetStatusName((cublasStatus_t)st); }
static const char* df_blas_status_string(int st) { return p_cublasGetStatusString((cublasStatus_t)st); }

static CUresult df_alloc(CUcontext c, CUstream s, CUdeviceptr* p, size_t bytes) {
	CUresult r = p_cuCtxSetCurrent(c);
	if (r != CUDA_SUCCESS) return r;
	r = p_cuMemAllocAsync(p, bytes, s);
	if (r != CUDA_SUCCESS) return r;
	return p_cuMemsetD32Async(*p, 0, bytes / 4, s);
}

static CUresult df_free(CUcontext c, CUstream s, CUdeviceptr p) {
	CUresult r = p_cuCtxSetCurrent(c);
	if (r != CUDA_SUCCESS) return r;
	return p_cuMemFreeAsync(p, s);
}

static CUresult df_htod(CUcontext c, CUstream s, CUdeviceptr dst, const void* src, size_t bytes) {
	CUresult r = p_cuCtxSetCurrent(c);
	if (r != CUDA_SUCCESS) return r;
	return p_cuMemcpyHtoDAsync(dst, src, bytes, s);
}

static CUresult df_dtoh(CUcontext c, CUstream s, void* dst, CUdeviceptr src, size_t bytes) {
	CUresult r = p_cuCtxSetCurrent(c);
	if (r != CUDA_SUCCESS) return r;
	r = p_cuMemcpyDtoHAsync(dst, src, bytes, s);
	if (r != CUDA_SUCCESS) return r;
	return p_cuStreamSynchronize(s);
}

static CUresult df_dtod(CUcontext c, CUstream s, CUdeviceptr dst, CUdeviceptr src, size_t bytes) {
	CUresult r = p_cuCtxSetCurrent(c);
	if (r != CUDA_SUCCESS) return r;
	return p_cuMemcpyDtoDAsync(dst, src, bytes, s);
}

static CUresult df_memset32(CUcontext c, CUstream s, CUdeviceptr dst, unsigned int v, size_t n) {
	CUresult r = p_cuCtxSetCurrent(c);
	if (r != CUDA_SUCCESS) return r;
	return p_cuMemsetD32Async(dst, v, n, s);
}

static CUresult df_sync(CUcontext c, CUstream s) {
	CUresult r = p_cuCtxSetCurrent(c);
	if (r != CUDA_SUCCESS) return r;
	return p_cuStreamSynchronize(s);
}

// df_launch launches f with its parameters stored one per 64-bit slot of vals (a 32-bit
// parameter in the low half of its slot, little-endian).
static CUresult df_launch(CUcontext c, CUstream s, CUfunction f, unsigned gx, unsigned gy, unsigned bx,
                          unsigned smem, unsigned long long* vals, int n) {
	void* ptrs[32];
	if (n > 32) return CUDA_ERROR_INVALID_VALUE;
	for (int i = 0; i < n; i++) ptrs[i] = &vals[i];
	CUresult r = p_cuCtxSetCurrent(c);
	if (r != CUDA_SUCCESS) return r;
	return p_cuLaunchKernel(f, gx, gy, 1, bx, 1, 1, smem, s, ptrs, NULL);
}

static CUresult df_load(CUcontext c, CUmodule* m, const void* image, char* log, size_t logSize) {
	CUresult r = p_cuCtxSetCurrent(c);
	if (r != CUDA_SUCCESS) return r;
	CUjit_option opts[2] = {CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES};
	void* vals[2] = {log, (void*)(uintptr_t)logSize};
	return p_cuModuleLoadDataEx(m, image, 2, opts, vals);
}

// The per-op profile's timing events: made with timing (CU_EVENT_DEFAULT), recorded on the
// stream, and the time between two once the later one is reached (the host waits for it).
static CUresult df_event_create(CUcontext c, CUevent* e) {
	CUresult r = p_cuCtxSetCurrent(c);
	if (r != CUDA_SUCCESS) return r;
	return p_cuEventCreate(e, CU_EVENT_DEFAULT);
}

static CUresult df_event_record(CUcontext c, CUstream s, CUevent e) {
	CUresult r = p_cuCtxSetCurrent(c);
	if (r != CUDA_SUCCESS) return r;
	return p_cuEventRecord(e, s);
}

static CUresult df_event_elapsed(CUcontext c, CUevent from, CUevent to, float* ms) {
	if (p_cuEventSynchronize == NULL || p_cuEventElapsedTime == NULL) return CUDA_ERROR_NOT_SUPPORTED;
	CUresult r = p_cuCtxSetCurrent(c);
	if (r != CUDA_SUCCESS) return r;
	r = p_cuEventSynchronize(to);
	if (r != CUDA_SUCCESS) return r;
	return p_cuEventElapsedTime(ms, from, to);
}

static CUresult df_event_destroy(CUcontext c, CUevent e) {
	CUresult r = p_cuCtxSetCurrent(c);
	if (r != CUDA_SUCCESS) return r;
	return p_cuEventDestroy(e);
}

static CUresult df_func(CUcontext c, CUmodule m, CUfunction* f, const char* name, int smemOptin) {
	CUresult r = p_cuCtxSetCurrent(c);
	if (r != CUDA_SUCCESS) return r;
	r = p_cuModuleGetFunction(f, m, name);
	if (r != CUDA_SUCCESS) return r;
	int static_smem = 0;
	r = p_cuFuncGetAttribute(&static_smem, CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, *f);
	if (r != CUDA_SUCCESS) return r;
	return p_cuFuncSetAttribute(*f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smemOptin - static_smem);
}

static CUresult df_pool(CUdevice d) {
	CUmemoryPool pool;
	CUresult r = p_cuDeviceGetDefaultMemPool(&pool, d);
	if (r != CUDA_SUCCESS) return r;
	cuuint64_t keep = UINT64_MAX;  // keep freed memory in the pool: allocation then costs no driver call
	return p_cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep);
}

// df_blas_create makes the cuBLAS handle, bound to the stream, in the default math mode with
// reduced-precision reductions disallowed: a GEMM with a 16-bit C (CUDA_R_16BF/16F) then sums
// split-K partial products in its float32 compute type and rounds once, as the CPU backend's
// reference does (the default lets cuBLAS round the partials to the 16-bit output type first).
// The compute type of every call stays explicit (df_gemm), so the math mode enables nothing
// else (no TF32: that would take CUBLAS_TF32_TENSOR_OP_MATH).
static int df_blas_create(CUcontext c, CUstream s, cublasHandle_t* h) {
	if (p_cuCtxSetCurrent(c) != CUDA_SUCCESS) return -1;
	cublasStatus_t st = p_cublasCreate(h);
	if (st != CUBLAS_STATUS_SUCCESS) return st;
	st = p_cublasSetStream(*h, (cudaStream_t)s);
	if (st != CUBLAS_STATUS_SUCCESS) return st;
	return p_cublasSetMathMode(*h, CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION);
}

// df_blas_workspace gives the handle the workspace at ws (after cublasSetStream, which resets
// it); -2 when this cuBLAS has no cublasSetWorkspace.
static int df_blas_workspace(CUcontext c, cublasHandle_t h, CUdeviceptr ws, size_t bytes) {
	if (p_cublasSetWorkspace == NULL) return -2;
	if (p_cuCtxSetCurrent(c) != CUDA_SUCCESS) return -1;
	return p_cublasSetWorkspace(h, (void*)ws, bytes);
}

static int df_blas_destroy(CUcontext c, cublasHandle_t h) {
	if (p_cuCtxSetCurrent(c) != CUDA_SUCCESS) return -1;
	return p_cublasDestroy(h);
}

// df_gemm is one cublasGemmEx call on column-major matrices of the cudaDataType at, bt and
// ct (CUDA_R_32F, CUDA_R_16BF, CUDA_R_16F); compute selects the compute type: 0
// CUBLAS_COMPUTE_32F (exact float32 on float32 operands, tensor cores on 16-bit ones), 1 float32
// operands rounded to bfloat16, 2 to binary16, both with float32 accumulation. alpha and beta are
// float32 (the scale type of every COMPUTE_32F mode).
static int df_gemm(CUcontext c, cublasHandle_t h, int ta, int tb, int m, int n, int k, float alpha,
                   CUdeviceptr A, int at, int lda, CUdeviceptr B, int bt, int ldb, float beta, CUdeviceptr C, int ct,
                   int ldc, int compute) {
	if (p_cuCtxSetCurrent(c) != CUDA_SUCCESS) return -1;
	cublasComputeType_t comp = CUBLAS_COMPUTE_32F;
	if (compute == 1) comp = CUBLAS_COMPUTE_32F_FAST_16BF;
	if (compute == 2) comp = CUBLAS_COMPUTE_32F_FAST_16F;
	return p_cublasGemmEx(h, ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb ? CUBLAS_OP_T : CUBLAS_OP_N, m, n, k, &alpha,
	                      (const void*)A, (cudaDataType)at, lda, (const void*)B, (cudaDataType)bt, ldb, &beta, (void*)C,
	                      (cudaDataType)ct, ldc, comp, CUBLAS_GEMM_DEFAULT);
}
*/
import "C"

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"unsafe"
)

// Error is a failed CUDA driver call.
type Error struct {
	Call string // the driver function
	Code int    // its CUresult
}

func (e Error) Error() string {
	name, desc := C.df_error_name(C.CUresult(e.Code)), C.df_error_string(C.CUresult(e.Code))
	n, d := fmt.Sprintf("CUresult %d", e.Code), ""
	if name != nil {
		n = C.GoString(name)
	}
	if desc != nil {
		d = ": " + C.GoString(desc)
	}
	return fmt.Sprintf("%s: %s%s", e.Call, n, d)
}

// check returns nil for CUDA_SUCCESS and an Error naming call otherwise.
func check(call string, r C.CUresult) error {
	if r == C.CUDA_SUCCESS {
		return nil
	}
	return Error{call, int(r)}
}

// blasError is a failed cuBLAS call (status -1: the context could not be made current).
func blasError(call string, st C.int) error {
	if st == 0 {
		return nil
	}
	if st < 0 {
		return fmt.Errorf("%s: cuCtxSetCurrent failed", call)
	}
	return fmt.Errorf("%s: %s: %s", call, C.GoString(C.df_blas_status_name(st)),
		C.GoString(C.df_blas_status_string(st)))
}

// Ptr is a device address (CUdeviceptr).
type Ptr uint64

// Device is one GPU: its primary context, one stream that orders all work queued through
// this Device, the loaded kernels and a cuBLAS handle bound to the stream. Its methods may be
// called from any goroutine.
type Device struct {
	Ordinal   int    // CUDA device number
	Name      string // e.g. "NVIDIA H100 80GB HBM3"
	Major     int    // compute capability
	Minor     int
	SMs       int // multiprocessors
	SmemOptin int // bytes of shared memory a block may use after opting in
	// BLASWorkspace is the bytes of the cuBLAS workspace Open set (BLASWorkspaceBytes), 0 when
	// the cuBLAS loaded has no cublasSetWorkspace and uses its own.
	BLASWorkspace int

	ctx    C.CUcontext
	dev    C.CUdevice
	stream C.CUstream
	blas   C.cublasHandle_t
	blasWS *Mem // the cuBLAS workspace: held as long as the handle
	mods   []C.CUmodule
	funcs  map[string]C.CUfunction
	closed atomic.Bool
}

// attr reads one device attribute.
func attr(d C.CUdevice, a C.CUdevice_attribute) (int, error) {
	var v C.int
	if err := check("cuDeviceGetAttribute", C.df_device_attr(&v, a, d)); err != nil {
		return 0, err
	}
	return int(v), nil
}

// libs is the outcome of opening the driver and cuBLAS libraries, once per process.
var libs struct {
	once sync.Once
	err  error
}

// Load opens the NVIDIA driver library (libcuda.so.1, or the file $DISTFLASH_LIBCUDA names) and
// cuBLAS (the first of libcublas.so.13, .12, .11 and libcublas.so on the loader's path, or
// $DISTFLASH_CUBLAS) and resolves the calls this package makes. Open calls it; nothing is
// loaded before, so a binary built with -tags cuda starts on a machine without either library.
// It returns the same error on every call after a failure.
func Load() error {
	libs.once.Do(func() {
		msg := (*C.char)(C.calloc(1, 1024))
		defer C.free(unsafe.Pointer(msg))
		if C.df_open_libs(msg, 1024) != 0 {
			libs.err = errors.New(C.GoString(msg))
		}
	})
	return libs.err
}

// DeviceCount returns the number of CUDA devices the driver shows this process (after
// CUDA_VISIBLE_DEVICES).
func DeviceCount() (int, error) {
	if err := Load(); err != nil {
		return 0, err
	}
	if err := check("cuInit", C.df_init()); err != nil {
		return 0, err
	}
	var count C.int
	if err := check("cuDeviceGetCount", C.df_device_count(&count)); err != nil {
		return 0, err
	}
	return int(count), nil
}

// Open initialises the driver and opens GPU ordinal with its primary context, a non-blocking
// stream, the stream-ordered memory pool (freed memory is kept for reuse) and cuBLAS.
func Open(ordinal int) (*Device, error) {
	if err := Load(); err != nil {
		return nil, err
	}
	// Several calls below (the stream, the pool, cuBLAS) rely on the context cuCtxSetCurrent
	// made current: they must run on its OS thread.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := check("cuInit", C.df_init()); err != nil {
		return nil, err
	}
	var count C.int
	if err := check("cuDeviceGetCount", C.df_device_count(&count)); err != nil {
		return nil, err
	}
	if ordinal < 0 || ordinal >= int(count) {
		return nil, fmt.Errorf("device %d: the machine has %d CUDA device(s)", ordinal, int(count))
	}
	d := &Device{Ordinal: ordinal, funcs: map[string]C.CUfunction{}}
	if err := check("cuDeviceGet", C.df_device_get(&d.dev, C.int(ordinal))); err != nil {
		return nil, err
	}
	var name [256]C.char
	if err := check("cuDeviceGetName", C.df_device_name(&name[0], C.int(len(name)), d.dev)); err != nil {
		return nil, err
	}
	d.Name = C.GoString(&name[0])
	var pools int
	attrs := []struct {
		dst *int
		a   C.CUdevice_attribute
	}{
		{&d.Major, C.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR},
		{&d.Minor, C.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR},
		{&d.SMs, C.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT},
		{&d.SmemOptin, C.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN},
		{&pools, C.CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED},
	}
	for _, a := range attrs {
		var err error
		if *a.dst, err = attr(d.dev, a.a); err != nil {
			return nil, err
		}
	}
	if pools == 0 {
		return nil, fmt.Errorf("device %d (%s): no stream-ordered memory pools (CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED = 0)", ordinal, d.Name)
	}
	if err := check("cuDevicePrimaryCtxRetain", C.df_ctx_retain(&d.ctx, d.dev)); err != nil {
		return nil, err
	}
	fail := func(err error) (*Device, error) {
		d.Close()
		return nil, err
	}
	if err := check("cuCtxSetCurrent", C.df_ctx_current(d.ctx)); err != nil {
		return fail(err)
	}
	if err := check("cuStreamCreate", C.df_stream_create(&d.stream)); err != nil {
		return fail(err)
	}
	if err := check("cuMemPoolSetAttribute", C.df_pool(d.dev)); err != nil {
		return fail(err)
	}
	if err := blasError("cublasCreate", C.df_blas_create(d.ctx, d.stream, &d.blas)); err != nil {
		d.blas = nil
		return fail(err)
	}
	ws, err := d.Alloc(BLASWorkspaceBytes(d.Major))
	if err != nil {
		return fail(fmt.Errorf("cuBLAS workspace: %w", err))
	}
	// -2: a cuBLAS 11 without cublasSetWorkspace, which keeps its own
	if st := C.df_blas_workspace(d.ctx, d.blas, C.CUdeviceptr(ws.Ptr), C.size_t(ws.Bytes)); st != -2 {
		if err := blasError("cublasSetWorkspace", st); err != nil {
			return fail(err)
		}
		d.blasWS, d.BLASWorkspace = ws, ws.Bytes
	}
	return d, nil
}

// BLASWorkspaceBytes is the cuBLAS workspace Open gives a GPU of compute capability major.x:
// NVIDIA's recommendation (cuBLAS documentation, cublasSetWorkspace), 32 MiB on Hopper and
// later, 4 MiB before. cuBLAS's heuristics may pick split-K and stream-K kernels only when the
// workspace holds their partial products.
func BLASWorkspaceBytes(major int) int {
	if major >= 9 {
		return 32 << 20
	}
	return 4 << 20
}

// LoadModule loads one PTX image (file names it in errors) and looks up the named kernels,
// letting each use all the shared memory the device allows a block.
func (d *Device) LoadModule(file string, ptx []byte, kernels []string) error {
	img := C.CBytes(append(ptx[:len(ptx):len(ptx)], 0)) // the driver reads PTX as a C string
	defer C.free(img)
	const logSize = 8192
	logBuf := (*C.char)(C.calloc(1, logSize))
	defer C.free(unsafe.Pointer(logBuf))
	var m C.CUmodule
	if err := check("cuModuleLoadDataEx", C.df_load(d.ctx, &m, img, logBuf, logSize)); err != nil {
		return fmt.Errorf("load %s: %w: %s", file, err, C.GoString(logBuf))
	}
	d.mods = append(d.mods, m)
	for _, k := range kernels {
		cs := C.CString(k)
		var f C.CUfunction
		err := check("cuModuleGetFunction", C.df_func(d.ctx, m, &f, cs, C.int(d.SmemOptin)))
		C.free(unsafe.Pointer(cs))
		if err != nil {
			return fmt.Errorf("%s: kernel %s: %w", file, k, err)
		}
		d.funcs[k] = f
	}
	return nil
}

// Close releases the cuBLAS handle, modules, stream and the context reference. Memory still
// allocated becomes invalid.
func (d *Device) Close() error {
	if d.closed.Swap(true) {
		return nil
	}
	// The unloads and the stream's destruction use the context current on this OS thread,
	// which df_blas_destroy makes the device's: stay on it.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var first error
	keep := func(err error) {
		if first == nil {
			first = err
		}
	}
	if d.blas != nil {
		keep(blasError("cublasDestroy", C.df_blas_destroy(d.ctx, d.blas)))
	}
	for _, m := range d.mods {
		keep(check("cuModuleUnload", C.df_module_unload(m)))
	}
	if d.stream != nil {
		keep(check("cuStreamDestroy", C.df_stream_destroy(d.stream)))
	}
	if d.ctx != nil {
		keep(check("cuDevicePrimaryCtxRelease", C.df_ctx_release(d.dev)))
	}
	return first
}

// Mem is one device allocation. A runtime cleanup returns it to the stream-ordered pool once it
// is unreachable, queued after all work queued so far, so no kernel still using it is affected.
type Mem struct {
	Ptr   Ptr // 0 for an empty allocation
	Bytes int
}

type freeArg struct {
	d   *Device
	ptr Ptr
}

func freeMem(a freeArg) {
	if a.d.closed.Load() {
		return
	}
	C.df_free(a.d.ctx, a.d.stream, C.CUdeviceptr(a.ptr)) // an error here has nowhere to go
}

// Event is a timing event of a Device (NewEvent): a point of its stream's work, recorded by
// RecordEvent. A runtime cleanup destroys it once it is unreachable. ID numbers the events of
// a recording fake device in tests (0 for a real one).
type Event struct {
	ID int
	ev C.CUevent
}

type eventArg struct {
	d  *Device
	ev C.CUevent
}

func destroyEvent(a eventArg) {
	if a.d.closed.Load() {
		return
	}
	C.df_event_destroy(a.d.ctx, a.ev) // an error here has nowhere to go
}

// NewEvent makes a timing event.
func (d *Device) NewEvent() (*Event, error) {
	e := &Event{}
	if err := check("cuEventCreate", C.df_event_create(d.ctx, &e.ev)); err != nil {
		return nil, err
	}
	runtime.AddCleanup(e, destroyEvent, eventArg{d, e.ev})
	return e, nil
}

// RecordEvent records e on the stream: it is reached when the work queued before it is done.
// The host does not wait.
func (d *Device) RecordEvent(e *Event) error {
	return check("cuEventRecord", C.df_event_record(d.ctx, d.stream, e.ev))
}

// EventSeconds waits until to is reached and returns the seconds from from to to (both
// recorded; the driver's resolution is about half a microsecond).
func (d *Device) EventSeconds(from, to *Event) (float64, error) {
	var ms C.float
	if err := check("cuEventElapsedTime", C.df_event_elapsed(d.ctx, from.ev, to.ev, &ms)); err != nil {
		return 0, err
	}
	runtime.KeepAlive(from)
	runtime.KeepAlive(to)
	return float64(ms) / 1e3, nil
}

// Alloc returns zeroed device memory of the given size (a multiple of 4 bytes).
func (d *Device) Alloc(bytes int) (*Mem, error) {
	m := &Mem{Bytes: bytes}
	if bytes == 0 {
		return m, nil
	}
	var p C.CUdeviceptr
	if err := check("cuMemAllocAsync", C.df_alloc(d.ctx, d.stream, &p, C.size_t(bytes))); err != nil {
		return nil, fmt.Errorf("allocating %d bytes on device %d (%s): %w", bytes, d.Ordinal, d.Name, err)
	}
	m.Ptr = Ptr(p)
	runtime.AddCleanup(m, freeMem, freeArg{d, m.Ptr})
	return m, nil
}

// HtoD queues a copy of bytes from host memory at src (Go memory holding no Go pointers) to
// dst. src may be reused when HtoD returns: the driver stages pageable memory before returning.
func (d *Device) HtoD(dst Ptr, src unsafe.Pointer, bytes int) error {
	if bytes == 0 {
		return nil
	}
	return check("cuMemcpyHtoDAsync", C.df_htod(d.ctx, d.stream, C.CUdeviceptr(dst), src, C.size_t(bytes)))
}

// DtoH copies bytes from src to host memory at dst after all queued work and waits for it. The
// error of an earlier asynchronous kernel surfaces here.
func (d *Device) DtoH(dst unsafe.Pointer, src Ptr, bytes int) error {
	if bytes == 0 {
		return d.Sync()
	}
	return check("cuMemcpyDtoHAsync", C.df_dtoh(d.ctx, d.stream, dst, C.CUdeviceptr(src), C.size_t(bytes)))
}

// DtoD queues a device-to-device copy.
func (d *Device) DtoD(dst, src Ptr, bytes int) error {
	if bytes == 0 {
		return nil
	}
	return check("cuMemcpyDtoDAsync", C.df_dtod(d.ctx, d.stream, C.CUdeviceptr(dst), C.CUdeviceptr(src), C.size_t(bytes)))
}

// Memset32 queues setting n 32-bit words at dst to the bit pattern v.
func (d *Device) Memset32(dst Ptr, v uint32, n int) error {
	if n == 0 {
		return nil
	}
	return check("cuMemsetD32Async", C.df_memset32(d.ctx, d.stream, C.CUdeviceptr(dst), C.uint(v), C.size_t(n)))
}

// Sync waits for all work queued on the stream.
func (d *Device) Sync() error { return check("cuStreamSynchronize", C.df_sync(d.ctx, d.stream)) }

// Launch queues kernel name (loaded by LoadModule) on a gx×gy grid of bx-thread blocks with smem
// bytes of dynamic shared memory. args holds the kernel's parameters one per 64-bit slot: a
// pointer, long long or double fills its slot, an int or float the low half (little-endian).
func (d *Device) Launch(name string, gx, gy, bx, smem int, args []uint64) error {
	f, ok := d.funcs[name]
	if !ok {
		return fmt.Errorf("no kernel %s loaded", name)
	}
	if gx == 0 || gy == 0 {
		return nil
	}
	var p *C.ulonglong
	if len(args) > 0 {
		p = (*C.ulonglong)(unsafe.Pointer(&args[0]))
	}
	return check("cuLaunchKernel "+name, C.df_launch(d.ctx, d.stream, f, C.uint(gx), C.uint(gy), C.uint(bx),
		C.uint(smem), p, C.int(len(args))))
}

// Compute is the arithmetic of a GEMM.
type Compute int

const (
	ComputeFP32 Compute = iota // CUBLAS_COMPUTE_32F: exact float32 on float32 operands (no TF32); tensor cores on 16-bit ones
	ComputeBF16                // operands rounded to bfloat16, float32 accumulation (tensor cores)
	ComputeFP16                // operands rounded to binary16, float32 accumulation (tensor cores)
)

// Gemm is one column-major GEMM: C (M×N, leading dimension LDC) = op(A)·op(B), op(A) M×K.
// Leading dimensions count elements of the matrix's type.
//
// The element types say what cublasGemmEx reads and writes: Float32 (the zero value: every
// matrix float32, as MatMul keeps them), or A and B both BFloat16 or both Half (the 16-bit
// operands of MatMulHalf, read as they are) with C Float32 (a weight gradient, the residual
// stream: beta 1 adds in float32) or of A's type (rounded once from the float32 sum).
//
// Why cublasGemmEx and not cuBLASLt (decided for issue 41, to be revisited on the GEMM table's
// numbers):
//   - the combinations: cublasGemmEx takes all of the above with CUBLAS_COMPUTE_32F, 16-bit A
//     and B into a float32 C included, which is the one cuBLASLt was thought needed for;
//   - heuristics: libcublas serves its GEMMs with cuBLASLt's kernels (it links libcublasLt),
//     taking the heuristic's first choice for the shape, with the workspace Open sets (split-K
//     and stream-K kernels need it); cuBLASLt would add the other candidates, which pay only
//     with per-shape autotuning on the device and a cache of the choices;
//   - epilogues: this model has none to fuse: LLaMA has no bias, SwiGLU is no cuBLASLt
//     epilogue (GELU and ReLU are), and the residual add is beta 1 in the GEMM already;
//   - cost: about a dozen more entry points (descriptors, layouts, preferences, attributes) to
//     bind, check against the headers and stub.
//
// The GEMM table (kernels/cuda_bench_test.go beside bench/torch_gemm.py, whose bf16
// torch.matmul takes cuBLAS's default choice too) says whether a shape falls short of what
// the hardware gives; that, or an epilogue worth fusing, is when a cuBLASLt path pays.
type Gemm struct {
	TransA, TransB      bool
	M, N, K             int
	LDA, LDB, LDC       int
	AType, BType, CType DataType
}

// Check reports a combination of types and compute type that Gemm does not make: 16-bit A and
// B need ComputeFP32 (tensor cores; the FAST modes are for float32 operands) and C float32 or
// of their type; float32 A and B a float32 C.
func (g Gemm) Check(compute Compute) error {
	switch {
	case g.AType != g.BType:
		return fmt.Errorf("GEMM of %s A and %s B", g.AType, g.BType)
	case g.AType != Float32 && g.AType != BFloat16 && g.AType != Half:
		return fmt.Errorf("GEMM of %s operands", g.AType)
	case g.CType != Float32 && g.CType != g.AType:
		return fmt.Errorf("GEMM of %s operands into a %s C", g.AType, g.CType)
	case g.AType != Float32 && compute != ComputeFP32:
		return fmt.Errorf("GEMM of %s operands with compute mode %d: 16-bit operands take CUBLAS_COMPUTE_32F", g.AType, compute)
	case compute < ComputeFP32 || compute > ComputeFP16:
		return fmt.Errorf("GEMM compute mode %d", compute)
	}
	return nil
}

// blasType is the cudaDataType of a GEMM element type (Check has accepted it).
func blasType(t DataType) C.int {
	switch t {
	case BFloat16:
		return C.CUDA_R_16BF
	case Half:
		return C.CUDA_R_16F
	}
	return C.CUDA_R_32F
}

// Gemm queues C = alpha·op(A)·op(B) + beta·C through cublasGemmEx, with the matrices' types
// g.AType, g.BType, g.CType and float32 alpha and beta.
func (d *Device) Gemm(g Gemm, a, b, c Ptr, alpha, beta float32, compute Compute) error {
	if err := g.Check(compute); err != nil {
		return err
	}
	st := C.df_gemm(d.ctx, d.blas, cbool(g.TransA), cbool(g.TransB), C.int(g.M), C.int(g.N), C.int(g.K),
		C.float(alpha), C.CUdeviceptr(a), blasType(g.AType), C.int(g.LDA), C.CUdeviceptr(b), blasType(g.BType),
		C.int(g.LDB), C.float(beta), C.CUdeviceptr(c), blasType(g.CType), C.int(g.LDC), C.int(compute))
	return blasError("cublasGemmEx", st)
}

func cbool(b bool) C.int {
	if b {
		return 1
	}
	return 0
}
