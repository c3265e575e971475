// cudnnstub: a stand-in for cuDNN 9's backend API (libcudnn.so.9) and for the one driver call
// kernels/cuda/cudnn.go makes besides (cuCtxSetCurrent), so that the CUDA backend's cuDNN path
// runs on a machine without a GPU. TestCUDAHostCUDNNStub (kernels/cuda_cudnn_stub_test.go)
// builds it and points DISTFLASH_LIBCUDNN and DISTFLASH_LIBCUDA at it.
//
//	gcc -shared -fPIC -I kernels/cuda -o libcudnnstub.so kernels/testdata/cudnnstub/cudnnstub.c
//
// It exports every entry point of DF_CUDNN_FUNCS (kernels/cuda/cudnn_abi_funcs.h) under its
// symbol with the signature declared there, so a signature that drifts from the Go side's fails
// to compile. What it does, as cuDNN would (as far as the backend API's documentation says):
//   - descriptors are records of their type, attributes (copied at cudnnBackendSetAttribute)
//     and finalised state; a stale or foreign descriptor, an attribute of the wrong
//     cudnnBackendAttributeType_t (CUDNN_STATUS_BAD_PARAM_ATTRIBUTE_TYPE) or on the wrong kind
//     of descriptor (CUDNN_STATUS_BAD_PARAM), a descriptor attribute that names a descriptor
//     of the wrong type or not finalised, a set after finalisation, are refused;
//   - cudnnBackendFinalize checks each descriptor's required attributes and shapes: tensors
//     (rank 1-8, as many strides, unique id, alignment, not both virtual and by value),
//     pointwise operations (tensor count by mode, X and Y of one shape, B and T broadcast to
//     it), matmuls ([.., M, K]·[.., K, N] = [.., M, N], batch dimensions broadcast, GQA heads a
//     divisor), reductions (Y's extents 1 or X's), reshapes (equal element counts), operation
//     graphs (unique ids, each virtual tensor made by exactly one operation and read by one,
//     nothing written twice, ragged offsets int32/int64 non-virtual), heuristics, plans
//     (an engine configuration from heuristics), variant packs;
//   - the heuristics return $CUDNNSTUB_ENGINES_A (default 2) configurations for mode A and
//     $CUDNNSTUB_ENGINES_FALLBACK (default 1) for the fallback mode; the first
//     $CUDNNSTUB_PLAN_FAILS (default 1) plans to be finalised fail with
//     CUDNN_STATUS_NOT_SUPPORTED_GRAPH_PATTERN, as engines that do not take a graph do;
//   - an execution plan finalises only as cuDNN's runtime-compiled SDPA engines do: with NVRTC
//     resolvable in the global namespace (nvrtcVersion, as a library loaded with RTLD_GLOBAL
//     gives it; else CUDNN_STATUS_NOT_SUPPORTED_RUNTIME_PREREQUISITE_MISSING) and its
//     libnvrtc-builtins.so.<major>.<minor> already loaded (else
//     CUDNN_STATUS_INTERNAL_ERROR_COMPILATION_FAILED), and only for a graph inside the support
//     table (cs_support: version and GPU, $CUDNNSTUB_SM, default 90, against the graph's head
//     dimension, lengths, direction and masks, read from its structure; else
//     CUDNN_STATUS_NOT_SUPPORTED) — written from the cuDNN review, not from kernels/cuda;
//   - a graph whose 16-bit tensors do not all have one head dimension (d_qk ≠ d_v) is refused
//     at the operation graph, and CUDNN_ATTR_POINTWISE_AXIS on any mode but GEN_INDEX at the
//     pointwise descriptor (cudnn-frontend never writes it there);
//   - a plan asks for $CUDNNSTUB_WORKSPACE bytes of workspace (default 1 MiB), except a
//     deterministic backward (no dQ accumulator) on sm_9x, which asks what cuDNN's dP-workspace
//     decomposition does: b·h·s_q·s_kv·2 bytes, the lengths rounded up to 64;
//   - cudnnBackendExecute checks that the variant pack gives exactly the plan's non-virtual
//     tensors and a workspace, each tensor at its declared byte alignment
//     (CUDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER), and computes nothing;
//   - cudnnGetVersion returns $CUDNNSTUB_VERSION (default 91002), cudnnGetCudartVersion
//     $CUDNNSTUB_CUDART (default 13000).
//
// The tests build a stub NVRTC beside it (cs_nvrtc.c's two files): libnvrtc.so.13, whose
// nvrtcVersion says $CUDNNSTUB_NVRTC_MINOR (13.9 by default, a version no real builtins
// library has, so that only the stub's can satisfy the check), and its builtins.
//
// The log ($CUDNNSTUB_LOG; nothing without it) has one line per call: the entry point, then
// key=value pairs (descriptors by name: d1, d2, ...; cur= the context current on the calling
// thread; result= when the call fails). At each operation graph's finalisation it also writes
// the graph ("graph", one "tensor" line per tensor, one "op" line per operation, in the order
// of CUDNN_ATTR_OPERATIONGRAPH_OPS), and at each execution the variant pack ("execute", then
// one "bind" line per tensor, with the value of a by-value one).

#define _GNU_SOURCE
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <unistd.h>

#include "cudnn_abi.h"

#define CS_DECLARE(name, sym, ret, params) ret name params __asm__(sym) __attribute__((visibility("default")));
DF_CUDNN_FUNCS(CS_DECLARE)
CUresult cuCtxSetCurrent(CUcontext ctx) __attribute__((visibility("default")));

#define CS_ADDRESS(name, sym, ret, params) (void*)name,
__attribute__((used)) static void* cs_exports[] = {DF_CUDNN_FUNCS(CS_ADDRESS)(void*) cuCtxSetCurrent};

#define ST_BAD_PARAM 2000
#define ST_NULL_POINTER 2002
#define ST_MISALIGNED 2003
#define ST_NOT_FINALIZED 2004
#define ST_OUT_OF_BOUND 2005
#define ST_SHAPE_MISMATCH 2008
#define ST_DUPLICATED 2009
#define ST_ATTRIBUTE_TYPE 2010
#define ST_DESCRIPTOR_TYPE 2012
#define ST_NOT_INITIALIZED 1001
#define ST_NOT_SUPPORTED 3000
#define ST_GRAPH_PATTERN 3001
#define ST_SHAPE 3002
#define ST_PREREQUISITE 3008
#define ST_COMPILATION 4001

static pthread_mutex_t cs_mu = PTHREAD_MUTEX_INITIALIZER;
static int cs_log_fd = -2;
static __thread void* cs_cur;  // the context current on this thread
static __thread char cs_last[512];

static void cs_logv(const char* fmt, va_list ap) {
	if (cs_log_fd == -2) {
		const char* p = getenv("CUDNNSTUB_LOG");
		cs_log_fd = p && *p ? open(p, O_WRONLY | O_APPEND | O_CREAT, 0644) : -1;
	}
	if (cs_log_fd < 0) return;
	char buf[8192];
	int n = vsnprintf(buf, sizeof buf - 2, fmt, ap);
	if (n < 0) return;
	if (n > (int)sizeof buf - 2) n = sizeof buf - 2;
	buf[n++] = '\n';
	if (write(cs_log_fd, buf, n) < 0) return;
}

static void cs_log(const char* fmt, ...) {
	va_list ap;
	va_start(ap, fmt);
	cs_logv(fmt, ap);
	va_end(ap);
}

static long cs_env(const char* name, long def) {
	const char* v = getenv(name);
	return v && *v ? strtol(v, NULL, 10) : def;
}

// cs_fail records why a call failed (cudnnGetLastErrorString) and returns st.
static int cs_fail(int st, const char* fmt, ...) {
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(cs_last, sizeof cs_last, fmt, ap);
	va_end(ap);
	return st;
}

// ---- descriptors ----

typedef struct {
	int name, type;
	int64_t n;
	unsigned char* v;  // n elements of the type's size
} cs_attr;

typedef struct cs_desc {
	int id, type, live, finalized;
	int nattr;
	cs_attr attrs[32];
	int from_heur;      // an engine configuration the heuristics returned (its engine index + 1)
	struct cs_desc* graph;  // a plan's operation graph, a configuration's
} cs_desc;

static cs_desc** cs_descs;
static int cs_ndescs, cs_capdescs;

struct cudnnContext {
	int id, live;
	void* stream;
};
static struct cudnnContext* cs_handles[64];
static int cs_nhandles;

static int cs_plan_fails = -1;

static int cs_valid(const void* p) {
	for (int i = 0; i < cs_ndescs; i++)
		if (cs_descs[i] == p) return cs_descs[i]->live;
	return 0;
}

static int cs_handle_valid(const void* p) {
	for (int i = 0; i < cs_nhandles; i++)
		if (cs_handles[i] == p) return cs_handles[i]->live;
	return 0;
}

static const char* cs_type_name(int t) {
	switch (t) {
	case CUDNN_BACKEND_POINTWISE_DESCRIPTOR: return "POINTWISE";
	case CUDNN_BACKEND_ENGINE_DESCRIPTOR: return "ENGINE";
	case CUDNN_BACKEND_ENGINECFG_DESCRIPTOR: return "ENGINECFG";
	case CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR: return "ENGINEHEUR";
	case CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR: return "EXECUTION_PLAN";
	case CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR: return "OPERATION_POINTWISE";
	case CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR: return "OPERATIONGRAPH";
	case CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR: return "VARIANT_PACK";
	case CUDNN_BACKEND_TENSOR_DESCRIPTOR: return "TENSOR";
	case CUDNN_BACKEND_MATMUL_DESCRIPTOR: return "MATMUL";
	case CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR: return "OPERATION_MATMUL";
	case CUDNN_BACKEND_REDUCTION_DESCRIPTOR: return "REDUCTION";
	case CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR: return "OPERATION_REDUCTION";
	case CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR: return "OPERATION_RESHAPE";
	}
	return NULL;
}

static int cs_is_op(int t) {
	return t == CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR || t == CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR ||
	       t == CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR || t == CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR;
}

// ---- the attributes this stub knows: their type, the descriptor they belong to, and for a
// descriptor attribute the type of descriptor it names (-1: any operation) ----

typedef struct {
	int name, type, desc, target;
} cs_rule;

#define BD CUDNN_TYPE_BACKEND_DESCRIPTOR
static const cs_rule cs_rules[] = {
	{CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, CUDNN_BACKEND_POINTWISE_DESCRIPTOR, 0},
	{CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, CUDNN_BACKEND_POINTWISE_DESCRIPTOR, 0},
	{CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, CUDNN_BACKEND_POINTWISE_DESCRIPTOR, 0},
	{CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, 0},
	{CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, BD, CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR},
	{CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, 0},
	{CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, BD, CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, CUDNN_BACKEND_ENGINECFG_DESCRIPTOR},
	{CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, BD, CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, CUDNN_BACKEND_POINTWISE_DESCRIPTOR},
	{CUDNN_ATTR_OPERATION_POINTWISE_XDESC, BD, CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, CUDNN_BACKEND_TENSOR_DESCRIPTOR},
	{CUDNN_ATTR_OPERATION_POINTWISE_BDESC, BD, CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, CUDNN_BACKEND_TENSOR_DESCRIPTOR},
	{CUDNN_ATTR_OPERATION_POINTWISE_YDESC, BD, CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, CUDNN_BACKEND_TENSOR_DESCRIPTOR},
	{CUDNN_ATTR_OPERATION_POINTWISE_TDESC, BD, CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, CUDNN_BACKEND_TENSOR_DESCRIPTOR},
	{CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1, CUDNN_TYPE_FLOAT, CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, 0},
	{CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2, CUDNN_TYPE_FLOAT, CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, 0},
	{CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, 0},
	{CUDNN_ATTR_OPERATIONGRAPH_OPS, BD, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, -1},
	{CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, CUDNN_BACKEND_TENSOR_DESCRIPTOR, 0},
	{CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, CUDNN_BACKEND_TENSOR_DESCRIPTOR, 0},
	{CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, CUDNN_BACKEND_TENSOR_DESCRIPTOR, 0},
	{CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, CUDNN_BACKEND_TENSOR_DESCRIPTOR, 0},
	{CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, CUDNN_BACKEND_TENSOR_DESCRIPTOR, 0},
	{CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, CUDNN_BACKEND_TENSOR_DESCRIPTOR, 0},
	{CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, CUDNN_BACKEND_TENSOR_DESCRIPTOR, 0},
	{CUDNN_ATTR_TENSOR_RAGGED_OFFSET_DESC, BD, CUDNN_BACKEND_TENSOR_DESCRIPTOR, CUDNN_BACKEND_TENSOR_DESCRIPTOR},
	{CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, 0},
	{CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, 0},
	{CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, 0},
	{CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, CUDNN_BACKEND_MATMUL_DESCRIPTOR, 0},
	{CUDNN_ATTR_OPERATION_MATMUL_ADESC, BD, CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, CUDNN_BACKEND_TENSOR_DESCRIPTOR},
	{CUDNN_ATTR_OPERATION_MATMUL_BDESC, BD, CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, CUDNN_BACKEND_TENSOR_DESCRIPTOR},
	{CUDNN_ATTR_OPERATION_MATMUL_CDESC, BD, CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, CUDNN_BACKEND_TENSOR_DESCRIPTOR},
	{CUDNN_ATTR_OPERATION_MATMUL_DESC, BD, CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, CUDNN_BACKEND_MATMUL_DESCRIPTOR},
	{CUDNN_ATTR_OPERATION_MATMUL_GEMM_M_OVERRIDE_DESC, BD, CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, CUDNN_BACKEND_TENSOR_DESCRIPTOR},
	{CUDNN_ATTR_OPERATION_MATMUL_GEMM_N_OVERRIDE_DESC, BD, CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, CUDNN_BACKEND_TENSOR_DESCRIPTOR},
	{CUDNN_ATTR_OPERATION_MATMUL_GEMM_K_OVERRIDE_DESC, BD, CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, CUDNN_BACKEND_TENSOR_DESCRIPTOR},
	{CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, CUDNN_BACKEND_REDUCTION_DESCRIPTOR, 0},
	{CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, CUDNN_BACKEND_REDUCTION_DESCRIPTOR, 0},
	{CUDNN_ATTR_OPERATION_REDUCTION_XDESC, BD, CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, CUDNN_BACKEND_TENSOR_DESCRIPTOR},
	{CUDNN_ATTR_OPERATION_REDUCTION_YDESC, BD, CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, CUDNN_BACKEND_TENSOR_DESCRIPTOR},
	{CUDNN_ATTR_OPERATION_REDUCTION_DESC, BD, CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, CUDNN_BACKEND_REDUCTION_DESCRIPTOR},
	{CUDNN_ATTR_OPERATION_RESHAPE_XDESC, BD, CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR, CUDNN_BACKEND_TENSOR_DESCRIPTOR},
	{CUDNN_ATTR_OPERATION_RESHAPE_YDESC, BD, CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR, CUDNN_BACKEND_TENSOR_DESCRIPTOR},
};

static const cs_rule* cs_rule_of(int name) {
	for (size_t i = 0; i < sizeof cs_rules / sizeof cs_rules[0]; i++)
		if (cs_rules[i].name == name) return &cs_rules[i];
	return NULL;
}

static size_t cs_elem_size(int type) {
	switch (type) {
	case CUDNN_TYPE_BOOLEAN: return 1;  // a C++ bool
	case CUDNN_TYPE_INT64:
	case CUDNN_TYPE_VOID_PTR:
	case CUDNN_TYPE_HANDLE:
	case BD: return 8;
	}
	return 4;
}

static cs_attr* cs_get(cs_desc* d, int name) {
	for (int i = 0; i < d->nattr; i++)
		if (d->attrs[i].name == name) return &d->attrs[i];
	return NULL;
}

static int64_t* cs_i64(cs_desc* d, int name, int64_t* n) {
	cs_attr* a = cs_get(d, name);
	if (n) *n = a ? a->n : 0;
	return a ? (int64_t*)a->v : NULL;
}

static int cs_int(cs_desc* d, int name, int def) {
	cs_attr* a = cs_get(d, name);
	return a && a->n > 0 ? *(int*)a->v : def;
}

static cs_desc* cs_ref(cs_desc* d, int name) {
	cs_attr* a = cs_get(d, name);
	return a && a->n > 0 ? *(cs_desc**)a->v : NULL;
}

static int cs_bool(cs_desc* d, int name) {
	cs_attr* a = cs_get(d, name);
	return a && a->n > 0 && a->v[0];
}

static const char* cs_name(const void* p) {
	static __thread char bufs[16][32];
	static __thread int next;
	char* b = bufs[next++ % 16];
	if (p == NULL) return "null";
	for (int i = 0; i < cs_ndescs; i++)
		if (cs_descs[i] == p) {
			snprintf(b, 32, "d%d", cs_descs[i]->id);
			return b;
		}
	for (int i = 0; i < cs_nhandles; i++)
		if (cs_handles[i] == p) {
			snprintf(b, 32, "h%d", cs_handles[i]->id);
			return b;
		}
	snprintf(b, 32, "%p", p);
	return b;
}

#define LOCK pthread_mutex_lock(&cs_mu)
// RET logs the call on one line (its key=value pairs, cur=, and result= and why= when it
// failed) and returns st.
#define RET(st, call, ...)                                                                      \
	do {                                                                                        \
		int st_ = (st);                                                                         \
		char a_[6144], cur_[32] = "-";                                                          \
		snprintf(a_, sizeof a_, __VA_ARGS__);                                                   \
		if (cs_cur) snprintf(cur_, sizeof cur_, "%p", cs_cur);                                  \
		if (st_ != 0)                                                                           \
			cs_log("%s %s cur=%s result=%d why=%s", call, a_, cur_, st_, cs_last);              \
		else                                                                                    \
			cs_log("%s %s cur=%s", call, a_, cur_);                                             \
		pthread_mutex_unlock(&cs_mu);                                                           \
		return st_;                                                                             \
	} while (0)

// ---- entry points ----

CUresult cuCtxSetCurrent(CUcontext ctx) {
	cs_cur = ctx;
	LOCK;
	cs_log("cuCtxSetCurrent ctx=%p", (void*)ctx);
	pthread_mutex_unlock(&cs_mu);
	return CUDA_SUCCESS;
}

size_t cudnnGetVersion(void) { return (size_t)cs_env("CUDNNSTUB_VERSION", 91002); }

size_t cudnnGetCudartVersion(void) { return (size_t)cs_env("CUDNNSTUB_CUDART", 13000); }

const char* cudnnGetErrorString(cudnnStatus_t status) {
	switch (status) {
	case 0: return "CUDNN_STATUS_SUCCESS";
	case ST_BAD_PARAM: return "CUDNN_STATUS_BAD_PARAM";
	case ST_NULL_POINTER: return "CUDNN_STATUS_BAD_PARAM_NULL_POINTER";
	case ST_NOT_FINALIZED: return "CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED";
	case ST_OUT_OF_BOUND: return "CUDNN_STATUS_BAD_PARAM_OUT_OF_BOUND";
	case ST_SHAPE_MISMATCH: return "CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH";
	case ST_DUPLICATED: return "CUDNN_STATUS_BAD_PARAM_DUPLICATED_ENTRIES";
	case ST_ATTRIBUTE_TYPE: return "CUDNN_STATUS_BAD_PARAM_ATTRIBUTE_TYPE";
	case ST_DESCRIPTOR_TYPE: return "CUDNN_STATUS_BAD_PARAM_DESCRIPTOR_TYPE";
	case ST_NOT_INITIALIZED: return "CUDNN_STATUS_NOT_INITIALIZED";
	case ST_GRAPH_PATTERN: return "CUDNN_STATUS_NOT_SUPPORTED_GRAPH_PATTERN";
	case ST_MISALIGNED: return "CUDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER";
	case ST_NOT_SUPPORTED: return "CUDNN_STATUS_NOT_SUPPORTED";
	case ST_SHAPE: return "CUDNN_STATUS_NOT_SUPPORTED_SHAPE";
	case ST_PREREQUISITE: return "CUDNN_STATUS_NOT_SUPPORTED_RUNTIME_PREREQUISITE_MISSING";
	case ST_COMPILATION: return "CUDNN_STATUS_INTERNAL_ERROR_COMPILATION_FAILED";
	}
	return "CUDNN_STATUS_UNKNOWN (stub)";
}

void cudnnGetLastErrorString(char* message, size_t max_size) {
	if (max_size == 0) return;
	snprintf(message, max_size, "%s", cs_last);
	cs_last[0] = 0;
}

cudnnStatus_t cudnnCreate(cudnnHandle_t* handle) {
	LOCK;
	cs_last[0] = 0;
	if (handle == NULL) RET(cs_fail(ST_NULL_POINTER, "handle is NULL"), "cudnnCreate", "handle=null");
	if (cs_cur == NULL) RET(cs_fail(ST_NOT_INITIALIZED, "no CUDA context current"), "cudnnCreate", "handle=-");
	if (cs_nhandles == 64) RET(cs_fail(ST_BAD_PARAM, "too many handles"), "cudnnCreate", "handle=-");
	struct cudnnContext* h = calloc(1, sizeof *h);
	h->id = cs_nhandles + 1;
	h->live = 1;
	cs_handles[cs_nhandles++] = h;
	*handle = h;
	RET(0, "cudnnCreate", "handle=%s", cs_name(h));
}

cudnnStatus_t cudnnDestroy(cudnnHandle_t handle) {
	LOCK;
	cs_last[0] = 0;
	if (!cs_handle_valid(handle)) RET(cs_fail(ST_BAD_PARAM, "not a live handle"), "cudnnDestroy", "handle=%s", cs_name(handle));
	handle->live = 0;
	RET(0, "cudnnDestroy", "handle=%s", cs_name(handle));
}

cudnnStatus_t cudnnSetStream(cudnnHandle_t handle, cudaStream_t streamId) {
	LOCK;
	cs_last[0] = 0;
	if (!cs_handle_valid(handle)) RET(cs_fail(ST_BAD_PARAM, "not a live handle"), "cudnnSetStream", "handle=%s", cs_name(handle));
	handle->stream = (void*)streamId;
	RET(0, "cudnnSetStream", "handle=%s stream=%p", cs_name(handle), (void*)streamId);
}

cudnnStatus_t cudnnBackendCreateDescriptor(cudnnBackendDescriptorType_t descriptorType, cudnnBackendDescriptor_t* descriptor) {
	LOCK;
	cs_last[0] = 0;
	if (descriptor == NULL) RET(cs_fail(ST_NULL_POINTER, "descriptor is NULL"), "cudnnBackendCreateDescriptor", "type=%d", descriptorType);
	if (cs_type_name(descriptorType) == NULL)
		RET(cs_fail(ST_BAD_PARAM, "descriptor type %d unknown to the stub", descriptorType), "cudnnBackendCreateDescriptor", "type=%d", descriptorType);
	cs_desc* d = calloc(1, sizeof *d);
	d->id = cs_ndescs + 1;
	d->type = descriptorType;
	d->live = 1;
	if (cs_ndescs == cs_capdescs) {
		cs_capdescs = cs_capdescs ? 2 * cs_capdescs : 256;
		cs_descs = realloc(cs_descs, cs_capdescs * sizeof *cs_descs);
	}
	cs_descs[cs_ndescs++] = d;
	*descriptor = d;
	RET(0, "cudnnBackendCreateDescriptor", "type=%s desc=%s", cs_type_name(descriptorType), cs_name(d));
}

cudnnStatus_t cudnnBackendDestroyDescriptor(cudnnBackendDescriptor_t descriptor) {
	LOCK;
	cs_last[0] = 0;
	if (!cs_valid(descriptor)) RET(cs_fail(ST_BAD_PARAM, "not a live descriptor"), "cudnnBackendDestroyDescriptor", "desc=%s", cs_name(descriptor));
	cs_desc* d = descriptor;
	d->live = 0;
	RET(0, "cudnnBackendDestroyDescriptor", "desc=%s type=%s", cs_name(d), cs_type_name(d->type));
}

// cs_values writes an attribute's values for the log.
static void cs_values(char* b, size_t n, int type, int64_t count, const void* v) {
	size_t at = 0;
	b[0] = 0;
	for (int64_t i = 0; i < count && at + 40 < n; i++) {
		const char* sep = i ? "," : "";
		switch (type) {
		case CUDNN_TYPE_INT64: at += snprintf(b + at, n - at, "%s%lld", sep, (long long)((const int64_t*)v)[i]); break;
		case CUDNN_TYPE_FLOAT: at += snprintf(b + at, n - at, "%s%.9g", sep, ((const float*)v)[i]); break;
		case CUDNN_TYPE_BOOLEAN: at += snprintf(b + at, n - at, "%s%d", sep, ((const unsigned char*)v)[i]); break;
		case CUDNN_TYPE_VOID_PTR: at += snprintf(b + at, n - at, "%s%p", sep, ((void* const*)v)[i]); break;
		case CUDNN_TYPE_HANDLE:
		case BD: at += snprintf(b + at, n - at, "%s%s", sep, cs_name(((void* const*)v)[i])); break;
		default: at += snprintf(b + at, n - at, "%s%d", sep, ((const int*)v)[i]); break;
		}
	}
}

cudnnStatus_t cudnnBackendSetAttribute(cudnnBackendDescriptor_t descriptor, cudnnBackendAttributeName_t attributeName,
                                       cudnnBackendAttributeType_t attributeType, int64_t elementCount,
                                       const void* arrayOfElements) {
	LOCK;
	cs_last[0] = 0;
	char vals[4096] = "";
	if (!cs_valid(descriptor))
		RET(cs_fail(ST_BAD_PARAM, "not a live descriptor"), "cudnnBackendSetAttribute", "desc=%s attr=%d", cs_name(descriptor), attributeName);
	cs_desc* d = descriptor;
	if (elementCount > 0 && arrayOfElements == NULL)
		RET(cs_fail(ST_NULL_POINTER, "no elements"), "cudnnBackendSetAttribute", "desc=%s attr=%d", cs_name(d), attributeName);
	cs_values(vals, sizeof vals, attributeType, elementCount, arrayOfElements);
#define SETLOG "desc=%s type=%s attr=%d atype=%d n=%lld v=%s", cs_name(d), cs_type_name(d->type), attributeName, attributeType, (long long)elementCount, vals
	const cs_rule* r = cs_rule_of(attributeName);
	if (d->finalized) RET(cs_fail(ST_BAD_PARAM, "descriptor already finalized"), "cudnnBackendSetAttribute", SETLOG);
	if (r == NULL || r->desc != d->type)
		RET(cs_fail(ST_BAD_PARAM, "attribute %d does not belong to a %s descriptor", attributeName, cs_type_name(d->type)),
		    "cudnnBackendSetAttribute", SETLOG);
	if (r->type != attributeType)
		RET(cs_fail(ST_ATTRIBUTE_TYPE, "attribute %d takes type %d, not %d", attributeName, r->type, attributeType),
		    "cudnnBackendSetAttribute", SETLOG);
	if (elementCount < 1 || elementCount > 64)
		RET(cs_fail(ST_OUT_OF_BOUND, "%lld elements", (long long)elementCount), "cudnnBackendSetAttribute", SETLOG);
	if (r->type == BD) {
		for (int64_t i = 0; i < elementCount; i++) {
			cs_desc* t = ((cs_desc* const*)arrayOfElements)[i];
			if (!cs_valid(t)) RET(cs_fail(ST_BAD_PARAM, "element %lld is not a live descriptor", (long long)i), "cudnnBackendSetAttribute", SETLOG);
			if ((r->target >= 0 && t->type != r->target) || (r->target < 0 && !cs_is_op(t->type)))
				RET(cs_fail(ST_DESCRIPTOR_TYPE, "element %lld is a %s descriptor", (long long)i, cs_type_name(t->type)),
				    "cudnnBackendSetAttribute", SETLOG);
			if (!t->finalized && t->type != CUDNN_BACKEND_ENGINECFG_DESCRIPTOR)
				RET(cs_fail(ST_NOT_FINALIZED, "element %lld (%s) is not finalized", (long long)i, cs_name(t)), "cudnnBackendSetAttribute", SETLOG);
		}
	}
	if (r->type == CUDNN_TYPE_HANDLE && !cs_handle_valid(*(void* const*)arrayOfElements))
		RET(cs_fail(ST_BAD_PARAM, "not a live handle"), "cudnnBackendSetAttribute", SETLOG);
	cs_attr* a = cs_get(d, attributeName);
	if (a == NULL) {
		if (d->nattr == 32) RET(cs_fail(ST_BAD_PARAM, "too many attributes"), "cudnnBackendSetAttribute", SETLOG);
		a = &d->attrs[d->nattr++];
	} else {
		free(a->v);
	}
	a->name = attributeName;
	a->type = attributeType;
	a->n = elementCount;
	a->v = malloc(elementCount * cs_elem_size(attributeType));
	memcpy(a->v, arrayOfElements, elementCount * cs_elem_size(attributeType));
	RET(0, "cudnnBackendSetAttribute", SETLOG);
}

// ---- finalisation checks ----

static int cs_rank(cs_desc* t, int64_t** dims) {
	int64_t n;
	*dims = cs_i64(t, CUDNN_ATTR_TENSOR_DIMENSIONS, &n);
	return (int)n;
}

static int64_t cs_count(cs_desc* t) {
	int64_t* d;
	int n = cs_rank(t, &d);
	int64_t c = 1;
	for (int i = 0; i < n; i++) c *= d[i];
	return c;
}

// cs_broadcasts reports whether tensor b broadcasts to y: same rank, each extent equal or 1.
static int cs_broadcasts(cs_desc* b, cs_desc* y) {
	int64_t *db, *dy;
	int nb = cs_rank(b, &db), ny = cs_rank(y, &dy);
	if (nb != ny) return 0;
	for (int i = 0; i < nb; i++)
		if (db[i] != dy[i] && db[i] != 1) return 0;
	return 1;
}

static int cs_same_shape(cs_desc* a, cs_desc* b) {
	int64_t *da, *db;
	int na = cs_rank(a, &da), nb = cs_rank(b, &db);
	if (na != nb) return 0;
	for (int i = 0; i < na; i++)
		if (da[i] != db[i]) return 0;
	return 1;
}

static int cs_pw_inputs(int mode) {
	switch (mode) {
	case CUDNN_POINTWISE_EXP:
	case CUDNN_POINTWISE_LOG:
	case CUDNN_POINTWISE_IDENTITY:
	case CUDNN_POINTWISE_GEN_INDEX: return 1;
	case CUDNN_POINTWISE_BINARY_SELECT: return 3;
	}
	return 2;
}

#define NEED(d, attr) \
	if (cs_get(d, attr) == NULL) return cs_fail(ST_BAD_PARAM, "%s %s: attribute %d not set", cs_type_name(d->type), cs_name(d), attr)

static int cs_check(cs_desc* d);

// cs_op_tensors collects the tensors an operation touches into ts, what it reads first and what it
// writes last, and returns their number (0 for an operation of another kind).
static int cs_op_tensors(cs_desc* op, cs_desc** ts) {
	int n = 0;
	switch (op->type) {
	case CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR: {
		int names[] = {CUDNN_ATTR_OPERATION_POINTWISE_XDESC, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, CUDNN_ATTR_OPERATION_POINTWISE_TDESC};
		for (int i = 0; i < 3; i++)
			if (cs_ref(op, names[i])) ts[n++] = cs_ref(op, names[i]);
		ts[n++] = cs_ref(op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC);
		break;
	}
	case CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR: {
		int names[] = {CUDNN_ATTR_OPERATION_MATMUL_ADESC, CUDNN_ATTR_OPERATION_MATMUL_BDESC, CUDNN_ATTR_OPERATION_MATMUL_GEMM_M_OVERRIDE_DESC,
		               CUDNN_ATTR_OPERATION_MATMUL_GEMM_N_OVERRIDE_DESC, CUDNN_ATTR_OPERATION_MATMUL_GEMM_K_OVERRIDE_DESC};
		for (int i = 0; i < 5; i++)
			if (cs_ref(op, names[i])) ts[n++] = cs_ref(op, names[i]);
		ts[n++] = cs_ref(op, CUDNN_ATTR_OPERATION_MATMUL_CDESC);
		break;
	}
	case CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR:
		ts[n++] = cs_ref(op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC);
		ts[n++] = cs_ref(op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC);
		break;
	case CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR:
		ts[n++] = cs_ref(op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC);
		ts[n++] = cs_ref(op, CUDNN_ATTR_OPERATION_RESHAPE_YDESC);
		break;
	}
	return n;
}

// cs_graph_ops returns an operation graph's operations.
static cs_desc** cs_graph_ops(cs_desc* g, int64_t* n) {
	cs_attr* a = cs_get(g, CUDNN_ATTR_OPERATIONGRAPH_OPS);
	*n = a->n;
	return (cs_desc**)a->v;
}

static int64_t cs_uid(cs_desc* t) { return *cs_i64(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, NULL); }

static void cs_dump_list(char* b, size_t n, const int64_t* v, int64_t count) {
	size_t at = 0;
	b[0] = 0;
	for (int64_t i = 0; i < count && at + 24 < n; i++) at += snprintf(b + at, n - at, "%s%lld", i ? "," : "", (long long)v[i]);
}

// cs_dump_graph writes an operation graph's tensors and operations to the log.
static void cs_dump_graph(cs_desc* g) {
	int64_t nops;
	cs_desc** ops = cs_graph_ops(g, &nops);
	cs_desc* seen[1024];
	int nseen = 0;
	cs_log("graph desc=%s ops=%lld", cs_name(g), (long long)nops);
	for (int64_t i = 0; i < nops; i++) {
		cs_desc* ts[8];
		int nts = cs_op_tensors(ops[i], ts);
		for (int k = 0; k < nts; k++) {
			cs_desc* t = ts[k];
			cs_desc* r = cs_ref(t, CUDNN_ATTR_TENSOR_RAGGED_OFFSET_DESC);
			for (int pass = 0; pass < 2; pass++) {
				cs_desc* x = pass == 0 ? r : t;
				if (x == NULL) continue;
				int dup = 0;
				for (int s = 0; s < nseen; s++) dup |= seen[s] == x;
				if (dup || nseen == 1024) continue;
				seen[nseen++] = x;
				int64_t nd, ns;
				int64_t* dims = cs_i64(x, CUDNN_ATTR_TENSOR_DIMENSIONS, &nd);
				int64_t* str = cs_i64(x, CUDNN_ATTR_TENSOR_STRIDES, &ns);
				char db[256], sb[256];
				cs_dump_list(db, sizeof db, dims, nd);
				cs_dump_list(sb, sizeof sb, str, ns);
				cs_desc* xr = cs_ref(x, CUDNN_ATTR_TENSOR_RAGGED_OFFSET_DESC);
				char rb[32] = "-";
				if (xr) snprintf(rb, sizeof rb, "%lld", (long long)cs_uid(xr));
				cs_log("tensor uid=%lld dtype=%d dims=%s strides=%s virtual=%d byvalue=%d ragged=%s align=%lld", (long long)cs_uid(x),
				       cs_int(x, CUDNN_ATTR_TENSOR_DATA_TYPE, -1), db, sb, cs_bool(x, CUDNN_ATTR_TENSOR_IS_VIRTUAL),
				       cs_bool(x, CUDNN_ATTR_TENSOR_IS_BY_VALUE), rb, (long long)*cs_i64(x, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, NULL));
			}
		}
	}
	for (int64_t i = 0; i < nops; i++) {
		cs_desc* op = ops[i];
		cs_desc* in[8];
		int nin = cs_op_tensors(op, in) - 1;
		cs_desc* out = in[nin];
		char ib[256] = "";
		size_t at = 0;
		for (int k = 0; k < nin; k++) at += snprintf(ib + at, sizeof ib - at, "%s%lld", k ? "," : "", (long long)cs_uid(in[k]));
		switch (op->type) {
		case CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR: {
			cs_desc* pw = cs_ref(op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR);
			int64_t na;
			int64_t* axis = cs_i64(pw, CUDNN_ATTR_POINTWISE_AXIS, &na);
			char ab[32] = "-";
			if (axis) snprintf(ab, sizeof ab, "%lld", (long long)axis[0]);
			cs_log("op i=%lld kind=POINTWISE mode=%d prec=%d axis=%s in=%s out=%lld", (long long)i, cs_int(pw, CUDNN_ATTR_POINTWISE_MODE, -1),
			       cs_int(pw, CUDNN_ATTR_POINTWISE_MATH_PREC, -1), ab, ib, (long long)cs_uid(out));
			break;
		}
		case CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR: {
			cs_desc* mm = cs_ref(op, CUDNN_ATTR_OPERATION_MATMUL_DESC);
			char ov[3][32];
			int names[] = {CUDNN_ATTR_OPERATION_MATMUL_GEMM_M_OVERRIDE_DESC, CUDNN_ATTR_OPERATION_MATMUL_GEMM_N_OVERRIDE_DESC,
			               CUDNN_ATTR_OPERATION_MATMUL_GEMM_K_OVERRIDE_DESC};
			for (int k = 0; k < 3; k++) {
				cs_desc* t = cs_ref(op, names[k]);
				if (t) snprintf(ov[k], 32, "%lld", (long long)cs_uid(t));
				else snprintf(ov[k], 32, "-");
			}
			cs_log("op i=%lld kind=MATMUL prec=%d a=%lld b=%lld out=%lld m=%s n=%s k=%s", (long long)i, cs_int(mm, CUDNN_ATTR_MATMUL_COMP_TYPE, -1),
			       (long long)cs_uid(cs_ref(op, CUDNN_ATTR_OPERATION_MATMUL_ADESC)), (long long)cs_uid(cs_ref(op, CUDNN_ATTR_OPERATION_MATMUL_BDESC)),
			       (long long)cs_uid(out), ov[0], ov[1], ov[2]);
			break;
		}
		case CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR: {
			cs_desc* r = cs_ref(op, CUDNN_ATTR_OPERATION_REDUCTION_DESC);
			cs_log("op i=%lld kind=REDUCTION mode=%d prec=%d in=%s out=%lld", (long long)i, cs_int(r, CUDNN_ATTR_REDUCTION_OPERATOR, -1),
			       cs_int(r, CUDNN_ATTR_REDUCTION_COMP_TYPE, -1), ib, (long long)cs_uid(out));
			break;
		}
		case CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR:
			cs_log("op i=%lld kind=RESHAPE in=%s out=%lld", (long long)i, ib, (long long)cs_uid(out));
			break;
		}
	}
}

// cs_check_graph checks an operation graph: unique ids, every virtual tensor made by exactly
// one operation and read by another, no tensor written twice, by-value tensors only read.
static int cs_check_graph(cs_desc* g) {
	int64_t nops;
	cs_desc** ops = cs_graph_ops(g, &nops);
	cs_desc* ts[1024];
	int writes[1024], reads[1024], nts = 0;
	for (int64_t i = 0; i < nops; i++) {
		cs_desc* opts[8];
		int n = cs_op_tensors(ops[i], opts);
		if (n == 0) return cs_fail(ST_BAD_PARAM, "operation %lld is a %s, not an operation", (long long)i, cs_type_name(ops[i]->type));
		for (int k = 0; k < n; k++) {
			cs_desc* t = opts[k];
			int at = -1;
			for (int s = 0; s < nts; s++)
				if (ts[s] == t) at = s;
			if (at < 0) {
				if (nts == 1024) return cs_fail(ST_BAD_PARAM, "too many tensors");
				for (int s = 0; s < nts; s++)
					if (cs_uid(ts[s]) == cs_uid(t))
						return cs_fail(ST_DUPLICATED, "two tensors with unique id %lld", (long long)cs_uid(t));
				at = nts++;
				ts[at] = t;
				writes[at] = reads[at] = 0;
			}
			if (k < n - 1) reads[at]++;
			else writes[at]++;
		}
	}
	for (int s = 0; s < nts; s++) {
		cs_desc* t = ts[s];
		long long uid = (long long)cs_uid(t);
		if (writes[s] > 1) return cs_fail(ST_BAD_PARAM, "tensor %lld written by %d operations", uid, writes[s]);
		if (cs_bool(t, CUDNN_ATTR_TENSOR_IS_VIRTUAL) && (writes[s] != 1 || reads[s] == 0))
			return cs_fail(ST_BAD_PARAM, "virtual tensor %lld written %d times and read %d times", uid, writes[s], reads[s]);
		if (cs_bool(t, CUDNN_ATTR_TENSOR_IS_BY_VALUE) && writes[s] > 0)
			return cs_fail(ST_BAD_PARAM, "by-value tensor %lld is written", uid);
		cs_desc* r = cs_ref(t, CUDNN_ATTR_TENSOR_RAGGED_OFFSET_DESC);
		if (r) {
			int dt = cs_int(r, CUDNN_ATTR_TENSOR_DATA_TYPE, -1);
			if (cs_bool(r, CUDNN_ATTR_TENSOR_IS_VIRTUAL) || (dt != CUDNN_DATA_INT32 && dt != CUDNN_DATA_INT64))
				return cs_fail(ST_BAD_PARAM, "tensor %lld: ragged offset %lld not a non-virtual int32/int64 tensor", uid, (long long)cs_uid(r));
		}
	}
	return 0;
}

// ---- what only a GPU's cuDNN would know: NVRTC, the support table, the workspace ----

// cs_nvrtc checks what cuDNN's runtime-compiled engines need at plan finalisation: NVRTC in the
// global namespace and, as NVRTC opens it by this name, its builtins already loaded.
static int cs_nvrtc(void) {
	int (*ver)(int*, int*) = (int (*)(int*, int*))dlsym(RTLD_DEFAULT, "nvrtcVersion");
	if (ver == NULL)
		return cs_fail(ST_PREREQUISITE, "stub: NVRTC (nvrtcVersion) does not resolve in the global namespace: libnvrtc.so.%ld is not loaded with RTLD_GLOBAL",
		               cs_env("CUDNNSTUB_CUDART", 13000) / 1000);
	int major = 0, minor = 0;
	ver(&major, &minor);
	char name[64];
	snprintf(name, sizeof name, "libnvrtc-builtins.so.%d.%d", major, minor);
	void* b = dlopen(name, RTLD_NOW | RTLD_NOLOAD);
	if (b == NULL) return cs_fail(ST_COMPILATION, "stub: NVRTC %d.%d cannot open %s", major, minor, name);
	dlclose(b);
	return 0;
}

// cs_unit_extent is the extent of a tensor's unit-stride dimension among the last two (the head
// dimension of Q, K, V, O and their gradients, transposed or not), 0 when neither has stride 1.
static int64_t cs_unit_extent(cs_desc* t) {
	int64_t n, ns;
	int64_t* dims = cs_i64(t, CUDNN_ATTR_TENSOR_DIMENSIONS, &n);
	int64_t* str = cs_i64(t, CUDNN_ATTR_TENSOR_STRIDES, &ns);
	if (n != 4 || ns != 4) return 0;
	if (str[3] == 1) return dims[3];
	if (str[2] == 1) return dims[2];
	return 0;
}

// cs_check_head_dim refuses a graph whose non-virtual 16-bit tensors do not all have one head
// dimension: every SDPA graph distflash builds has d_qk = d_v.
static int cs_check_head_dim(cs_desc* g) {
	int64_t nops, d = 0;
	cs_desc** ops = cs_graph_ops(g, &nops);
	for (int64_t i = 0; i < nops; i++) {
		cs_desc* ts[8];
		int n = cs_op_tensors(ops[i], ts);
		for (int k = 0; k < n; k++) {
			cs_desc* t = ts[k];
			int dt = cs_int(t, CUDNN_ATTR_TENSOR_DATA_TYPE, -1);
			if (cs_bool(t, CUDNN_ATTR_TENSOR_IS_VIRTUAL) || (dt != CUDNN_DATA_HALF && dt != CUDNN_DATA_BFLOAT16)) continue;
			int64_t e = cs_unit_extent(t);
			if (d == 0) d = e;
			if (e != d)
				return cs_fail(ST_SHAPE, "stub: 16-bit tensors of head dimensions %lld and %lld (uid %lld): d_qk ≠ d_v", (long long)d,
				               (long long)e, (long long)cs_uid(t));
		}
	}
	return 0;
}

// cs_sdpa is what the support table asks of a graph, read from its structure.
typedef struct {
	int backward, deterministic, ragged, padding, causal, left, bottom_right, shifted;
	int64_t b, h, kvh, sq, skv, d;
} cs_sdpa;

// cs_pw_mode is the mode of a pointwise operation (-1 for other operations).
static int cs_pw_mode(cs_desc* op) {
	if (op->type != CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR) return -1;
	return cs_int(cs_ref(op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR), CUDNN_ATTR_POINTWISE_MODE, -1);
}

// cs_producer is the operation of ops that writes t.
static cs_desc* cs_producer(cs_desc** ops, int64_t nops, cs_desc* t) {
	for (int64_t i = 0; i < nops; i++) {
		cs_desc* ts[8];
		int n = cs_op_tensors(ops[i], ts);
		if (n > 0 && ts[n - 1] == t) return ops[i];
	}
	return NULL;
}

static void cs_read_sdpa(cs_desc* g, cs_sdpa* s) {
	memset(s, 0, sizeof *s);
	int64_t nops;
	cs_desc** ops = cs_graph_ops(g, &nops);
	int matmuls = 0, identity = 0;
	for (int64_t i = 0; i < nops; i++) {
		cs_desc* op = ops[i];
		cs_desc* ts[8];
		int n = cs_op_tensors(op, ts);
		cs_desc* out = ts[n - 1];
		for (int k = 0; k < n; k++) {
			cs_desc* t = ts[k];
			if (cs_ref(t, CUDNN_ATTR_TENSOR_RAGGED_OFFSET_DESC)) s->ragged = 1;
			int dt = cs_int(t, CUDNN_ATTR_TENSOR_DATA_TYPE, -1);
			if (!cs_bool(t, CUDNN_ATTR_TENSOR_IS_VIRTUAL) && (dt == CUDNN_DATA_HALF || dt == CUDNN_DATA_BFLOAT16) && s->d == 0)
				s->d = cs_unit_extent(t);
		}
		if (op->type == CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR) {
			if (matmuls == 0) { // Q·Kᵀ: the scores [B, H, SQ, SKV], and K's heads
				int64_t* dims;
				if (cs_rank(out, &dims) == 4) s->b = dims[0], s->h = dims[1], s->sq = dims[2], s->skv = dims[3];
				int64_t* kd;
				if (cs_rank(cs_ref(op, CUDNN_ATTR_OPERATION_MATMUL_BDESC), &kd) == 4) s->kvh = kd[1];
			}
			matmuls++;
		}
		switch (cs_pw_mode(op)) {
		case CUDNN_POINTWISE_IDENTITY: identity = 1; break;
		case CUDNN_POINTWISE_CMP_LT: s->padding = 1; break;
		case CUDNN_POINTWISE_CMP_GT: s->left = 1; break;
		case CUDNN_POINTWISE_CMP_GE: {
			s->causal = 1;
			// the row side of the right bound: GEN_INDEX, then bottom-right's ADD and SUB or a shift's ADD
			cs_desc* t = ts[0];
			int adds = 0, subs = 0;
			for (cs_desc* p = cs_producer(ops, nops, t); p && cs_pw_mode(p) != CUDNN_POINTWISE_GEN_INDEX; p = cs_producer(ops, nops, t)) {
				adds += cs_pw_mode(p) == CUDNN_POINTWISE_ADD;
				subs += cs_pw_mode(p) == CUDNN_POINTWISE_SUB;
				cs_desc* pts[8];
				cs_op_tensors(p, pts);
				t = pts[0];
			}
			s->bottom_right = subs > 0;
			s->shifted = adds > subs;
			break;
		}
		}
	}
	s->backward = matmuls >= 4;
	s->deterministic = s->backward && !identity;
}

// cs_workspace is what a plan of graph g asks for.
static int64_t cs_workspace(cs_desc* g) {
	cs_sdpa s;
	cs_read_sdpa(g, &s);
	if (s.deterministic && cs_env("CUDNNSTUB_SM", 90) / 10 == 9)
		return s.b * s.h * ((s.sq + 63) / 64 * 64) * ((s.skv + 63) / 64 * 64) * 2;
	return cs_env("CUDNNSTUB_WORKSPACE", 1 << 20);
}

#define REFUSE(cond, ...) \
	if (cond) return cs_fail(ST_NOT_SUPPORTED, "stub support table: " __VA_ARGS__)

// cs_support refuses a graph outside the support table of the cuDNN review (NVIDIA's support
// matrix as TransformerEngine reads it, and the known bug classes) for $CUDNNSTUB_VERSION on
// $CUDNNSTUB_SM.
static int cs_support(cs_desc* g) {
	cs_sdpa s;
	cs_read_sdpa(g, &s);
	long v = cs_env("CUDNNSTUB_VERSION", 91002), sm = cs_env("CUDNNSTUB_SM", 90);
	int hopper = sm / 10 == 9, ampere = sm / 10 == 8;
	REFUSE(v < 90000, "cuDNN before 9.0");
	REFUSE(v == 91000 || v == 91001, "cuDNN 9.10.0/9.10.1");
	REFUSE(s.d % 8 != 0 || s.d > 256, "head dimension %lld", (long long)s.d);
	REFUSE(sm < 80, "sm_%ld", sm);
	REFUSE(ampere && s.backward && s.d > 128, "Ampere backward, head dimension %lld", (long long)s.d);
	REFUSE(ampere && !s.backward && s.d > 128 && v < 91002, "Ampere forward, head dimension %lld, before 9.10.2", (long long)s.d);
	REFUSE(hopper && !s.backward && s.d > 128 && v < 90100, "Hopper forward, head dimension %lld, before 9.1", (long long)s.d);
	REFUSE(hopper && s.backward && s.d > 128 && v < 90500, "Hopper backward, head dimension %lld, before 9.5", (long long)s.d);
	REFUSE(sm >= 100 && s.d > 128 && (s.backward || v < 90900), "sm_%ld, head dimension %lld", sm, (long long)s.d);
	REFUSE(s.backward && s.sq == 1 && s.skv == 1, "backward of one row and one column");
	REFUSE(hopper && s.backward && s.sq == 1, "Hopper backward of one query row");
	REFUSE(hopper && s.backward && s.skv % 128 == 64 && v < 92600, "Hopper backward, s_kv %% 128 = 64, before 9.26");
	REFUSE(s.bottom_right && !s.padding && s.sq > s.skv, "bottom-right, s_q > s_kv");
	REFUSE(s.bottom_right && !s.padding && v < 90300, "bottom-right before 9.3");
	REFUSE(s.bottom_right && v < 90600 && (s.sq % 64 || s.skv % 64), "bottom-right, lengths not multiples of 64, before 9.6");
	REFUSE(s.shifted && v < 90600, "shifted diagonal before 9.6");
	REFUSE(s.shifted && s.sq > s.skv, "shifted diagonal, s_q > s_kv");
	REFUSE(s.left && v < 90200, "left bound before 9.2");
	REFUSE(s.left && !s.causal && v < 91002, "left bound without a right bound before 9.10.2");
	REFUSE(s.left && !s.padding && s.sq > s.skv, "sliding window, s_q > s_kv");
	REFUSE(s.left && s.bottom_right && v < 90600 && s.sq != s.skv, "bottom-right window, s_q ≠ s_kv, before 9.6");
	REFUSE(hopper && s.left && s.bottom_right && s.sq == s.skv && v < 91002, "Hopper bottom-right window before 9.10.2");
	REFUSE(s.ragged && v < 90100, "ragged before 9.1");
	REFUSE(s.ragged && ampere && v < 91801, "ragged on Ampere before 9.18.1");
	REFUSE(s.ragged && s.h != s.kvh && v < 90600, "ragged GQA before 9.6");
	REFUSE(s.ragged && s.bottom_right && v < 90600, "ragged bottom-right before 9.6");
	REFUSE(s.ragged && s.left && v < 90600, "ragged window before 9.6");
	REFUSE(hopper && s.ragged && s.backward && v < 91800, "Hopper ragged backward before 9.18");
	REFUSE(s.deterministic && sm >= 100, "deterministic backward on sm_%ld", sm);
	REFUSE(s.deterministic && s.ragged && ampere, "deterministic ragged backward on Ampere");
	return 0;
}

static int cs_check(cs_desc* d) {
	switch (d->type) {
	case CUDNN_BACKEND_TENSOR_DESCRIPTOR: {
		NEED(d, CUDNN_ATTR_TENSOR_DATA_TYPE);
		NEED(d, CUDNN_ATTR_TENSOR_DIMENSIONS);
		NEED(d, CUDNN_ATTR_TENSOR_STRIDES);
		NEED(d, CUDNN_ATTR_TENSOR_UNIQUE_ID);
		NEED(d, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT);
		int64_t nd, ns;
		int64_t* dims = cs_i64(d, CUDNN_ATTR_TENSOR_DIMENSIONS, &nd);
		cs_i64(d, CUDNN_ATTR_TENSOR_STRIDES, &ns);
		if (nd != ns || nd < 1 || nd > 8) return cs_fail(ST_BAD_PARAM, "tensor with %lld dimensions and %lld strides", (long long)nd, (long long)ns);
		for (int i = 0; i < nd; i++)
			if (dims[i] < 1) return cs_fail(ST_BAD_PARAM, "tensor dimension %d is %lld", i, (long long)dims[i]);
		if (cs_bool(d, CUDNN_ATTR_TENSOR_IS_VIRTUAL) && cs_bool(d, CUDNN_ATTR_TENSOR_IS_BY_VALUE))
			return cs_fail(ST_BAD_PARAM, "a tensor both virtual and by value");
		return 0;
	}
	case CUDNN_BACKEND_POINTWISE_DESCRIPTOR:
		NEED(d, CUDNN_ATTR_POINTWISE_MODE);
		NEED(d, CUDNN_ATTR_POINTWISE_MATH_PREC);
		if (cs_int(d, CUDNN_ATTR_POINTWISE_MODE, -1) == CUDNN_POINTWISE_GEN_INDEX) {
			NEED(d, CUDNN_ATTR_POINTWISE_AXIS);
		} else if (cs_get(d, CUDNN_ATTR_POINTWISE_AXIS))
			return cs_fail(ST_BAD_PARAM, "CUDNN_ATTR_POINTWISE_AXIS on pointwise mode %d: only GEN_INDEX has an axis (cudnn-frontend writes no other)",
			               cs_int(d, CUDNN_ATTR_POINTWISE_MODE, -1));
		return 0;
	case CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR: {
		NEED(d, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR);
		NEED(d, CUDNN_ATTR_OPERATION_POINTWISE_XDESC);
		NEED(d, CUDNN_ATTR_OPERATION_POINTWISE_YDESC);
		int mode = cs_int(cs_ref(d, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR), CUDNN_ATTR_POINTWISE_MODE, -1);
		int nin = 1 + (cs_get(d, CUDNN_ATTR_OPERATION_POINTWISE_BDESC) != NULL) + (cs_get(d, CUDNN_ATTR_OPERATION_POINTWISE_TDESC) != NULL);
		if (nin != cs_pw_inputs(mode)) return cs_fail(ST_BAD_PARAM, "pointwise mode %d with %d inputs", mode, nin);
		cs_desc* x = cs_ref(d, CUDNN_ATTR_OPERATION_POINTWISE_XDESC);
		cs_desc* y = cs_ref(d, CUDNN_ATTR_OPERATION_POINTWISE_YDESC);
		if (!cs_broadcasts(x, y)) return cs_fail(ST_SHAPE_MISMATCH, "pointwise X (uid %lld) does not broadcast to Y (uid %lld)", (long long)cs_uid(x), (long long)cs_uid(y));
		if (mode != CUDNN_POINTWISE_GEN_INDEX && !cs_same_shape(x, y) && !(nin > 1 && cs_same_shape(cs_ref(d, CUDNN_ATTR_OPERATION_POINTWISE_BDESC), y)))
			return cs_fail(ST_SHAPE_MISMATCH, "pointwise Y (uid %lld) has the shape of no input", (long long)cs_uid(y));
		int names[] = {CUDNN_ATTR_OPERATION_POINTWISE_BDESC, CUDNN_ATTR_OPERATION_POINTWISE_TDESC};
		for (int i = 0; i < 2; i++) {
			cs_desc* b = cs_ref(d, names[i]);
			if (b && !cs_broadcasts(b, y)) return cs_fail(ST_SHAPE_MISMATCH, "pointwise input uid %lld does not broadcast to Y (uid %lld)", (long long)cs_uid(b), (long long)cs_uid(y));
		}
		return 0;
	}
	case CUDNN_BACKEND_MATMUL_DESCRIPTOR:
		NEED(d, CUDNN_ATTR_MATMUL_COMP_TYPE);
		return 0;
	case CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR: {
		NEED(d, CUDNN_ATTR_OPERATION_MATMUL_ADESC);
		NEED(d, CUDNN_ATTR_OPERATION_MATMUL_BDESC);
		NEED(d, CUDNN_ATTR_OPERATION_MATMUL_CDESC);
		NEED(d, CUDNN_ATTR_OPERATION_MATMUL_DESC);
		int64_t *a, *b, *c;
		int na = cs_rank(cs_ref(d, CUDNN_ATTR_OPERATION_MATMUL_ADESC), &a);
		int nb = cs_rank(cs_ref(d, CUDNN_ATTR_OPERATION_MATMUL_BDESC), &b);
		int nc = cs_rank(cs_ref(d, CUDNN_ATTR_OPERATION_MATMUL_CDESC), &c);
		if (na != nb || na != nc || na < 3) return cs_fail(ST_SHAPE_MISMATCH, "matmul of ranks %d, %d, %d", na, nb, nc);
		int n = na;
		if (a[n - 2] != c[n - 2] || b[n - 1] != c[n - 1] || a[n - 1] != b[n - 2])
			return cs_fail(ST_SHAPE_MISMATCH, "matmul [%lld×%lld]·[%lld×%lld] into [%lld×%lld]", (long long)a[n - 2], (long long)a[n - 1],
			               (long long)b[n - 2], (long long)b[n - 1], (long long)c[n - 2], (long long)c[n - 1]);
		for (int i = 0; i < n - 2; i++)
			if ((a[i] != c[i] && a[i] != 1 && c[i] % a[i] != 0) || (b[i] != c[i] && b[i] != 1 && c[i] % b[i] != 0))
				return cs_fail(ST_SHAPE_MISMATCH, "matmul batch dimension %d: %lld, %lld into %lld", i, (long long)a[i], (long long)b[i], (long long)c[i]);
		return 0;
	}
	case CUDNN_BACKEND_REDUCTION_DESCRIPTOR:
		NEED(d, CUDNN_ATTR_REDUCTION_OPERATOR);
		NEED(d, CUDNN_ATTR_REDUCTION_COMP_TYPE);
		return 0;
	case CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR: {
		NEED(d, CUDNN_ATTR_OPERATION_REDUCTION_DESC);
		NEED(d, CUDNN_ATTR_OPERATION_REDUCTION_XDESC);
		NEED(d, CUDNN_ATTR_OPERATION_REDUCTION_YDESC);
		int64_t *x, *y;
		int nx = cs_rank(cs_ref(d, CUDNN_ATTR_OPERATION_REDUCTION_XDESC), &x);
		int ny = cs_rank(cs_ref(d, CUDNN_ATTR_OPERATION_REDUCTION_YDESC), &y);
		if (nx != ny) return cs_fail(ST_SHAPE_MISMATCH, "reduction of rank %d into rank %d", nx, ny);
		for (int i = 0; i < nx; i++)
			if (y[i] != x[i] && y[i] != 1 && !(x[i] % y[i] == 0 && i == 1))
				return cs_fail(ST_SHAPE_MISMATCH, "reduction dimension %d: %lld into %lld", i, (long long)x[i], (long long)y[i]);
		return 0;
	}
	case CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR:
		NEED(d, CUDNN_ATTR_OPERATION_RESHAPE_XDESC);
		NEED(d, CUDNN_ATTR_OPERATION_RESHAPE_YDESC);
		if (cs_count(cs_ref(d, CUDNN_ATTR_OPERATION_RESHAPE_XDESC)) != cs_count(cs_ref(d, CUDNN_ATTR_OPERATION_RESHAPE_YDESC)))
			return cs_fail(ST_SHAPE_MISMATCH, "reshape changes the element count");
		return 0;
	case CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR: {
		NEED(d, CUDNN_ATTR_OPERATIONGRAPH_HANDLE);
		NEED(d, CUDNN_ATTR_OPERATIONGRAPH_OPS);
		int st = cs_check_graph(d);
		if (st == 0) st = cs_check_head_dim(d);
		if (st == 0) cs_dump_graph(d);
		return st;
	}
	case CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR:
		NEED(d, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH);
		NEED(d, CUDNN_ATTR_ENGINEHEUR_MODE);
		return 0;
	case CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR: {
		NEED(d, CUDNN_ATTR_EXECUTION_PLAN_HANDLE);
		NEED(d, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG);
		cs_desc* cfg = cs_ref(d, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG);
		if (!cfg->from_heur) return cs_fail(ST_BAD_PARAM, "an engine configuration the heuristics did not return");
		if (cs_plan_fails < 0) cs_plan_fails = (int)cs_env("CUDNNSTUB_PLAN_FAILS", 1);
		if (cs_plan_fails > 0) {
			cs_plan_fails--;
			return cs_fail(ST_GRAPH_PATTERN, "engine %d does not support this graph (stub)", cfg->from_heur - 1);
		}
		int st = cs_nvrtc();
		if (st == 0) st = cs_support(cfg->graph);
		if (st != 0) return st;
		d->graph = cfg->graph;
		return 0;
	}
	case CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR: {
		NEED(d, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS);
		NEED(d, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS);
		NEED(d, CUDNN_ATTR_VARIANT_PACK_WORKSPACE);
		if (cs_get(d, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS)->n != cs_get(d, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS)->n)
			return cs_fail(ST_BAD_PARAM, "variant pack with %lld ids and %lld pointers", (long long)cs_get(d, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS)->n,
			               (long long)cs_get(d, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS)->n);
		return 0;
	}
	}
	return cs_fail(ST_BAD_PARAM, "the stub cannot finalize a %s descriptor", cs_type_name(d->type));
}

cudnnStatus_t cudnnBackendFinalize(cudnnBackendDescriptor_t descriptor) {
	LOCK;
	cs_last[0] = 0;
	if (!cs_valid(descriptor)) RET(cs_fail(ST_BAD_PARAM, "not a live descriptor"), "cudnnBackendFinalize", "desc=%s", cs_name(descriptor));
	cs_desc* d = descriptor;
	if (d->finalized) RET(cs_fail(ST_BAD_PARAM, "finalized twice"), "cudnnBackendFinalize", "desc=%s type=%s", cs_name(d), cs_type_name(d->type));
	int st = cs_check(d);
	if (st == 0) d->finalized = 1;
	RET(st, "cudnnBackendFinalize", "desc=%s type=%s", cs_name(d), cs_type_name(d->type));
}

cudnnStatus_t cudnnBackendGetAttribute(cudnnBackendDescriptor_t const descriptor, cudnnBackendAttributeName_t attributeName,
                                       cudnnBackendAttributeType_t attributeType, int64_t requestedElementCount, int64_t* elementCount,
                                       void* arrayOfElements) {
	LOCK;
	cs_last[0] = 0;
	if (!cs_valid(descriptor))
		RET(cs_fail(ST_BAD_PARAM, "not a live descriptor"), "cudnnBackendGetAttribute", "desc=%s attr=%d", cs_name(descriptor), attributeName);
	cs_desc* d = descriptor;
#define GETFMT "desc=%s type=%s attr=%d atype=%d req=%lld"
#define GETARGS cs_name(d), cs_type_name(d->type), attributeName, attributeType, (long long)requestedElementCount
#define GETLOG GETFMT, GETARGS
	if (!d->finalized && d->type != CUDNN_BACKEND_ENGINECFG_DESCRIPTOR)
		RET(cs_fail(ST_NOT_FINALIZED, "not finalized"), "cudnnBackendGetAttribute", GETLOG);
	switch (attributeName) {
	case CUDNN_ATTR_ENGINEHEUR_RESULTS: {
		if (d->type != CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR || attributeType != BD)
			RET(cs_fail(ST_BAD_PARAM, "wrong descriptor or type"), "cudnnBackendGetAttribute", GETLOG);
		int mode = cs_int(d, CUDNN_ATTR_ENGINEHEUR_MODE, -1);
		long n = mode == CUDNN_HEUR_MODE_FALLBACK ? cs_env("CUDNNSTUB_ENGINES_FALLBACK", 1) : cs_env("CUDNNSTUB_ENGINES_A", 2);
		if (n > requestedElementCount) n = requestedElementCount;
		for (long i = 0; i < n; i++) {
			cs_desc* c = ((cs_desc**)arrayOfElements)[i];
			if (!cs_valid(c) || c->type != CUDNN_BACKEND_ENGINECFG_DESCRIPTOR)
				RET(cs_fail(ST_DESCRIPTOR_TYPE, "element %ld is not an engine configuration", i), "cudnnBackendGetAttribute", GETLOG);
			c->from_heur = (int)(mode == CUDNN_HEUR_MODE_FALLBACK ? 100 + i : i) + 1;
			c->graph = cs_ref(d, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH);
			c->finalized = 1;
		}
		*elementCount = n;
		RET(0, "cudnnBackendGetAttribute", GETFMT " count=%ld mode=%d", GETARGS, n, mode);
	}
	case CUDNN_ATTR_ENGINECFG_ENGINE: {
		if (d->type != CUDNN_BACKEND_ENGINECFG_DESCRIPTOR || !d->from_heur || attributeType != BD || requestedElementCount < 1)
			RET(cs_fail(ST_BAD_PARAM, "not an engine configuration from heuristics"), "cudnnBackendGetAttribute", GETLOG);
		cs_desc* e = ((cs_desc**)arrayOfElements)[0];
		if (!cs_valid(e) || e->type != CUDNN_BACKEND_ENGINE_DESCRIPTOR)
			RET(cs_fail(ST_DESCRIPTOR_TYPE, "not an engine descriptor"), "cudnnBackendGetAttribute", GETLOG);
		e->from_heur = d->from_heur;
		e->finalized = 1;
		*elementCount = 1;
		RET(0, "cudnnBackendGetAttribute", GETFMT " engine=%d", GETARGS, d->from_heur - 1);
	}
	case CUDNN_ATTR_ENGINE_GLOBAL_INDEX:
		if (d->type != CUDNN_BACKEND_ENGINE_DESCRIPTOR || attributeType != CUDNN_TYPE_INT64)
			RET(cs_fail(ST_BAD_PARAM, "wrong descriptor or type"), "cudnnBackendGetAttribute", GETLOG);
		*(int64_t*)arrayOfElements = d->from_heur - 1;
		*elementCount = 1;
		RET(0, "cudnnBackendGetAttribute", GETFMT " index=%d", GETARGS, d->from_heur - 1);
	case CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE:
		if (d->type != CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR || attributeType != CUDNN_TYPE_INT64)
			RET(cs_fail(ST_BAD_PARAM, "wrong descriptor or type"), "cudnnBackendGetAttribute", GETLOG);
		*(int64_t*)arrayOfElements = cs_workspace(d->graph);
		*elementCount = 1;
		RET(0, "cudnnBackendGetAttribute", GETFMT " workspace=%lld", GETARGS, (long long)*(int64_t*)arrayOfElements);
	}
	RET(cs_fail(ST_BAD_PARAM, "the stub does not answer attribute %d", attributeName), "cudnnBackendGetAttribute", GETLOG);
}

cudnnStatus_t cudnnBackendExecute(cudnnHandle_t handle, cudnnBackendDescriptor_t executionPlan, cudnnBackendDescriptor_t variantPack) {
	LOCK;
	cs_last[0] = 0;
	if (!cs_handle_valid(handle)) RET(cs_fail(ST_BAD_PARAM, "not a live handle"), "cudnnBackendExecute", "handle=%s", cs_name(handle));
	if (!cs_valid(executionPlan) || ((cs_desc*)executionPlan)->type != CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR || !((cs_desc*)executionPlan)->finalized)
		RET(cs_fail(ST_BAD_PARAM, "not a finalized execution plan"), "cudnnBackendExecute", "plan=%s", cs_name(executionPlan));
	if (!cs_valid(variantPack) || ((cs_desc*)variantPack)->type != CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR || !((cs_desc*)variantPack)->finalized)
		RET(cs_fail(ST_BAD_PARAM, "not a finalized variant pack"), "cudnnBackendExecute", "pack=%s", cs_name(variantPack));
	cs_desc* plan = executionPlan;
	cs_desc* vp = variantPack;
	int64_t n;
	int64_t* uids = cs_i64(vp, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, &n);
	void** ptrs = (void**)cs_get(vp, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS)->v;
	void* ws = *(void**)cs_get(vp, CUDNN_ATTR_VARIANT_PACK_WORKSPACE)->v;
	// the plan's non-virtual tensors
	int64_t nops;
	cs_desc** ops = cs_graph_ops(plan->graph, &nops);
	cs_desc* nv[256];
	int nnv = 0;
	for (int64_t i = 0; i < nops; i++) {
		cs_desc* ts[8];
		int nts = cs_op_tensors(ops[i], ts);
		for (int k = 0; k < nts; k++) {
			cs_desc* t = ts[k];
			for (int pass = 0; pass < 2; pass++) {
				cs_desc* x = pass ? cs_ref(t, CUDNN_ATTR_TENSOR_RAGGED_OFFSET_DESC) : t;
				if (x == NULL || cs_bool(x, CUDNN_ATTR_TENSOR_IS_VIRTUAL)) continue;
				int dup = 0;
				for (int s = 0; s < nnv; s++) dup |= nv[s] == x;
				if (!dup && nnv < 256) nv[nnv++] = x;
			}
		}
	}
	cs_log("execute handle=%s stream=%p plan=%s graph=%s tensors=%lld workspace=%p", cs_name(handle), handle->stream, cs_name(plan),
	       cs_name(plan->graph), (long long)n, ws);
	for (int64_t i = 0; i < n; i++) {
		cs_desc* t = NULL;
		for (int s = 0; s < nnv; s++)
			if (cs_uid(nv[s]) == uids[i]) t = nv[s];
		if (t == NULL) RET(cs_fail(ST_BAD_PARAM, "the variant pack has uid %lld, which the plan does not", (long long)uids[i]), "cudnnBackendExecute", "plan=%s", cs_name(plan));
		for (int64_t j = 0; j < i; j++)
			if (uids[j] == uids[i]) RET(cs_fail(ST_DUPLICATED, "uid %lld twice in the variant pack", (long long)uids[i]), "cudnnBackendExecute", "plan=%s", cs_name(plan));
		if (ptrs[i] == NULL) RET(cs_fail(ST_NULL_POINTER, "uid %lld has a NULL address", (long long)uids[i]), "cudnnBackendExecute", "plan=%s", cs_name(plan));
		int64_t* align = cs_i64(t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, NULL);
		if (!cs_bool(t, CUDNN_ATTR_TENSOR_IS_BY_VALUE) && align && *align > 0 && (uintptr_t)ptrs[i] % (uintptr_t)*align != 0)
			RET(cs_fail(ST_MISALIGNED, "uid %lld at %p: not aligned to the %lld bytes its descriptor declares", (long long)uids[i], ptrs[i],
			            (long long)*align),
			    "cudnnBackendExecute", "plan=%s", cs_name(plan));
		if (cs_bool(t, CUDNN_ATTR_TENSOR_IS_BY_VALUE)) {
			int dt = cs_int(t, CUDNN_ATTR_TENSOR_DATA_TYPE, -1);
			if (dt == CUDNN_DATA_FLOAT) cs_log("bind uid=%lld value=%.9g", (long long)uids[i], *(float*)ptrs[i]);
			else if (dt == CUDNN_DATA_INT32) cs_log("bind uid=%lld value=%d", (long long)uids[i], *(int32_t*)ptrs[i]);
			else cs_log("bind uid=%lld value=?", (long long)uids[i]);
		} else {
			cs_log("bind uid=%lld ptr=%p", (long long)uids[i], ptrs[i]);
		}
	}
	for (int s = 0; s < nnv; s++) {
		int found = 0;
		for (int64_t i = 0; i < n; i++) found |= uids[i] == cs_uid(nv[s]);
		if (!found) RET(cs_fail(ST_BAD_PARAM, "no address for tensor uid %lld", (long long)cs_uid(nv[s])), "cudnnBackendExecute", "plan=%s", cs_name(plan));
	}
	if (ws == NULL) RET(cs_fail(ST_NULL_POINTER, "no workspace"), "cudnnBackendExecute", "plan=%s", cs_name(plan));
	RET(0, "cudnnBackendExecute", "handle=%s plan=%s pack=%s", cs_name(handle), cs_name(plan), cs_name(vp));
}
