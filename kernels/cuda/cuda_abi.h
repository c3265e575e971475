// The part of the CUDA driver API and cuBLAS that driver.go and nccl.go call, declared here so
// that the package builds without the CUDA toolkit (it opens both libraries with dlopen at run
// time): handle and scalar types, the constants used, the exported symbol of each entry point (the
// driver's and cuBLAS's versioned names, e.g. cuMemcpyHtoDAsync_v2) and its C signature, as
// NVIDIA documents them for CUDA 11.8 and later (the entry points are in cuda_abi_funcs.h).
// scripts/check_cuda_abi.sh compares every constant, type size, symbol name and signature here
// with cuda.h and cublas_v2.h where a toolkit is installed.

#ifndef DISTFLASH_CUDA_ABI_H
#define DISTFLASH_CUDA_ABI_H

#include <stddef.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef unsigned long long cuuint64_t;
typedef struct CUctx_st* CUcontext;
typedef struct CUstream_st* CUstream;
typedef struct CUmod_st* CUmodule;
typedef struct CUfunc_st* CUfunction;
typedef struct CUmemPoolHandle_st* CUmemoryPool;
typedef struct CUevent_st* CUevent;
typedef int CUdevice_attribute;
typedef int CUfunction_attribute;
typedef int CUjit_option;
typedef int CUmemPool_attribute;

#define CUDA_SUCCESS 0
#define CUDA_ERROR_INVALID_VALUE 1
#define CUDA_ERROR_NOT_READY 600
#define CUDA_ERROR_NOT_SUPPORTED 801
#define CU_STREAM_NON_BLOCKING 1
#define CU_EVENT_DEFAULT 0
#define CU_EVENT_DISABLE_TIMING 2
#define CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT 16
#define CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR 75
#define CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR 76
#define CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN 97
#define CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED 115
#define CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES 1
#define CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES 8
#define CU_JIT_ERROR_LOG_BUFFER 5
#define CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES 6
#define CU_MEMPOOL_ATTR_RELEASE_THRESHOLD 4

typedef struct cublasContext* cublasHandle_t;
typedef int cublasStatus_t;
typedef int cublasOperation_t;
typedef int cudaDataType;
typedef int cublasComputeType_t;
typedef int cublasGemmAlgo_t;
typedef int cublasMath_t;
typedef struct CUstream_st* cudaStream_t;

#define CUBLAS_STATUS_SUCCESS 0
#define CUBLAS_OP_N 0
#define CUBLAS_OP_T 1
#define CUDA_R_32F 0
#define CUDA_R_16F 2
#define CUDA_R_16BF 14
#define CUBLAS_DEFAULT_MATH 0
#define CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION 16
#define CUBLAS_COMPUTE_32F 68
#define CUBLAS_COMPUTE_32F_FAST_16F 74
#define CUBLAS_COMPUTE_32F_FAST_16BF 75
#define CUBLAS_GEMM_DEFAULT (-1)

#include "cuda_abi_funcs.h"

#endif
