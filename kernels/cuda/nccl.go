//go:build cuda

package cuda

// NCCL, opened at run time like the driver and cuBLAS: libnccl.so.2 (or $DISTFLASH_LIBNCCL) is
// loaded at the first NCCL call, never before, so a -tags cuda binary on a machine without
// NCCL starts and runs everything else. Its declarations come from nccl_abi.h, not NCCL's
// header. Each communicator runs on a stream of its own, ordered against the device's compute
// stream (the stream of every other Device method) with a pair of events of its own.
//
// This file's C helpers have their own pointers to the driver's entry points (cgo compiles
// each file's preamble apart, so driver.go's are out of reach), resolved from the driver
// library driver.go's Load opened. Like driver.go's, every helper makes the device's context
// current before its calls.

/*
#cgo LDFLAGS: -ldl
#include "nccl_abi.h"
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DFN_DECLARE(name, sym, ret, params) static ret(*p_##name) params;
DF_CU_FUNCS(DFN_DECLARE)
DF_NCCL_FUNCS(DFN_DECLARE)
DF_NCCL_OPTIONAL_FUNCS(DFN_DECLARE)

// dfn_open_cuda resolves this file's driver entry points in the driver library (libcuda.so.1 or
// $DISTFLASH_LIBCUDA, which Load has opened: dlopen takes one more reference). It returns 0, or
// 1 with a message in err.
static int dfn_open_cuda(char* err, size_t n) {
	const char* cu = getenv("DISTFLASH_LIBCUDA");
	if (cu == NULL || cu[0] == 0) cu = "libcuda.so.1";
	void* h = dlopen(cu, RTLD_NOW | RTLD_GLOBAL);
	if (h == NULL) {
		snprintf(err, n, "cannot load the NVIDIA driver library %s: %s", cu, dlerror());
		return 1;
	}
#define DFN_RESOLVE_CU(name, sym, ret, params) \
	p_##name = (ret(*) params)dlsym(h, sym); \
	if (p_##name == NULL) { snprintf(err, n, "%s has no %s", cu, sym); return 1; }
	DF_CU_FUNCS(DFN_RESOLVE_CU)
	return 0;
}

// dfn_open_nccl opens lib and resolves NCCL's entry points, the optional ones where it has
// them. It returns 0; 1 when lib does not load (dlerror's message in err); 2 when an entry point
// is missing (its name in err).
static int dfn_open_nccl(const char* lib, char* err, size_t n) {
	void* h = dlopen(lib, RTLD_NOW | RTLD_GLOBAL);
	if (h == NULL) {
		snprintf(err, n, "%s", dlerror());
		return 1;
	}
#define DFN_RESOLVE_NCCL(name, sym, ret, params) \
	p_##name = (ret(*) params)dlsym(h, sym); \
	if (p_##name == NULL) { snprintf(err, n, "%s", sym); return 2; }
	DF_NCCL_FUNCS(DFN_RESOLVE_NCCL)
#define DFN_RESOLVE_OPTIONAL(name, sym, ret, params) p_##name = (ret(*) params)dlsym(h, sym);
	DF_NCCL_OPTIONAL_FUNCS(DFN_RESOLVE_OPTIONAL)
	return 0;
}

static int dfn_has_split(void) { return p_ncclCommSplit != NULL; }

// dfn_status is a helper's outcome: the call that failed (DFN_OK for none) and its result.
// DFN_ASYNC is the communicator's asynchronous error, which ncclCommGetAsyncError reported.
#define DFN_CALL_ID(name, sym, ret, params) DFN_CALL_##name,
enum {
	DFN_OK,
	DF_CU_FUNCS(DFN_CALL_ID)
	DFN_FIRST_NCCL,
	DF_NCCL_FUNCS(DFN_CALL_ID)
	DF_NCCL_OPTIONAL_FUNCS(DFN_CALL_ID)
	DFN_ASYNC
};
typedef struct {
	int call;
	int code;
} dfn_status;

#define DFN_CALL_NAME(name, sym, ret, params) #name,
static const char* dfn_call_names[] = {
	"", DF_CU_FUNCS(DFN_CALL_NAME) "", DF_NCCL_FUNCS(DFN_CALL_NAME) DF_NCCL_OPTIONAL_FUNCS(DFN_CALL_NAME) "ncclCommGetAsyncError",
};
static const char* dfn_call_name(int call) { return dfn_call_names[call]; }

static const char* dfn_error_string(int r) {
	return p_ncclGetErrorString != NULL ? p_ncclGetErrorString((ncclResult_t)r) : NULL;
}

// DFN_CU and DFN_NC make one call and return its failure as a dfn_status.
#define DFN_CU(name, args) \
	do { CUresult r_ = p_##name args; if (r_ != CUDA_SUCCESS) return (dfn_status){DFN_CALL_##name, (int)r_}; } while (0)
#define DFN_NC(name, args) \
	do { ncclResult_t r_ = p_##name args; if (r_ != ncclSuccess) return (dfn_status){DFN_CALL_##name, (int)r_}; } while (0)
#define DFN_DONE return (dfn_status){DFN_OK, 0}

// dfn_setup makes a communicator's stream and its events.
static dfn_status dfn_setup(CUcontext c, CUstream* s, CUevent* toComm, CUevent* toCompute) {
	DFN_CU(cuCtxSetCurrent, (c));
	DFN_CU(cuStreamCreate, (s, CU_STREAM_NON_BLOCKING));
	DFN_CU(cuEventCreate, (toComm, CU_EVENT_DISABLE_TIMING));
	DFN_CU(cuEventCreate, (toCompute, CU_EVENT_DISABLE_TIMING));
	DFN_DONE;
}

// dfn_teardown destroys what dfn_setup made (NULL handles are skipped), all of it even after a
// failure (the first is returned). The stream's queued work still runs.
static dfn_status dfn_teardown(CUcontext c, CUstream s, CUevent toComm, CUevent toCompute) {
	dfn_status st = {DFN_OK, 0};
	CUresult r;
	DFN_CU(cuCtxSetCurrent, (c));
	if (s != NULL && (r = p_cuStreamDestroy(s)) != CUDA_SUCCESS && st.call == DFN_OK) st = (dfn_status){DFN_CALL_cuStreamDestroy, (int)r};
	if (toComm != NULL && (r = p_cuEventDestroy(toComm)) != CUDA_SUCCESS && st.call == DFN_OK) st = (dfn_status){DFN_CALL_cuEventDestroy, (int)r};
	if (toCompute != NULL && (r = p_cuEventDestroy(toCompute)) != CUDA_SUCCESS && st.call == DFN_OK) st = (dfn_status){DFN_CALL_cuEventDestroy, (int)r};
	return st;
}

static dfn_status dfn_version(int* v) {
	DFN_NC(ncclGetVersion, (v));
	DFN_DONE;
}

static dfn_status dfn_unique_id(CUcontext c, void* id) {
	ncclUniqueId u;
	DFN_CU(cuCtxSetCurrent, (c));
	DFN_NC(ncclGetUniqueId, (&u));
	memcpy(id, u.internal, NCCL_UNIQUE_ID_BYTES);
	DFN_DONE;
}

static dfn_status dfn_init(CUcontext c, uintptr_t* comm, int nranks, const void* id, int rank) {
	ncclUniqueId u;
	ncclComm_t h = NULL;
	memcpy(u.internal, id, NCCL_UNIQUE_ID_BYTES);
	DFN_CU(cuCtxSetCurrent, (c));
	DFN_NC(ncclCommInitRank, (&h, nranks, u, rank));
	*comm = (uintptr_t)h;
	DFN_DONE;
}

static dfn_status dfn_split(CUcontext c, uintptr_t comm, int color, int key, uintptr_t* out) {
	ncclComm_t h = NULL;
	DFN_CU(cuCtxSetCurrent, (c));
	DFN_NC(ncclCommSplit, ((ncclComm_t)comm, color, key, &h, NULL));
	*out = (uintptr_t)h;
	DFN_DONE;
}

// dfn_destroy waits for the communicator's stream, then destroys the communicator.
static dfn_status dfn_destroy(CUcontext c, CUstream s, uintptr_t comm) {
	DFN_CU(cuCtxSetCurrent, (c));
	DFN_CU(cuStreamSynchronize, (s));
	DFN_NC(ncclCommDestroy, ((ncclComm_t)comm));
	DFN_DONE;
}

static dfn_status dfn_abort(CUcontext c, uintptr_t comm) {
	DFN_CU(cuCtxSetCurrent, (c));
	DFN_NC(ncclCommAbort, ((ncclComm_t)comm));
	DFN_DONE;
}

// dfn_group_start makes a communicator's stream wait for the work queued so far on the compute
// stream, then opens an NCCL group (on the calling thread: NCCL's group is per thread).
static dfn_status dfn_group_start(CUcontext c, CUstream compute, CUstream comm, CUevent ev) {
	DFN_CU(cuCtxSetCurrent, (c));
	DFN_CU(cuEventRecord, (ev, compute));
	DFN_CU(cuStreamWaitEvent, (comm, ev, 0));
	DFN_NC(ncclGroupStart, ());
	DFN_DONE;
}

static dfn_status dfn_group_end(CUcontext c) {
	DFN_CU(cuCtxSetCurrent, (c));
	DFN_NC(ncclGroupEnd, ());
	DFN_DONE;
}

// dfn_join makes the compute stream wait for the work queued so far on a communicator's stream.
static dfn_status dfn_join(CUcontext c, CUstream compute, CUstream comm, CUevent ev) {
	DFN_CU(cuCtxSetCurrent, (c));
	DFN_CU(cuEventRecord, (ev, comm));
	DFN_CU(cuStreamWaitEvent, (compute, ev, 0));
	DFN_DONE;
}

// dfn_sync waits for a communicator's stream, then asks it for its asynchronous error.
static dfn_status dfn_sync(CUcontext c, CUstream s, uintptr_t comm) {
	ncclResult_t async = ncclSuccess;
	DFN_CU(cuCtxSetCurrent, (c));
	DFN_CU(cuStreamSynchronize, (s));
	DFN_NC(ncclCommGetAsyncError, ((ncclComm_t)comm, &async));
	if (async != ncclSuccess) return (dfn_status){DFN_ASYNC, (int)async};
	DFN_DONE;
}

// dfn_poll reports, without waiting, whether a communicator's stream still has work queued
// (busy) and the communicator's asynchronous error; a watchdog calls it from its own thread.
static dfn_status dfn_poll(CUcontext c, CUstream s, uintptr_t comm, int* busy) {
	ncclResult_t async = ncclSuccess;
	CUresult r;
	DFN_CU(cuCtxSetCurrent, (c));
	r = p_cuStreamQuery(s);
	if (r != CUDA_SUCCESS && r != CUDA_ERROR_NOT_READY) return (dfn_status){DFN_CALL_cuStreamQuery, (int)r};
	*busy = r == CUDA_ERROR_NOT_READY;
	DFN_NC(ncclCommGetAsyncError, ((ncclComm_t)comm, &async));
	if (async != ncclSuccess) return (dfn_status){DFN_ASYNC, (int)async};
	DFN_DONE;
}

static dfn_status dfn_send(CUcontext c, CUstream s, uintptr_t comm, CUdeviceptr buf, size_t count, int peer) {
	DFN_CU(cuCtxSetCurrent, (c));
	DFN_NC(ncclSend, ((const void*)buf, count, ncclFloat32, peer, (ncclComm_t)comm, (cudaStream_t)s));
	DFN_DONE;
}

static dfn_status dfn_recv(CUcontext c, CUstream s, uintptr_t comm, CUdeviceptr buf, size_t count, int peer) {
	DFN_CU(cuCtxSetCurrent, (c));
	DFN_NC(ncclRecv, ((void*)buf, count, ncclFloat32, peer, (ncclComm_t)comm, (cudaStream_t)s));
	DFN_DONE;
}

static dfn_status dfn_all_reduce(CUcontext c, CUstream s, uintptr_t comm, CUdeviceptr buf, size_t count) {
	DFN_CU(cuCtxSetCurrent, (c));
	DFN_NC(ncclAllReduce, ((const void*)buf, (void*)buf, count, ncclFloat32, ncclSum, (ncclComm_t)comm, (cudaStream_t)s));
	DFN_DONE;
}

static dfn_status dfn_all_gather(CUcontext c, CUstream s, uintptr_t comm, CUdeviceptr dst, CUdeviceptr src, size_t sendcount) {
	DFN_CU(cuCtxSetCurrent, (c));
	DFN_NC(ncclAllGather, ((const void*)src, (void*)dst, sendcount, ncclFloat32, (ncclComm_t)comm, (cudaStream_t)s));
	DFN_DONE;
}

static dfn_status dfn_reduce_scatter(CUcontext c, CUstream s, uintptr_t comm, CUdeviceptr dst, CUdeviceptr src, size_t recvcount) {
	DFN_CU(cuCtxSetCurrent, (c));
	DFN_NC(ncclReduceScatter, ((const void*)src, (void*)dst, recvcount, ncclFloat32, ncclSum, (ncclComm_t)comm, (cudaStream_t)s));
	DFN_DONE;
}
*/
import "C"

import (
	"fmt"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"unsafe"
)

// NCCLError is a failed NCCL call, or (Async) the asynchronous error a communicator reported.
type NCCLError struct {
	Call  string // the NCCL function
	Code  int    // its ncclResult_t
	Async bool   // Code is the communicator's asynchronous error (ncclCommGetAsyncError's result)
}

// Error names the call, its ncclResult_t and NCCL's description of the result.
func (e NCCLError) Error() string {
	call, desc := e.Call, ""
	if e.Async {
		call = "the communicator's asynchronous error (" + e.Call + ")"
	}
	if s := C.dfn_error_string(C.int(e.Code)); s != nil {
		desc = ": " + C.GoString(s)
	}
	return fmt.Sprintf("%s: ncclResult_t %d%s", call, e.Code, desc)
}

// status returns nil for a helper that succeeded, else the failed call's Error (a driver call)
// or NCCLError.
func status(st C.dfn_status) error {
	switch call := int(st.call); {
	case call == C.DFN_OK:
		return nil
	case call == C.DFN_ASYNC:
		return NCCLError{Call: "ncclCommGetAsyncError", Code: int(st.code), Async: true}
	case call > C.DFN_FIRST_NCCL:
		return NCCLError{Call: C.GoString(C.dfn_call_name(st.call)), Code: int(st.code)}
	default:
		return Error{Call: C.GoString(C.dfn_call_name(st.call)), Code: int(st.code)}
	}
}

// ncclLib is the loaded NCCL library. A failed load is tried again at the next call, so
// that setting DISTFLASH_LIBNCCL or installing NCCL needs no restart; a loaded library stays.
var ncclLib struct {
	mu     sync.Mutex
	loaded atomic.Bool
	file   string // the file loaded
}

// LoadNCCL opens NCCL's library (libnccl.so.2 on the loader's path, or the file
// $DISTFLASH_LIBNCCL names) and resolves the calls this package makes; ncclCommSplit (NCCL
// 2.18) may be missing until NCCL.Split is called. Every NCCL function of this package calls
// it; nothing loads NCCL before. The error of a library that does not load says how to install
// one.
func LoadNCCL() error {
	if ncclLib.loaded.Load() {
		return nil
	}
	ncclLib.mu.Lock()
	defer ncclLib.mu.Unlock()
	if ncclLib.loaded.Load() {
		return nil
	}
	file, from := os.Getenv("DISTFLASH_LIBNCCL"), " (DISTFLASH_LIBNCCL)"
	if file == "" {
		file, from = "libnccl.so.2", ""
	}
	cfile := C.CString(file)
	defer C.free(unsafe.Pointer(cfile))
	const msgSize = 1024
	msg := (*C.char)(C.calloc(1, msgSize))
	defer C.free(unsafe.Pointer(msg))
	switch C.dfn_open_nccl(cfile, msg, msgSize) {
	case 0:
	case 1:
		return fmt.Errorf("cannot load NCCL's library %s%s: %s; install NCCL (e.g. pip install nvidia-nccl-cu12 "+
			"and put the wheel's nvidia/nccl/lib directory on LD_LIBRARY_PATH) or set DISTFLASH_LIBNCCL to the "+
			"path of libnccl.so.2", file, from, C.GoString(msg))
	default:
		return fmt.Errorf("%s%s has no %s: it is not NCCL, or an NCCL older than 2.9", file, from, C.GoString(msg))
	}
	ncclLib.file = file
	ncclLib.loaded.Store(true)
	return nil
}

// NCCLVersion is ncclGetVersion: major·10000 + minor·100 + patch (from NCCL 2.9 on).
func NCCLVersion() (int, error) {
	if err := LoadNCCL(); err != nil {
		return 0, err
	}
	var v C.int
	if err := status(C.dfn_version(&v)); err != nil {
		return 0, err
	}
	return int(v), nil
}

// NCCLHasSplit reports whether the loaded NCCL has ncclCommSplit (NCCL 2.18 on); false before
// a library is loaded.
func NCCLHasSplit() bool { return ncclLib.loaded.Load() && C.dfn_has_split() != 0 }

// ncclVersionString writes an ncclGetVersion code as major.minor.patch.
func ncclVersionString(v int) string {
	if v < 20900 { // before 2.9: major·1000 + minor·100 + patch
		return fmt.Sprintf("%d.%d.%d", v/1000, v%1000/100, v%100)
	}
	return fmt.Sprintf("%d.%d.%d", v/10000, v%10000/100, v%100)
}

// ncclCUDA is the outcome of resolving this file's driver entry points, once per process.
var ncclCUDA struct {
	once sync.Once
	err  error
}

// NCCL is a device's side of NCCL. A communicator (an ncclComm_t handle as uintptr) made by
// Init or Split has a stream of its own, on which its operations are queued, and two events
// that order the stream against the device's compute stream: communicators used from two
// goroutines at once never queue behind each other. The methods may be called from any
// goroutine, except that a group's operations and GroupEnd must be called from the goroutine
// that called GroupStart.
type NCCL struct {
	d *Device
}

// comm is the state of one communicator.
type comm struct {
	h      C.uintptr_t
	d      *Device
	stream C.CUstream
	// toComm is recorded on the compute stream for the communicator's stream to wait on
	// (GroupStart), toCompute the other way (Join)
	toComm, toCompute C.CUevent

	mu sync.Mutex
	// held keeps the allocations of the operations queued since the last Join or Sync
	// reachable: their cleanup frees them on the compute stream, which is ordered after the
	// communicator's stream only from the next Join on
	held []*Mem
}

// comms holds every communicator from its Init or Split to its Destroy or Abort.
var comms struct {
	mu sync.Mutex
	m  map[uintptr]*comm
}

// NCCL returns d's NCCL side after loading NCCL (LoadNCCL).
func (d *Device) NCCL() (*NCCL, error) {
	if err := LoadNCCL(); err != nil {
		return nil, err
	}
	ncclCUDA.once.Do(func() {
		const msgSize = 1024
		msg := (*C.char)(C.calloc(1, msgSize))
		defer C.free(unsafe.Pointer(msg))
		if C.dfn_open_cuda(msg, msgSize) != 0 {
			ncclCUDA.err = fmt.Errorf("nccl: %s", C.GoString(msg))
		}
	})
	if ncclCUDA.err != nil {
		return nil, ncclCUDA.err
	}
	if d.closed.Load() {
		return nil, fmt.Errorf("nccl: device %d (%s) is closed", d.Ordinal, d.Name)
	}
	return &NCCL{d: d}, nil
}

// comm returns the state of communicator h of n's device.
func (n *NCCL) comm(h uintptr) (*comm, error) {
	comms.mu.Lock()
	c := comms.m[h]
	comms.mu.Unlock()
	if c == nil || c.d != n.d {
		return nil, fmt.Errorf("nccl: %#x is no communicator of device %d (none made by Init or Split and not yet destroyed)", h, n.d.Ordinal)
	}
	return c, nil
}

// newComm makes the stream and events of a communicator about to be made.
func (n *NCCL) newComm() (*comm, error) {
	c := &comm{d: n.d}
	if err := status(C.dfn_setup(n.d.ctx, &c.stream, &c.toComm, &c.toCompute)); err != nil {
		c.free() // the setup's error is the one to report
		return nil, fmt.Errorf("nccl: communicator stream on device %d: %w", n.d.Ordinal, err)
	}
	return c, nil
}

// free destroys c's stream and events.
func (c *comm) free() error {
	return status(C.dfn_teardown(c.d.ctx, c.stream, c.toComm, c.toCompute))
}

// register records c as communicator h.
func (c *comm) register(h C.uintptr_t) uintptr {
	c.h = h
	comms.mu.Lock()
	if comms.m == nil {
		comms.m = map[uintptr]*comm{}
	}
	comms.m[uintptr(h)] = c
	comms.mu.Unlock()
	return uintptr(h)
}

// forget removes c from the communicators and destroys its stream and events.
func (c *comm) forget() error {
	comms.mu.Lock()
	delete(comms.m, uintptr(c.h))
	comms.mu.Unlock()
	c.mu.Lock()
	c.held = nil
	c.mu.Unlock()
	return c.free()
}

// UniqueID is ncclGetUniqueId (with the device's context current): the id the ranks of a new
// communicator pass to Init.
func (n *NCCL) UniqueID() ([128]byte, error) {
	var id [128]byte
	err := status(C.dfn_unique_id(n.d.ctx, unsafe.Pointer(&id[0])))
	return id, err
}

// Init is ncclCommInitRank, with the device's context current: this rank's communicator of
// nranks ranks, with a stream of its own. It returns when every rank has called it.
func (n *NCCL) Init(nranks int, id [128]byte, rank int) (uintptr, error) {
	if nranks < 1 || rank < 0 || rank >= nranks {
		return 0, fmt.Errorf("ncclCommInitRank: rank %d of %d ranks", rank, nranks)
	}
	c, err := n.newComm()
	if err != nil {
		return 0, err
	}
	var h C.uintptr_t
	if err := status(C.dfn_init(n.d.ctx, &h, C.int(nranks), unsafe.Pointer(&id[0]), C.int(rank))); err != nil {
		c.free()
		return 0, err
	}
	return c.register(h), nil
}

// Split is ncclCommSplit(comm, color, key, &new, NULL), which NCCL has from 2.18 on: the ranks
// of comm with equal color form a new communicator, with a stream of its own, ordered by key,
// then by rank in comm; a negative color (NCCL_SPLIT_NOCOLOR) joins none and gives 0. Every
// rank of comm calls it.
func (n *NCCL) Split(h uintptr, color, key int) (uintptr, error) {
	if C.dfn_has_split() == 0 {
		version := "unknown version"
		if v, err := NCCLVersion(); err == nil {
			version = ncclVersionString(v)
		}
		return 0, fmt.Errorf("ncclCommSplit: %s (NCCL %s) has no ncclCommSplit, which came with NCCL 2.18",
			ncclLib.file, version)
	}
	if _, err := n.comm(h); err != nil {
		return 0, err
	}
	c, err := n.newComm()
	if err != nil {
		return 0, err
	}
	var sub C.uintptr_t
	if err := status(C.dfn_split(n.d.ctx, C.uintptr_t(h), C.int(color), C.int(key), &sub)); err != nil {
		c.free()
		return 0, err
	}
	if sub == 0 {
		return 0, c.free()
	}
	return c.register(sub), nil
}

// Destroy waits for comm's stream, then calls ncclCommDestroy and destroys the stream and its
// events.
func (n *NCCL) Destroy(h uintptr) error {
	c, err := n.comm(h)
	if err != nil {
		return err
	}
	err = status(C.dfn_destroy(n.d.ctx, c.stream, c.h))
	if ferr := c.forget(); err == nil {
		err = ferr
	}
	return err
}

// Abort is ncclCommAbort: it frees comm and ends its operations still running (after an
// asynchronous error, or to give up on a lost peer), then destroys its stream and events.
func (n *NCCL) Abort(h uintptr) error {
	c, err := n.comm(h)
	if err != nil {
		return err
	}
	err = status(C.dfn_abort(n.d.ctx, c.h))
	if ferr := c.forget(); err == nil {
		err = ferr
	}
	return err
}

// GroupStart makes comm's stream wait for the work queued so far on the compute stream (an
// event; the host does not wait), then calls ncclGroupStart; the group's operations are to be
// comm's. NCCL keeps the open group per OS thread, so GroupStart locks the calling goroutine to
// its thread until GroupEnd: the group's operations and GroupEnd must be called from the same
// goroutine.
func (n *NCCL) GroupStart(h uintptr) error {
	c, err := n.comm(h)
	if err != nil {
		return err
	}
	runtime.LockOSThread()
	if err := status(C.dfn_group_start(n.d.ctx, n.d.stream, c.stream, c.toComm)); err != nil {
		runtime.UnlockOSThread()
		return err
	}
	return nil
}

// GroupEnd is ncclGroupEnd: the operations of the group GroupStart opened start together. It
// undoes GroupStart's lock of the goroutine to its thread.
func (n *NCCL) GroupEnd() error {
	defer runtime.UnlockOSThread()
	return status(C.dfn_group_end(n.d.ctx))
}

// Join makes the work queued afterwards on the compute stream wait for every operation queued
// so far on comm's stream (an event; the host does not wait).
func (n *NCCL) Join(h uintptr) error {
	c, err := n.comm(h)
	if err != nil {
		return err
	}
	k := c.heldCount()
	if err := status(C.dfn_join(n.d.ctx, n.d.stream, c.stream, c.toCompute)); err != nil {
		return err
	}
	c.release(k)
	return nil
}

// Sync waits on the host for every operation queued on comm's stream, then returns comm's
// asynchronous error (ncclCommGetAsyncError) as an NCCLError with Async set, if it has one.
func (n *NCCL) Sync(h uintptr) error {
	c, err := n.comm(h)
	if err != nil {
		return err
	}
	k := c.heldCount()
	st := C.dfn_sync(n.d.ctx, c.stream, c.h)
	if call := int(st.call); call == C.DFN_OK || call > C.DFN_FIRST_NCCL {
		c.release(k) // the stream has been waited for
	}
	return status(st)
}

// Poll reports, without waiting, whether comm's stream has operations not yet done, and comm's
// asynchronous error as Sync does. It may run on another goroutine than comm's other calls (a
// watchdog's).
func (n *NCCL) Poll(h uintptr) (bool, error) {
	c, err := n.comm(h)
	if err != nil {
		return false, err
	}
	var busy C.int
	st := C.dfn_poll(n.d.ctx, c.stream, c.h, &busy)
	return busy != 0, status(st)
}

// View is Len float32 values of a device allocation from value Off on: the buffer of an NCCL
// operation.
type View struct {
	Mem      *Mem
	Off, Len int
}

// ptr returns the device address of v, checking that it lies inside its allocation.
func (v View) ptr() (C.CUdeviceptr, error) {
	if v.Off < 0 || v.Len < 0 || (v.Mem == nil && v.Len > 0) || (v.Mem != nil && 4*(v.Off+v.Len) > v.Mem.Bytes) {
		bytes := 0
		if v.Mem != nil {
			bytes = v.Mem.Bytes
		}
		return 0, fmt.Errorf("values [%d, %d) of an allocation of %d bytes", v.Off, v.Off+v.Len, bytes)
	}
	if v.Mem == nil {
		return 0, nil
	}
	return C.CUdeviceptr(v.Mem.Ptr) + C.CUdeviceptr(4*v.Off), nil
}

// queue checks comm and the views of one operation, holds their allocations until the next
// Join or Sync, and returns comm's state and the views' device addresses.
func (n *NCCL) queue(h uintptr, vs ...View) (*comm, []C.CUdeviceptr, error) {
	c, err := n.comm(h)
	if err != nil {
		return nil, nil, err
	}
	ptrs := make([]C.CUdeviceptr, len(vs))
	for i, v := range vs {
		if ptrs[i], err = v.ptr(); err != nil {
			return nil, nil, err
		}
	}
	c.mu.Lock()
	for _, v := range vs {
		if v.Mem != nil {
			c.held = append(c.held, v.Mem)
		}
	}
	c.mu.Unlock()
	return c, ptrs, nil
}

func (c *comm) heldCount() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.held)
}

// release lets go of the first k held allocations (those of operations queued before a Join
// or Sync).
func (c *comm) release(k int) {
	c.mu.Lock()
	k = min(k, len(c.held))
	rest := copy(c.held, c.held[k:])
	clear(c.held[rest:])
	c.held = c.held[:rest]
	c.mu.Unlock()
}

// Send queues ncclSend of v's float32 values to rank peer of comm on comm's stream.
func (n *NCCL) Send(h uintptr, v View, peer int) error {
	c, p, err := n.queue(h, v)
	if err != nil {
		return fmt.Errorf("ncclSend: %w", err)
	}
	return status(C.dfn_send(n.d.ctx, c.stream, c.h, p[0], C.size_t(v.Len), C.int(peer)))
}

// Recv queues ncclRecv of v's float32 values from rank peer of comm on comm's stream.
func (n *NCCL) Recv(h uintptr, v View, peer int) error {
	c, p, err := n.queue(h, v)
	if err != nil {
		return fmt.Errorf("ncclRecv: %w", err)
	}
	return status(C.dfn_recv(n.d.ctx, c.stream, c.h, p[0], C.size_t(v.Len), C.int(peer)))
}

// AllReduce queues ncclAllReduce (ncclSum, ncclFloat32) of v in place on comm's stream.
func (n *NCCL) AllReduce(h uintptr, v View) error {
	c, p, err := n.queue(h, v)
	if err != nil {
		return fmt.Errorf("ncclAllReduce: %w", err)
	}
	return status(C.dfn_all_reduce(n.d.ctx, c.stream, c.h, p[0], C.size_t(v.Len)))
}

// AllGather queues ncclAllGather of src's float32 values into dst, which receives the ranks'
// src in rank order (ranks × src.Len values), on comm's stream.
func (n *NCCL) AllGather(h uintptr, dst, src View) error {
	c, p, err := n.queue(h, dst, src)
	if err != nil {
		return fmt.Errorf("ncclAllGather: %w", err)
	}
	return status(C.dfn_all_gather(n.d.ctx, c.stream, c.h, p[0], p[1], C.size_t(src.Len)))
}

// ReduceScatter queues ncclReduceScatter (ncclSum, ncclFloat32) of src (ranks × dst.Len
// values) into dst, this rank's chunk of the sum, on comm's stream.
func (n *NCCL) ReduceScatter(h uintptr, dst, src View) error {
	c, p, err := n.queue(h, dst, src)
	if err != nil {
		return fmt.Errorf("ncclReduceScatter: %w", err)
	}
	return status(C.dfn_reduce_scatter(n.d.ctx, c.stream, c.h, p[0], p[1], C.size_t(dst.Len)))
}
