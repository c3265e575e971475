// The part of NCCL's API that nccl.go calls, declared here so that the package builds without
// NCCL's headers (it opens libnccl.so.2 with dlopen at its first NCCL call): the communicator
// handle, the unique id, the result, data type and reduction types, the constants used and the
// entry points (in nccl_abi_funcs.h), as NVIDIA's nccl.h declares them from NCCL 2.9 on
// (ncclCommSplit from 2.18). scripts/check_nccl_abi.sh compares every constant, type size and
// alignment, symbol name and signature here with a release's nccl.h.

#ifndef DISTFLASH_NCCL_ABI_H
#define DISTFLASH_NCCL_ABI_H

#include <stddef.h>

#include "cuda_abi.h"  // cudaStream_t

// ncclResult_t, ncclDataType_t and ncclRedOp_t are enums in nccl.h, all of int's size.
typedef int ncclResult_t;
typedef int ncclDataType_t;
typedef int ncclRedOp_t;
typedef struct ncclComm* ncclComm_t;
typedef struct ncclConfig_opaque ncclConfig_t;  // only ever passed as NULL (ncclCommSplit's config)

#define NCCL_UNIQUE_ID_BYTES 128
typedef struct {
	char internal[NCCL_UNIQUE_ID_BYTES];
} ncclUniqueId;

#define ncclSuccess 0
#define ncclFloat32 7
#define ncclSum 0

#include "nccl_abi_funcs.h"

#endif
