// gpustub: a stand-in for the NVIDIA driver (libcuda.so.1), cuBLAS and NCCL (libnccl.so.2) in one
// shared library, so that the CUDA backend's cgo glue (kernels/cuda/driver.go and nccl.go) and
// parallel's NCCL communicator run on a machine without a GPU. TestCUDAHostNCCLStub
// (parallel/nccl_stub_cuda_test.go) builds it and points DISTFLASH_LIBCUDA, DISTFLASH_CUBLAS and
// DISTFLASH_LIBNCCL at it (all three at the same file: the three libraries share its state).
//
//	gcc -shared -fPIC -I kernels/cuda -o libgpustub.so parallel/transport/testdata/gpustub/gpustub.c
//
// It exports every entry point of the X-macro lists in kernels/cuda/cuda_abi_funcs.h and
// nccl_abi_funcs.h under its exported symbol (cuMemcpyHtoDAsync_v2, ...) with the signature
// declared there, so a signature that drifts from the Go side's fails to compile. Define
// GPUSTUB_NO_SPLIT to leave out ncclCommSplit, as in NCCL before 2.18.
//
// What it does:
//   - one device of compute capability 9.0, 132 SMs, 227 KiB of opt-in shared memory per block,
//     with memory pools; its primary context, streams, events, modules, functions, cuBLAS
//     handles and communicators are small records that are never freed, so a stale or foreign
//     handle is caught (CUDA_ERROR_INVALID_HANDLE, ncclInvalidArgument) rather than crashing;
//   - device memory is host memory (cuMemAllocAsync is malloc), and copies and memsets really
//     move data, at once (every stream is synchronous); every device range a call touches must
//     lie in a live allocation (else CUDA_ERROR_INVALID_VALUE or ncclInvalidArgument);
//   - modules load and any function is found; kernel launches and GEMMs only log;
//   - NCCL on one rank: ncclGetVersion (22304, or $GPUSTUB_NCCL_VERSION), unique ids that
//     ncclCommInitRank checks byte for byte (nranks must be 1), ncclCommSplit, groups kept per
//     thread as NCCL keeps them, ncclSend/ncclRecv to self paired in order at the outermost
//     ncclGroupEnd (a lone one, or one outside a group, would hang NCCL: ncclInvalidUsage),
//     collectives that copy src to dst, ncclCommGetAsyncError ($GPUSTUB_ASYNC_ERROR, else 0).
//
// Every call appends one line to the file $GPUSTUB_LOG (nothing without it): the entry point's
// name (the X-macro name, without _v2), then key=value pairs: the arguments that matter
// (handles by name: context c1, streams s1 s2 ..., events e1 ..., modules m1 ..., cuBLAS
// handles h1 ..., communicators n1 ..., null for NULL), cur= the context current on the calling
// thread (- for none), and result= when the call fails.

#define _GNU_SOURCE
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <unistd.h>

#include "nccl_abi.h"

// Every exported function is declared from the repository's lists, with its exported symbol as
// the assembler name: the definitions below must match these declarations.
#define GS_DECLARE(name, sym, ret, params) ret name params __asm__(sym) __attribute__((visibility("default")));
DF_CU_FUNCS(GS_DECLARE)
DF_BLAS_FUNCS(GS_DECLARE)
DF_BLAS_OPTIONAL_FUNCS(GS_DECLARE)
DF_NCCL_FUNCS(GS_DECLARE)
#ifndef GPUSTUB_NO_SPLIT
DF_NCCL_OPTIONAL_FUNCS(GS_DECLARE)
#endif

// gs_exports refers to every entry point, so that linking with -Wl,--no-undefined fails for
// one left undefined.
#define GS_ADDRESS(name, sym, ret, params) (void*)name,
__attribute__((used)) static void* gs_exports[] = {
	DF_CU_FUNCS(GS_ADDRESS) DF_BLAS_FUNCS(GS_ADDRESS) DF_BLAS_OPTIONAL_FUNCS(GS_ADDRESS) DF_NCCL_FUNCS(GS_ADDRESS)
#ifndef GPUSTUB_NO_SPLIT
	DF_NCCL_OPTIONAL_FUNCS(GS_ADDRESS)
#endif
};

#define GS_CUDA_ERROR_NOT_INITIALIZED 3
#define GS_CUDA_ERROR_INVALID_CONTEXT 201
#define GS_CUDA_ERROR_INVALID_HANDLE 400
#define GS_CUBLAS_STATUS_NOT_INITIALIZED 1
#define GS_CUBLAS_STATUS_INVALID_VALUE 7
#define GS_ncclInvalidArgument 4
#define GS_ncclInvalidUsage 5

#define GS_SMS 132
#define GS_SMEM_OPTIN 232448
#define GS_NCCL_VERSION 22304

static pthread_mutex_t gs_mu = PTHREAD_MUTEX_INITIALIZER;  // guards everything but the per-thread state
static int gs_log_fd = -2;                                // -2: not opened yet, -1: no log
static int gs_initialized;

// ---- handles: records with a kind, a number (their name in the log) and a live flag ----

enum { GS_CTX, GS_STREAM, GS_EVENT, GS_MODULE, GS_FUNC, GS_POOL, GS_BLAS, GS_COMM, GS_KINDS };
static const char gs_prefix[GS_KINDS] = {'c', 's', 'e', 'm', 'f', 'p', 'h', 'n'};
static int gs_count[GS_KINDS];

typedef struct {
	int kind, id, live;
	char name[64];  // a function's name
} gs_handle;

struct CUctx_st { gs_handle h; int refs; };
struct CUstream_st { gs_handle h; };
struct CUevent_st { gs_handle h; };
struct CUmod_st { gs_handle h; };
struct CUfunc_st { gs_handle h; };
struct CUmemPoolHandle_st { gs_handle h; };
struct cublasContext { gs_handle h; struct CUstream_st* stream; };
struct ncclComm { gs_handle h; int nranks, rank; };

// gs_handles lists every handle made, so that a pointer can be checked before it is read.
static gs_handle** gs_handles;
static int gs_nhandles, gs_caphandles;

static void* gs_new(size_t size, int kind) {
	gs_handle* h = calloc(1, size);
	h->kind = kind;
	h->id = ++gs_count[kind];
	h->live = 1;
	if (gs_nhandles == gs_caphandles) {
		gs_caphandles = gs_caphandles ? 2 * gs_caphandles : 64;
		gs_handles = realloc(gs_handles, gs_caphandles * sizeof *gs_handles);
	}
	gs_handles[gs_nhandles++] = h;
	return h;
}

// gs_valid reports whether p is a live handle of the kind.
static int gs_valid(const void* p, int kind) {
	for (int i = 0; i < gs_nhandles; i++)
		if (gs_handles[i] == p) return gs_handles[i]->kind == kind && gs_handles[i]->live;
	return 0;
}

// gs_name writes a handle's name (c1, s2, ...) into one of a few rotating buffers.
static const char* gs_name(const void* p) {
	static __thread char bufs[8][32];
	static __thread int next;
	char* b = bufs[next++ % 8];
	if (p == NULL) return "null";
	for (int i = 0; i < gs_nhandles; i++)
		if (gs_handles[i] == p) {
			snprintf(b, 32, "%c%d", gs_prefix[gs_handles[i]->kind], gs_handles[i]->id);
			return b;
		}
	snprintf(b, 32, "foreign");
	return b;
}

static struct CUctx_st* gs_ctx;    // the device's primary context, made at the first retain
static struct CUmemPoolHandle_st* gs_pool;
static __thread struct CUctx_st* gs_cur;  // the context current on this thread

// ---- device memory: host memory, with the live allocations listed ----

typedef struct {
	uintptr_t base;
	size_t bytes;
	int live;
} gs_alloc;
static gs_alloc* gs_allocs;
static int gs_nallocs, gs_capallocs;

// gs_in_device reports whether [p, p+bytes) lies inside one live allocation.
static int gs_in_device(uintptr_t p, size_t bytes) {
	if (bytes == 0) return 1;
	for (int i = 0; i < gs_nallocs; i++) {
		gs_alloc* a = &gs_allocs[i];
		if (a->live && p >= a->base && p - a->base <= a->bytes && bytes <= a->bytes - (p - a->base)) return 1;
	}
	return 0;
}

// ---- the log ----

// gs_log appends "name args cur=CTX[ result=R]" to $GPUSTUB_LOG with one write (the caller holds
// gs_mu).
static void gs_log(const char* name, int result, const char* fmt, ...) {
	if (gs_log_fd == -2) {
		const char* path = getenv("GPUSTUB_LOG");
		gs_log_fd = path != NULL && path[0] != 0 ? open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644) : -1;
	}
	if (gs_log_fd < 0) return;
	char line[1024];
	int n = snprintf(line, sizeof line, "%s", name);
	if (fmt != NULL && fmt[0] != 0) {
		line[n++] = ' ';
		va_list ap;
		va_start(ap, fmt);
		n += vsnprintf(line + n, sizeof line - n, fmt, ap);
		va_end(ap);
	}
	if (n < (int)sizeof line) n += snprintf(line + n, sizeof line - n, " cur=%s", gs_cur ? gs_name(gs_cur) : "-");
	if (result != 0 && n < (int)sizeof line) n += snprintf(line + n, sizeof line - n, " result=%d", result);
	if (n > (int)sizeof line - 2) n = sizeof line - 2;
	line[n++] = '\n';
	if (write(gs_log_fd, line, n) != n) {
		// a short write leaves a line out; the test that reads the log then fails
	}
}

#define LOCK pthread_mutex_lock(&gs_mu)
#define UNLOCK pthread_mutex_unlock(&gs_mu)
// RET logs the call and returns its result (r), releasing the lock.
#define RET(r, name, ...)             \
	do {                              \
		int r_ = (r);                 \
		gs_log(name, r_, __VA_ARGS__); \
		UNLOCK;                       \
		return r_;                    \
	} while (0)

// ---- CUDA driver ----

CUresult cuInit(unsigned int flags) {
	LOCK;
	gs_initialized = 1;
	RET(CUDA_SUCCESS, "cuInit", "flags=%u", flags);
}

CUresult cuDeviceGetCount(int* count) {
	LOCK;
	if (!gs_initialized) RET(GS_CUDA_ERROR_NOT_INITIALIZED, "cuDeviceGetCount", "");
	*count = 1;
	RET(CUDA_SUCCESS, "cuDeviceGetCount", "count=1");
}

CUresult cuDeviceGet(CUdevice* device, int ordinal) {
	LOCK;
	if (!gs_initialized) RET(GS_CUDA_ERROR_NOT_INITIALIZED, "cuDeviceGet", "ordinal=%d", ordinal);
	if (ordinal != 0) RET(CUDA_ERROR_INVALID_VALUE, "cuDeviceGet", "ordinal=%d", ordinal);
	*device = 0;
	RET(CUDA_SUCCESS, "cuDeviceGet", "ordinal=%d device=0", ordinal);
}

CUresult cuDeviceGetName(char* name, int len, CUdevice dev) {
	LOCK;
	if (dev != 0 || len <= 0) RET(CUDA_ERROR_INVALID_VALUE, "cuDeviceGetName", "device=%d", dev);
	snprintf(name, len, "GPUSTUB H100");
	RET(CUDA_SUCCESS, "cuDeviceGetName", "device=%d", dev);
}

CUresult cuDeviceGetAttribute(int* pi, CUdevice_attribute attrib, CUdevice dev) {
	LOCK;
	int v;
	switch (attrib) {
	case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: v = 9; break;
	case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: v = 0; break;
	case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: v = GS_SMS; break;
	case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: v = GS_SMEM_OPTIN; break;
	case CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED: v = 1; break;
	default: RET(CUDA_ERROR_INVALID_VALUE, "cuDeviceGetAttribute", "attr=%d device=%d", attrib, dev);
	}
	if (dev != 0) RET(CUDA_ERROR_INVALID_VALUE, "cuDeviceGetAttribute", "attr=%d device=%d", attrib, dev);
	*pi = v;
	RET(CUDA_SUCCESS, "cuDeviceGetAttribute", "attr=%d device=%d value=%d", attrib, dev, v);
}

CUresult cuDevicePrimaryCtxRetain(CUcontext* pctx, CUdevice dev) {
	LOCK;
	if (!gs_initialized) RET(GS_CUDA_ERROR_NOT_INITIALIZED, "cuDevicePrimaryCtxRetain", "device=%d", dev);
	if (dev != 0) RET(CUDA_ERROR_INVALID_VALUE, "cuDevicePrimaryCtxRetain", "device=%d", dev);
	if (gs_ctx == NULL) gs_ctx = gs_new(sizeof *gs_ctx, GS_CTX);
	gs_ctx->refs++;
	*pctx = gs_ctx;
	RET(CUDA_SUCCESS, "cuDevicePrimaryCtxRetain", "device=%d ctx=%s refs=%d", dev, gs_name(gs_ctx), gs_ctx->refs);
}

CUresult cuDevicePrimaryCtxRelease(CUdevice dev) {
	LOCK;
	if (dev != 0 || gs_ctx == NULL || gs_ctx->refs == 0)
		RET(CUDA_ERROR_INVALID_VALUE, "cuDevicePrimaryCtxRelease", "device=%d", dev);
	gs_ctx->refs--;
	RET(CUDA_SUCCESS, "cuDevicePrimaryCtxRelease", "device=%d refs=%d", dev, gs_ctx->refs);
}

CUresult cuCtxSetCurrent(CUcontext ctx) {
	LOCK;
	if (ctx != NULL && !gs_valid(ctx, GS_CTX)) RET(GS_CUDA_ERROR_INVALID_CONTEXT, "cuCtxSetCurrent", "ctx=%s", gs_name(ctx));
	gs_cur = ctx;
	RET(CUDA_SUCCESS, "cuCtxSetCurrent", "ctx=%s", gs_name(ctx));
}

CUresult cuStreamCreate(CUstream* phStream, unsigned int flags) {
	LOCK;
	struct CUstream_st* s = gs_new(sizeof *s, GS_STREAM);
	*phStream = s;
	RET(CUDA_SUCCESS, "cuStreamCreate", "stream=%s flags=%u", gs_name(s), flags);
}

CUresult cuStreamDestroy(CUstream hStream) {
	LOCK;
	if (!gs_valid(hStream, GS_STREAM)) RET(GS_CUDA_ERROR_INVALID_HANDLE, "cuStreamDestroy", "stream=%s", gs_name(hStream));
	hStream->h.live = 0;
	RET(CUDA_SUCCESS, "cuStreamDestroy", "stream=%s", gs_name(hStream));
}

CUresult cuStreamSynchronize(CUstream hStream) {
	LOCK;
	int r = gs_valid(hStream, GS_STREAM) ? CUDA_SUCCESS : GS_CUDA_ERROR_INVALID_HANDLE;
	RET(r, "cuStreamSynchronize", "stream=%s", gs_name(hStream));
}

CUresult cuStreamQuery(CUstream hStream) {
	LOCK;
	int r = gs_valid(hStream, GS_STREAM) ? CUDA_SUCCESS : GS_CUDA_ERROR_INVALID_HANDLE;
	RET(r, "cuStreamQuery", "stream=%s", gs_name(hStream));
}

CUresult cuMemAllocAsync(CUdeviceptr* dptr, size_t bytesize, CUstream hStream) {
	LOCK;
	if (!gs_valid(hStream, GS_STREAM))
		RET(GS_CUDA_ERROR_INVALID_HANDLE, "cuMemAllocAsync", "bytes=%zu stream=%s", bytesize, gs_name(hStream));
	void* p = malloc(bytesize ? bytesize : 1);
	if (gs_nallocs == gs_capallocs) {
		gs_capallocs = gs_capallocs ? 2 * gs_capallocs : 256;
		gs_allocs = realloc(gs_allocs, gs_capallocs * sizeof *gs_allocs);
	}
	gs_allocs[gs_nallocs++] = (gs_alloc){(uintptr_t)p, bytesize, 1};
	*dptr = (CUdeviceptr)(uintptr_t)p;
	RET(CUDA_SUCCESS, "cuMemAllocAsync", "bytes=%zu stream=%s", bytesize, gs_name(hStream));
}

CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream) {
	LOCK;
	if (!gs_valid(hStream, GS_STREAM)) RET(GS_CUDA_ERROR_INVALID_HANDLE, "cuMemFreeAsync", "stream=%s", gs_name(hStream));
	for (int i = gs_nallocs - 1; i >= 0; i--)
		if (gs_allocs[i].live && gs_allocs[i].base == (uintptr_t)dptr) {
			gs_allocs[i].live = 0;
			free((void*)(uintptr_t)dptr);
			RET(CUDA_SUCCESS, "cuMemFreeAsync", "bytes=%zu stream=%s", gs_allocs[i].bytes, gs_name(hStream));
		}
	RET(CUDA_ERROR_INVALID_VALUE, "cuMemFreeAsync", "stream=%s", gs_name(hStream));
}

CUresult cuMemsetD32Async(CUdeviceptr dstDevice, unsigned int ui, size_t n, CUstream hStream) {
	LOCK;
	int r = CUDA_SUCCESS;
	if (!gs_valid(hStream, GS_STREAM)) r = GS_CUDA_ERROR_INVALID_HANDLE;
	else if (!gs_in_device(dstDevice, 4 * n)) r = CUDA_ERROR_INVALID_VALUE;
	else
		for (size_t i = 0; i < n; i++) memcpy((char*)(uintptr_t)dstDevice + 4 * i, &ui, 4);
	RET(r, "cuMemsetD32Async", "value=%u n=%zu stream=%s", ui, n, gs_name(hStream));
}

CUresult cuMemcpyHtoDAsync(CUdeviceptr dstDevice, const void* srcHost, size_t byteCount, CUstream hStream) {
	LOCK;
	int r = CUDA_SUCCESS;
	if (!gs_valid(hStream, GS_STREAM)) r = GS_CUDA_ERROR_INVALID_HANDLE;
	else if (!gs_in_device(dstDevice, byteCount)) r = CUDA_ERROR_INVALID_VALUE;
	else memcpy((void*)(uintptr_t)dstDevice, srcHost, byteCount);
	RET(r, "cuMemcpyHtoDAsync", "bytes=%zu stream=%s", byteCount, gs_name(hStream));
}

CUresult cuMemcpyDtoHAsync(void* dstHost, CUdeviceptr srcDevice, size_t byteCount, CUstream hStream) {
	LOCK;
	int r = CUDA_SUCCESS;
	if (!gs_valid(hStream, GS_STREAM)) r = GS_CUDA_ERROR_INVALID_HANDLE;
	else if (!gs_in_device(srcDevice, byteCount)) r = CUDA_ERROR_INVALID_VALUE;
	else memcpy(dstHost, (const void*)(uintptr_t)srcDevice, byteCount);
	RET(r, "cuMemcpyDtoHAsync", "bytes=%zu stream=%s", byteCount, gs_name(hStream));
}

CUresult cuMemcpyDtoDAsync(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t byteCount, CUstream hStream) {
	LOCK;
	int r = CUDA_SUCCESS;
	if (!gs_valid(hStream, GS_STREAM)) r = GS_CUDA_ERROR_INVALID_HANDLE;
	else if (!gs_in_device(dstDevice, byteCount) || !gs_in_device(srcDevice, byteCount)) r = CUDA_ERROR_INVALID_VALUE;
	else memmove((void*)(uintptr_t)dstDevice, (const void*)(uintptr_t)srcDevice, byteCount);
	RET(r, "cuMemcpyDtoDAsync", "bytes=%zu stream=%s", byteCount, gs_name(hStream));
}

CUresult cuModuleLoadDataEx(CUmodule* module, const void* image, unsigned int numOptions, CUjit_option* options,
                            void** values) {
	LOCK;
	for (unsigned i = 0; i < numOptions; i++)
		if (options[i] == CU_JIT_ERROR_LOG_BUFFER && values[i] != NULL) ((char*)values[i])[0] = 0;
	// the PTX's target, e.g. sm_90, from its ".target sm_90" directive
	char target[16] = "none";
	const char* t = strstr((const char*)image, ".target ");
	if (t != NULL) sscanf(t + 8, "%15[a-z_0-9]", target);
	struct CUmod_st* m = gs_new(sizeof *m, GS_MODULE);
	*module = m;
	RET(CUDA_SUCCESS, "cuModuleLoadDataEx", "module=%s target=%s bytes=%zu options=%u", gs_name(m), target,
	    strlen((const char*)image), numOptions);
}

CUresult cuModuleUnload(CUmodule hmod) {
	LOCK;
	if (!gs_valid(hmod, GS_MODULE)) RET(GS_CUDA_ERROR_INVALID_HANDLE, "cuModuleUnload", "module=%s", gs_name(hmod));
	hmod->h.live = 0;
	RET(CUDA_SUCCESS, "cuModuleUnload", "module=%s", gs_name(hmod));
}

CUresult cuModuleGetFunction(CUfunction* hfunc, CUmodule hmod, const char* name) {
	LOCK;
	if (!gs_valid(hmod, GS_MODULE))
		RET(GS_CUDA_ERROR_INVALID_HANDLE, "cuModuleGetFunction", "module=%s name=%s", gs_name(hmod), name);
	struct CUfunc_st* f = gs_new(sizeof *f, GS_FUNC);
	snprintf(f->h.name, sizeof f->h.name, "%s", name);
	*hfunc = f;
	RET(CUDA_SUCCESS, "cuModuleGetFunction", "module=%s name=%s", gs_name(hmod), name);
}

CUresult cuFuncGetAttribute(int* pi, CUfunction_attribute attrib, CUfunction hfunc) {
	LOCK;
	if (!gs_valid(hfunc, GS_FUNC)) RET(GS_CUDA_ERROR_INVALID_HANDLE, "cuFuncGetAttribute", "attr=%d", attrib);
	*pi = 0;  // no static shared memory, and 0 for anything else asked
	RET(CUDA_SUCCESS, "cuFuncGetAttribute", "func=%s attr=%d value=0", hfunc->h.name, attrib);
}

CUresult cuFuncSetAttribute(CUfunction hfunc, CUfunction_attribute attrib, int value) {
	LOCK;
	if (!gs_valid(hfunc, GS_FUNC)) RET(GS_CUDA_ERROR_INVALID_HANDLE, "cuFuncSetAttribute", "attr=%d", attrib);
	int r = attrib == CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES && (value < 0 || value > GS_SMEM_OPTIN)
	            ? CUDA_ERROR_INVALID_VALUE
	            : CUDA_SUCCESS;
	RET(r, "cuFuncSetAttribute", "func=%s attr=%d value=%d", hfunc->h.name, attrib, value);
}

CUresult cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ,
                        unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ,
                        unsigned int sharedMemBytes, CUstream hStream, void** kernelParams, void** extra) {
	LOCK;
	int r = CUDA_SUCCESS;
	if (!gs_valid(f, GS_FUNC) || !gs_valid(hStream, GS_STREAM)) r = GS_CUDA_ERROR_INVALID_HANDLE;
	else if (kernelParams == NULL || extra != NULL || sharedMemBytes > GS_SMEM_OPTIN) r = CUDA_ERROR_INVALID_VALUE;
	RET(r, "cuLaunchKernel", "func=%s grid=%u,%u,%u block=%u,%u,%u smem=%u stream=%s",
	    gs_valid(f, GS_FUNC) ? f->h.name : "invalid", gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ,
	    sharedMemBytes, gs_name(hStream));
}

CUresult cuDeviceGetDefaultMemPool(CUmemoryPool* pool, CUdevice dev) {
	LOCK;
	if (dev != 0) RET(CUDA_ERROR_INVALID_VALUE, "cuDeviceGetDefaultMemPool", "device=%d", dev);
	if (gs_pool == NULL) gs_pool = gs_new(sizeof *gs_pool, GS_POOL);
	*pool = gs_pool;
	RET(CUDA_SUCCESS, "cuDeviceGetDefaultMemPool", "device=%d pool=%s", dev, gs_name(gs_pool));
}

CUresult cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void* value) {
	LOCK;
	if (!gs_valid(pool, GS_POOL)) RET(GS_CUDA_ERROR_INVALID_HANDLE, "cuMemPoolSetAttribute", "attr=%d", attr);
	if (attr != CU_MEMPOOL_ATTR_RELEASE_THRESHOLD) RET(CUDA_ERROR_INVALID_VALUE, "cuMemPoolSetAttribute", "attr=%d", attr);
	RET(CUDA_SUCCESS, "cuMemPoolSetAttribute", "pool=%s attr=%d value=%llu", gs_name(pool), attr,
	    (unsigned long long)*(cuuint64_t*)value);
}

CUresult cuEventCreate(CUevent* phEvent, unsigned int Flags) {
	LOCK;
	struct CUevent_st* e = gs_new(sizeof *e, GS_EVENT);
	*phEvent = e;
	RET(CUDA_SUCCESS, "cuEventCreate", "event=%s flags=%u", gs_name(e), Flags);
}

CUresult cuEventRecord(CUevent hEvent, CUstream hStream) {
	LOCK;
	int r = gs_valid(hEvent, GS_EVENT) && gs_valid(hStream, GS_STREAM) ? CUDA_SUCCESS : GS_CUDA_ERROR_INVALID_HANDLE;
	RET(r, "cuEventRecord", "event=%s stream=%s", gs_name(hEvent), gs_name(hStream));
}

CUresult cuStreamWaitEvent(CUstream hStream, CUevent hEvent, unsigned int Flags) {
	LOCK;
	int r = gs_valid(hEvent, GS_EVENT) && gs_valid(hStream, GS_STREAM) ? CUDA_SUCCESS : GS_CUDA_ERROR_INVALID_HANDLE;
	RET(r, "cuStreamWaitEvent", "stream=%s event=%s flags=%u", gs_name(hStream), gs_name(hEvent), Flags);
}

CUresult cuEventDestroy(CUevent hEvent) {
	LOCK;
	if (!gs_valid(hEvent, GS_EVENT)) RET(GS_CUDA_ERROR_INVALID_HANDLE, "cuEventDestroy", "event=%s", gs_name(hEvent));
	hEvent->h.live = 0;
	RET(CUDA_SUCCESS, "cuEventDestroy", "event=%s", gs_name(hEvent));
}

static const char* gs_cu_name(CUresult e) {
	switch (e) {
	case CUDA_SUCCESS: return "CUDA_SUCCESS";
	case CUDA_ERROR_INVALID_VALUE: return "CUDA_ERROR_INVALID_VALUE";
	case GS_CUDA_ERROR_NOT_INITIALIZED: return "CUDA_ERROR_NOT_INITIALIZED";
	case GS_CUDA_ERROR_INVALID_CONTEXT: return "CUDA_ERROR_INVALID_CONTEXT";
	case GS_CUDA_ERROR_INVALID_HANDLE: return "CUDA_ERROR_INVALID_HANDLE";
	}
	return NULL;
}

CUresult cuGetErrorName(CUresult error, const char** pStr) {
	LOCK;
	*pStr = gs_cu_name(error);
	RET(*pStr ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE, "cuGetErrorName", "error=%d", error);
}

CUresult cuGetErrorString(CUresult error, const char** pStr) {
	LOCK;
	*pStr = gs_cu_name(error) ? "gpustub error" : NULL;
	RET(*pStr ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE, "cuGetErrorString", "error=%d", error);
}

// ---- cuBLAS ----

cublasStatus_t cublasCreate(cublasHandle_t* handle) {
	LOCK;
	if (gs_cur == NULL) RET(GS_CUBLAS_STATUS_NOT_INITIALIZED, "cublasCreate", "");
	struct cublasContext* h = gs_new(sizeof *h, GS_BLAS);
	*handle = h;
	RET(CUBLAS_STATUS_SUCCESS, "cublasCreate", "handle=%s", gs_name(h));
}

cublasStatus_t cublasDestroy(cublasHandle_t handle) {
	LOCK;
	if (!gs_valid(handle, GS_BLAS)) RET(GS_CUBLAS_STATUS_NOT_INITIALIZED, "cublasDestroy", "handle=%s", gs_name(handle));
	handle->h.live = 0;
	RET(CUBLAS_STATUS_SUCCESS, "cublasDestroy", "handle=%s", gs_name(handle));
}

cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t streamId) {
	LOCK;
	if (!gs_valid(handle, GS_BLAS)) RET(GS_CUBLAS_STATUS_NOT_INITIALIZED, "cublasSetStream", "handle=%s", gs_name(handle));
	if (!gs_valid(streamId, GS_STREAM))
		RET(GS_CUBLAS_STATUS_INVALID_VALUE, "cublasSetStream", "handle=%s stream=%s", gs_name(handle), gs_name(streamId));
	handle->stream = streamId;
	RET(CUBLAS_STATUS_SUCCESS, "cublasSetStream", "handle=%s stream=%s", gs_name(handle), gs_name(streamId));
}

cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode) {
	LOCK;
	if (!gs_valid(handle, GS_BLAS)) RET(GS_CUBLAS_STATUS_NOT_INITIALIZED, "cublasSetMathMode", "handle=%s", gs_name(handle));
	RET(CUBLAS_STATUS_SUCCESS, "cublasSetMathMode", "handle=%s mode=%d", gs_name(handle), mode);
}

// cublasSetWorkspace: the workspace must be device memory of the size given.
cublasStatus_t cublasSetWorkspace(cublasHandle_t handle, void* workspace, size_t workspaceSizeInBytes) {
	LOCK;
	if (!gs_valid(handle, GS_BLAS)) RET(GS_CUBLAS_STATUS_NOT_INITIALIZED, "cublasSetWorkspace", "handle=%s", gs_name(handle));
	int r = gs_in_device((uintptr_t)workspace, workspaceSizeInBytes) ? CUBLAS_STATUS_SUCCESS : GS_CUBLAS_STATUS_INVALID_VALUE;
	RET(r, "cublasSetWorkspace", "handle=%s stream=%s bytes=%zu", gs_name(handle), gs_name(handle->stream), workspaceSizeInBytes);
}

cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n,
                            int k, const void* alpha, const void* A, cudaDataType Atype, int lda, const void* B,
                            cudaDataType Btype, int ldb, const void* beta, void* C, cudaDataType Ctype, int ldc,
                            cublasComputeType_t computeType, cublasGemmAlgo_t algo) {
	LOCK;
	if (!gs_valid(handle, GS_BLAS)) RET(GS_CUBLAS_STATUS_NOT_INITIALIZED, "cublasGemmEx", "handle=%s", gs_name(handle));
	// the operands must be device memory (their extents are not checked)
	int dev = gs_in_device((uintptr_t)A, 1) && gs_in_device((uintptr_t)B, 1) && gs_in_device((uintptr_t)C, 1);
	int r = dev && alpha != NULL && beta != NULL ? CUBLAS_STATUS_SUCCESS : GS_CUBLAS_STATUS_INVALID_VALUE;
	RET(r, "cublasGemmEx",
	    "handle=%s stream=%s transa=%d transb=%d m=%d n=%d k=%d lda=%d ldb=%d ldc=%d types=%d,%d,%d compute=%d "
	    "algo=%d operands=%s",
	    gs_name(handle), gs_name(handle->stream), transa, transb, m, n, k, lda, ldb, ldc, Atype, Btype, Ctype,
	    computeType, algo, dev ? "device" : "not-device");
}

static const char* gs_blas_name(cublasStatus_t s) {
	switch (s) {
	case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
	case GS_CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
	case GS_CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
	}
	return "CUBLAS_STATUS_UNKNOWN";
}

const char* cublasGetStatusName(cublasStatus_t status) {
	LOCK;
	gs_log("cublasGetStatusName", 0, "status=%d", status);
	UNLOCK;
	return gs_blas_name(status);
}

const char* cublasGetStatusString(cublasStatus_t status) {
	LOCK;
	gs_log("cublasGetStatusString", 0, "status=%d", status);
	UNLOCK;
	return status == CUBLAS_STATUS_SUCCESS ? "success" : "gpustub cuBLAS error";
}

// ---- NCCL ----

ncclResult_t ncclGetVersion(int* version) {
	LOCK;
	const char* env = getenv("GPUSTUB_NCCL_VERSION");
	*version = env != NULL && env[0] != 0 ? atoi(env) : GS_NCCL_VERSION;
	RET(ncclSuccess, "ncclGetVersion", "version=%d", *version);
}

// A unique id is "GPUSTUB", its number, then a pattern of every byte value that ncclCommInitRank
// recomputes: the id must arrive there bit for bit (parallel carries it as float32 bit patterns,
// NaNs among them: the last 8 bytes are a quiet and a signalling NaN).
static int gs_ids;

static void gs_id_bytes(int seq, char out[NCCL_UNIQUE_ID_BYTES]) {
	memset(out, 0, NCCL_UNIQUE_ID_BYTES);
	memcpy(out, "GPUSTUB", 7);
	out[7] = (char)seq;
	for (int i = 8; i < NCCL_UNIQUE_ID_BYTES - 8; i++) out[i] = (char)(i * 131 + seq * 7 + 0x80);
	static const unsigned char nans[8] = {0xff, 0xff, 0xc0, 0x7f, 0x01, 0x00, 0x80, 0x7f};
	memcpy(out + NCCL_UNIQUE_ID_BYTES - 8, nans, 8);
}

ncclResult_t ncclGetUniqueId(ncclUniqueId* uniqueId) {
	LOCK;
	gs_ids++;
	gs_id_bytes(gs_ids, uniqueId->internal);
	RET(ncclSuccess, "ncclGetUniqueId", "id=%d", gs_ids);
}

static struct ncclComm* gs_new_comm(int nranks, int rank) {
	struct ncclComm* c = gs_new(sizeof *c, GS_COMM);
	c->nranks = nranks;
	c->rank = rank;
	return c;
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank) {
	LOCK;
	int seq = (unsigned char)commId.internal[7];
	char want[NCCL_UNIQUE_ID_BYTES];
	gs_id_bytes(seq, want);
	if (seq < 1 || seq > gs_ids || memcmp(want, commId.internal, NCCL_UNIQUE_ID_BYTES) != 0)
		RET(GS_ncclInvalidArgument, "ncclCommInitRank", "nranks=%d rank=%d id=corrupt", nranks, rank);
	// the only rank this stub can be: more would wait for the others in ncclCommInitRank
	if (nranks != 1 || rank != 0) RET(GS_ncclInvalidUsage, "ncclCommInitRank", "nranks=%d rank=%d id=%d", nranks, rank, seq);
	*comm = gs_new_comm(1, 0);
	RET(ncclSuccess, "ncclCommInitRank", "nranks=%d rank=%d id=%d comm=%s", nranks, rank, seq, gs_name(*comm));
}

#ifndef GPUSTUB_NO_SPLIT
ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm, ncclConfig_t* config) {
	LOCK;
	const char* cfg = config == NULL ? "NULL" : "set";
	if (!gs_valid(comm, GS_COMM))
		RET(GS_ncclInvalidArgument, "ncclCommSplit", "comm=%s color=%d key=%d config=%s", gs_name(comm), color, key, cfg);
	*newcomm = color < 0 ? NULL : gs_new_comm(1, 0);  // NCCL_SPLIT_NOCOLOR (-1) joins none
	RET(ncclSuccess, "ncclCommSplit", "comm=%s color=%d key=%d config=%s newcomm=%s", gs_name(comm), color, key, cfg,
	    gs_name(*newcomm));
}
#endif

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
	LOCK;
	if (!gs_valid(comm, GS_COMM)) RET(GS_ncclInvalidArgument, "ncclCommDestroy", "comm=%s", gs_name(comm));
	comm->h.live = 0;
	RET(ncclSuccess, "ncclCommDestroy", "comm=%s", gs_name(comm));
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
	LOCK;
	if (!gs_valid(comm, GS_COMM)) RET(GS_ncclInvalidArgument, "ncclCommAbort", "comm=%s", gs_name(comm));
	comm->h.live = 0;
	RET(ncclSuccess, "ncclCommAbort", "comm=%s", gs_name(comm));
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError) {
	LOCK;
	if (!gs_valid(comm, GS_COMM)) RET(GS_ncclInvalidArgument, "ncclCommGetAsyncError", "comm=%s", gs_name(comm));
	const char* env = getenv("GPUSTUB_ASYNC_ERROR");
	*asyncError = env != NULL && env[0] != 0 ? atoi(env) : ncclSuccess;
	RET(ncclSuccess, "ncclCommGetAsyncError", "comm=%s error=%d", gs_name(comm), *asyncError);
}

const char* ncclGetErrorString(ncclResult_t result) {
	static const char* msgs[] = {
	    "no error", "unhandled cuda error", "unhandled system error", "internal error", "invalid argument",
	    "invalid usage", "remote process exited or there was a network error", "NCCL operation in progress",
	};
	LOCK;
	gs_log("ncclGetErrorString", 0, "code=%d", result);
	UNLOCK;
	return result >= 0 && result < (int)(sizeof msgs / sizeof msgs[0]) ? msgs[result] : "unknown result code";
}

// The open group of the calling thread (NCCL keeps it per thread): its depth and the sends
// and receives posted in it, paired at the outermost ncclGroupEnd.
typedef struct {
	int send;
	char* buf;
	size_t count;
} gs_p2p;
static __thread int gs_depth;
static __thread gs_p2p* gs_ops;
static __thread int gs_nops, gs_capops;

ncclResult_t ncclGroupStart(void) {
	LOCK;
	gs_depth++;
	RET(ncclSuccess, "ncclGroupStart", "depth=%d", gs_depth);
}

ncclResult_t ncclGroupEnd(void) {
	LOCK;
	if (gs_depth == 0) RET(GS_ncclInvalidUsage, "ncclGroupEnd", "depth=0");
	if (--gs_depth > 0) RET(ncclSuccess, "ncclGroupEnd", "depth=%d", gs_depth + 1);
	// the k-th send to self meets the k-th receive from self
	int sends = 0, recvs = 0, r = ncclSuccess;
	for (int i = 0; i < gs_nops; i++) *(gs_ops[i].send ? &sends : &recvs) += 1;
	if (sends != recvs) r = GS_ncclInvalidUsage;
	for (int s = 0, v = 0; r == ncclSuccess; s++, v++) {
		while (s < gs_nops && !gs_ops[s].send) s++;
		while (v < gs_nops && gs_ops[v].send) v++;
		if (s == gs_nops || v == gs_nops) break;
		if (gs_ops[s].count != gs_ops[v].count) r = GS_ncclInvalidUsage;
		else memmove(gs_ops[v].buf, gs_ops[s].buf, 4 * gs_ops[s].count);
	}
	gs_nops = 0;
	RET(r, "ncclGroupEnd", "depth=1 pairs=%d", sends < recvs ? sends : recvs);
}

// gs_comm_check is the result of checking an operation's communicator, data type, stream and
// device ranges (and the reduction, when op ≥ 0).
static int gs_comm_check(ncclComm_t comm, ncclDataType_t datatype, int op, cudaStream_t stream, const void* a,
                         const void* b, size_t bytes) {
	if (!gs_valid(comm, GS_COMM) || !gs_valid(stream, GS_STREAM)) return GS_ncclInvalidArgument;
	if (datatype != ncclFloat32) return GS_ncclInvalidArgument;  // the only type this stub moves
	if (op > 4) return GS_ncclInvalidArgument;
	if (!gs_in_device((uintptr_t)a, bytes) || (b != NULL && !gs_in_device((uintptr_t)b, bytes)))
		return GS_ncclInvalidArgument;
	return ncclSuccess;
}

// gs_p2p_post queues a send or receive in the open group.
static int gs_p2p_post(int send, const void* buf, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                       cudaStream_t stream) {
	int r = gs_comm_check(comm, datatype, -1, stream, buf, NULL, 4 * count);
	if (r != ncclSuccess) return r;
	if (peer < 0 || peer >= comm->nranks) return GS_ncclInvalidArgument;
	if (gs_depth == 0) return GS_ncclInvalidUsage;  // alone it would wait forever for its partner
	if (gs_nops == gs_capops) {
		gs_capops = gs_capops ? 2 * gs_capops : 16;
		gs_ops = realloc(gs_ops, gs_capops * sizeof *gs_ops);
	}
	gs_ops[gs_nops++] = (gs_p2p){send, (char*)buf, count};
	return ncclSuccess;
}

ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
	LOCK;
	int r = gs_p2p_post(1, sendbuff, count, datatype, peer, comm, stream);
	RET(r, "ncclSend", "count=%zu datatype=%d peer=%d comm=%s stream=%s", count, datatype, peer, gs_name(comm),
	    gs_name(stream));
}

ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
	LOCK;
	int r = gs_p2p_post(0, recvbuff, count, datatype, peer, comm, stream);
	RET(r, "ncclRecv", "count=%zu datatype=%d peer=%d comm=%s stream=%s", count, datatype, peer, gs_name(comm),
	    gs_name(stream));
}

// On one rank each collective copies src to dst.
ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream) {
	LOCK;
	int r = gs_comm_check(comm, datatype, op, stream, sendbuff, recvbuff, 4 * count);
	if (r == ncclSuccess) memmove(recvbuff, sendbuff, 4 * count);
	RET(r, "ncclAllReduce", "count=%zu datatype=%d op=%d inplace=%d comm=%s stream=%s", count, datatype, op,
	    sendbuff == recvbuff, gs_name(comm), gs_name(stream));
}

ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream) {
	LOCK;
	int r = gs_comm_check(comm, datatype, -1, stream, sendbuff, recvbuff, 4 * sendcount);
	if (r == ncclSuccess) memmove(recvbuff, sendbuff, 4 * sendcount);
	RET(r, "ncclAllGather", "sendcount=%zu datatype=%d inplace=%d comm=%s stream=%s", sendcount, datatype,
	    sendbuff == recvbuff, gs_name(comm), gs_name(stream));
}

ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount, ncclDataType_t datatype,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
	LOCK;
	int r = gs_comm_check(comm, datatype, op, stream, sendbuff, recvbuff, 4 * recvcount);
	if (r == ncclSuccess) memmove(recvbuff, sendbuff, 4 * recvcount);
	RET(r, "ncclReduceScatter", "recvcount=%zu datatype=%d op=%d inplace=%d comm=%s stream=%s", recvcount, datatype,
	    op, sendbuff == recvbuff, gs_name(comm), gs_name(stream));
}
