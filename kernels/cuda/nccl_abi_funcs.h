// The entry points of NCCL that nccl.go calls, and the names of the constants and types
// nccl_abi.h declares, as X-macro lists. Kept apart from nccl_abi.h so that
// scripts/check_nccl_abi.c can expand them against NCCL's own nccl.h.

#ifndef DISTFLASH_NCCL_ABI_FUNCS_H
#define DISTFLASH_NCCL_ABI_FUNCS_H

// DF_NCCL_FUNCS lists the entry points every NCCL from 2.9 on has, DF_NCCL_OPTIONAL_FUNCS those
// of later releases (ncclCommSplit: 2.18), as X(name, exported symbol, return type, parameters).
#define DF_NCCL_FUNCS(X)                                                                                        \
	X(ncclGetVersion, "ncclGetVersion", ncclResult_t, (int* version))                                           \
	X(ncclGetUniqueId, "ncclGetUniqueId", ncclResult_t, (ncclUniqueId * uniqueId))                              \
	X(ncclCommInitRank, "ncclCommInitRank", ncclResult_t,                                                       \
	  (ncclComm_t * comm, int nranks, ncclUniqueId commId, int rank))                                           \
	X(ncclCommDestroy, "ncclCommDestroy", ncclResult_t, (ncclComm_t comm))                                      \
	X(ncclCommAbort, "ncclCommAbort", ncclResult_t, (ncclComm_t comm))                                          \
	X(ncclCommGetAsyncError, "ncclCommGetAsyncError", ncclResult_t,                                             \
	  (ncclComm_t comm, ncclResult_t * asyncError))                                                             \
	X(ncclGetErrorString, "ncclGetErrorString", const char*, (ncclResult_t result))                             \
	X(ncclGroupStart, "ncclGroupStart", ncclResult_t, (void))                                                   \
	X(ncclGroupEnd, "ncclGroupEnd", ncclResult_t, (void))                                                       \
	X(ncclSend, "ncclSend", ncclResult_t,                                                                       \
	  (const void* sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,                  \
	   cudaStream_t stream))                                                                                    \
	X(ncclRecv, "ncclRecv", ncclResult_t,                                                                       \
	  (void* recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm, cudaStream_t stream))  \
	X(ncclAllReduce, "ncclAllReduce", ncclResult_t,                                                             \
	  (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,             \
	   ncclComm_t comm, cudaStream_t stream))                                                                   \
	X(ncclAllGather, "ncclAllGather", ncclResult_t,                                                             \
	  (const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t datatype, ncclComm_t comm,        \
	   cudaStream_t stream))                                                                                    \
	X(ncclReduceScatter, "ncclReduceScatter", ncclResult_t,                                                     \
	  (const void* sendbuff, void* recvbuff, size_t recvcount, ncclDataType_t datatype, ncclRedOp_t op,         \
	   ncclComm_t comm, cudaStream_t stream))

#define DF_NCCL_OPTIONAL_FUNCS(X)                                                                               \
	X(ncclCommSplit, "ncclCommSplit", ncclResult_t,                                                             \
	  (ncclComm_t comm, int color, int key, ncclComm_t* newcomm, ncclConfig_t* config))

#define DF_NCCL_CONSTS(X) X(ncclSuccess) X(ncclFloat32) X(ncclSum) X(NCCL_UNIQUE_ID_BYTES)

#define DF_NCCL_TYPES(X)                                                                                        \
	X(ncclResult_t) X(ncclDataType_t) X(ncclRedOp_t) X(ncclComm_t) X(ncclUniqueId) X(cudaStream_t)

#endif
