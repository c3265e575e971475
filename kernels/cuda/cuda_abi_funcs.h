// The entry points of the CUDA driver and cuBLAS that driver.go and nccl.go call, and the names
// of the constants and types cuda_abi.h declares, as X-macro lists. Kept apart from cuda_abi.h so
// that scripts/check_cuda_abi.c can expand them against NVIDIA's own headers.

#ifndef DISTFLASH_CUDA_ABI_FUNCS_H
#define DISTFLASH_CUDA_ABI_FUNCS_H

// DF_CU_FUNCS and DF_BLAS_FUNCS list every entry point as X(name, exported symbol, return
// type, parameters); DF_BLAS_OPTIONAL_FUNCS those a cuBLAS 11 may lack, resolved apart
// (driver.go: without one, the backend does without what it does).
#define DF_CU_FUNCS(X)                                                                                          \
	X(cuInit, "cuInit", CUresult, (unsigned int flags))                                                         \
	X(cuDeviceGetCount, "cuDeviceGetCount", CUresult, (int* count))                                             \
	X(cuDeviceGet, "cuDeviceGet", CUresult, (CUdevice * device, int ordinal))                                  \
	X(cuDeviceGetName, "cuDeviceGetName", CUresult, (char* name, int len, CUdevice dev))                        \
	X(cuDeviceGetAttribute, "cuDeviceGetAttribute", CUresult, (int* pi, CUdevice_attribute attrib, CUdevice dev)) \
	X(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", CUresult, (CUcontext * pctx, CUdevice dev))         \
	X(cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2", CUresult, (CUdevice dev))                      \
	X(cuCtxSetCurrent, "cuCtxSetCurrent", CUresult, (CUcontext ctx))                                            \
	X(cuStreamCreate, "cuStreamCreate", CUresult, (CUstream * phStream, unsigned int flags))                    \
	X(cuStreamDestroy, "cuStreamDestroy_v2", CUresult, (CUstream hStream))                                      \
	X(cuStreamSynchronize, "cuStreamSynchronize", CUresult, (CUstream hStream))                                 \
	X(cuStreamQuery, "cuStreamQuery", CUresult, (CUstream hStream))                                             \
	X(cuMemAllocAsync, "cuMemAllocAsync", CUresult, (CUdeviceptr * dptr, size_t bytesize, CUstream hStream))    \
	X(cuMemFreeAsync, "cuMemFreeAsync", CUresult, (CUdeviceptr dptr, CUstream hStream))                         \
	X(cuMemsetD32Async, "cuMemsetD32Async", CUresult,                                                           \
	  (CUdeviceptr dstDevice, unsigned int ui, size_t n, CUstream hStream))                                     \
	X(cuMemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2", CUresult,                                                      \
	  (CUdeviceptr dstDevice, const void* srcHost, size_t byteCount, CUstream hStream))                         \
	X(cuMemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2", CUresult,                                                      \
	  (void* dstHost, CUdeviceptr srcDevice, size_t byteCount, CUstream hStream))                               \
	X(cuMemcpyDtoDAsync, "cuMemcpyDtoDAsync_v2", CUresult,                                                      \
	  (CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t byteCount, CUstream hStream))                       \
	X(cuModuleLoadDataEx, "cuModuleLoadDataEx", CUresult,                                                       \
	  (CUmodule * module, const void* image, unsigned int numOptions, CUjit_option* options, void** values))    \
	X(cuModuleUnload, "cuModuleUnload", CUresult, (CUmodule hmod))                                              \
	X(cuModuleGetFunction, "cuModuleGetFunction", CUresult, (CUfunction * hfunc, CUmodule hmod, const char* name)) \
	X(cuFuncGetAttribute, "cuFuncGetAttribute", CUresult, (int* pi, CUfunction_attribute attrib, CUfunction hfunc)) \
	X(cuFuncSetAttribute, "cuFuncSetAttribute", CUresult, (CUfunction hfunc, CUfunction_attribute attrib, int value)) \
	X(cuLaunchKernel, "cuLaunchKernel", CUresult,                                                               \
	  (CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ, unsigned int blockDimX, \
	   unsigned int blockDimY, unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream,           \
	   void** kernelParams, void** extra))                                                                      \
	X(cuDeviceGetDefaultMemPool, "cuDeviceGetDefaultMemPool", CUresult, (CUmemoryPool * pool, CUdevice dev))    \
	X(cuMemPoolSetAttribute, "cuMemPoolSetAttribute", CUresult,                                                 \
	  (CUmemoryPool pool, CUmemPool_attribute attr, void* value))                                               \
	X(cuEventCreate, "cuEventCreate", CUresult, (CUevent * phEvent, unsigned int Flags))                        \
	X(cuEventRecord, "cuEventRecord", CUresult, (CUevent hEvent, CUstream hStream))                             \
	X(cuStreamWaitEvent, "cuStreamWaitEvent", CUresult, (CUstream hStream, CUevent hEvent, unsigned int Flags)) \
	X(cuEventDestroy, "cuEventDestroy_v2", CUresult, (CUevent hEvent))                                          \
	X(cuGetErrorName, "cuGetErrorName", CUresult, (CUresult error, const char** pStr))                          \
	X(cuGetErrorString, "cuGetErrorString", CUresult, (CUresult error, const char** pStr))

// DF_CU_TIMING_FUNCS lists the entry points of the per-op profile's timer, resolved apart from
// the others (driver.go): CUDA 12.8's headers name cuEventElapsedTime_v2, which an older driver
// does not export; there the unversioned symbol (the same signature) is taken, and without it
// only the timer is missing, not the backend.
#define DF_CU_TIMING_FUNCS(X)                                                                                   \
	X(cuEventSynchronize, "cuEventSynchronize", CUresult, (CUevent hEvent))                                     \
	X(cuEventElapsedTime, "cuEventElapsedTime_v2", CUresult, (float* pMilliseconds, CUevent hStart, CUevent hEnd))

#define DF_BLAS_FUNCS(X)                                                                                        \
	X(cublasCreate, "cublasCreate_v2", cublasStatus_t, (cublasHandle_t * handle))                               \
	X(cublasDestroy, "cublasDestroy_v2", cublasStatus_t, (cublasHandle_t handle))                               \
	X(cublasSetStream, "cublasSetStream_v2", cublasStatus_t, (cublasHandle_t handle, cudaStream_t streamId))    \
	X(cublasSetMathMode, "cublasSetMathMode", cublasStatus_t, (cublasHandle_t handle, cublasMath_t mode))        \
	X(cublasGemmEx, "cublasGemmEx", cublasStatus_t,                                                             \
	  (cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n, int k,          \
	   const void* alpha, const void* A, cudaDataType Atype, int lda, const void* B, cudaDataType Btype,        \
	   int ldb, const void* beta, void* C, cudaDataType Ctype, int ldc, cublasComputeType_t computeType,        \
	   cublasGemmAlgo_t algo))                                                                                  \
	X(cublasGetStatusName, "cublasGetStatusName", const char*, (cublasStatus_t status))                         \
	X(cublasGetStatusString, "cublasGetStatusString", const char*, (cublasStatus_t status))

#define DF_BLAS_OPTIONAL_FUNCS(X)                                                                               \
	X(cublasSetWorkspace, "cublasSetWorkspace_v2", cublasStatus_t,                                              \
	  (cublasHandle_t handle, void* workspace, size_t workspaceSizeInBytes))

#define DF_CONSTS(X)                                                                                            \
	X(CUDA_SUCCESS) X(CUDA_ERROR_INVALID_VALUE) X(CUDA_ERROR_NOT_READY) X(CUDA_ERROR_NOT_SUPPORTED) X(CU_STREAM_NON_BLOCKING) X(CU_EVENT_DEFAULT) X(CU_EVENT_DISABLE_TIMING)            \
	X(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT) X(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)                 \
	X(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR) X(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)    \
	X(CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED) X(CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES)                        \
	X(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES) X(CU_JIT_ERROR_LOG_BUFFER)                               \
	X(CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES) X(CU_MEMPOOL_ATTR_RELEASE_THRESHOLD) X(CUBLAS_STATUS_SUCCESS)         \
	X(CUBLAS_OP_N) X(CUBLAS_OP_T) X(CUDA_R_32F) X(CUDA_R_16F) X(CUDA_R_16BF) X(CUBLAS_COMPUTE_32F)               \
	X(CUBLAS_COMPUTE_32F_FAST_16F) X(CUBLAS_COMPUTE_32F_FAST_16BF) X(CUBLAS_GEMM_DEFAULT) X(CUBLAS_DEFAULT_MATH)   \
	X(CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)

#define DF_TYPES(X)                                                                                             \
	X(CUresult) X(CUdevice) X(CUdeviceptr) X(cuuint64_t) X(CUcontext) X(CUstream) X(CUmodule) X(CUfunction)     \
	X(CUmemoryPool) X(CUevent) X(CUdevice_attribute) X(CUfunction_attribute) X(CUjit_option)                   \
	X(CUmemPool_attribute) X(cublasHandle_t) X(cublasStatus_t) X(cublasOperation_t) X(cudaDataType)             \
	X(cublasComputeType_t) X(cublasGemmAlgo_t) X(cublasMath_t) X(cudaStream_t)

#endif
