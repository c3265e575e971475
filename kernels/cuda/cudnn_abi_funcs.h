// The entry points of cuDNN that cudnn.go calls, and the names of the constants and types
// cudnn_abi.h declares, as X-macro lists. Kept apart from cudnn_abi.h so that
// scripts/check_cudnn_abi.c can expand them against cuDNN's own cudnn_graph.h, and the stub
// library of the kernels tests (kernels/testdata/cudnnstub) can define them.

#ifndef DISTFLASH_CUDNN_ABI_FUNCS_H
#define DISTFLASH_CUDNN_ABI_FUNCS_H

// DF_CUDNN_FUNCS lists the entry points (every cuDNN from 9.0 on has them) as X(name, exported
// symbol, return type, parameters).
#define DF_CUDNN_FUNCS(X)                                                                                       \
	X(cudnnGetVersion, "cudnnGetVersion", size_t, (void))                                                       \
	X(cudnnGetCudartVersion, "cudnnGetCudartVersion", size_t, (void))                                           \
	X(cudnnGetErrorString, "cudnnGetErrorString", const char*, (cudnnStatus_t status))                          \
	X(cudnnGetLastErrorString, "cudnnGetLastErrorString", void, (char* message, size_t max_size))               \
	X(cudnnCreate, "cudnnCreate", cudnnStatus_t, (cudnnHandle_t * handle))                                      \
	X(cudnnDestroy, "cudnnDestroy", cudnnStatus_t, (cudnnHandle_t handle))                                      \
	X(cudnnSetStream, "cudnnSetStream", cudnnStatus_t, (cudnnHandle_t handle, cudaStream_t streamId))           \
	X(cudnnBackendCreateDescriptor, "cudnnBackendCreateDescriptor", cudnnStatus_t,                              \
	  (cudnnBackendDescriptorType_t descriptorType, cudnnBackendDescriptor_t * descriptor))                     \
	X(cudnnBackendDestroyDescriptor, "cudnnBackendDestroyDescriptor", cudnnStatus_t,                            \
	  (cudnnBackendDescriptor_t descriptor))                                                                    \
	X(cudnnBackendFinalize, "cudnnBackendFinalize", cudnnStatus_t, (cudnnBackendDescriptor_t descriptor))       \
	X(cudnnBackendSetAttribute, "cudnnBackendSetAttribute", cudnnStatus_t,                                      \
	  (cudnnBackendDescriptor_t descriptor, cudnnBackendAttributeName_t attributeName,                          \
	   cudnnBackendAttributeType_t attributeType, int64_t elementCount, const void* arrayOfElements))           \
	X(cudnnBackendGetAttribute, "cudnnBackendGetAttribute", cudnnStatus_t,                                      \
	  (cudnnBackendDescriptor_t const descriptor, cudnnBackendAttributeName_t attributeName,                    \
	   cudnnBackendAttributeType_t attributeType, int64_t requestedElementCount, int64_t* elementCount,         \
	   void* arrayOfElements))                                                                                  \
	X(cudnnBackendExecute, "cudnnBackendExecute", cudnnStatus_t,                                                \
	  (cudnnHandle_t handle, cudnnBackendDescriptor_t executionPlan, cudnnBackendDescriptor_t variantPack))

// DF_CUDNN_CONSTS lists every constant of cudnn_abi.h.
#define DF_CUDNN_CONSTS(X)                                                                                  \
	X(CUDNN_STATUS_SUCCESS) X(CUDNN_STATUS_BAD_PARAM) X(CUDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER)          \
	X(CUDNN_STATUS_NOT_SUPPORTED) X(CUDNN_STATUS_NOT_SUPPORTED_RUNTIME_PREREQUISITE_MISSING)                \
	X(CUDNN_STATUS_INTERNAL_ERROR_COMPILATION_FAILED) X(CUDNN_DATA_FLOAT)                                   \
	X(CUDNN_DATA_HALF) X(CUDNN_DATA_INT32) X(CUDNN_DATA_BFLOAT16) X(CUDNN_DATA_INT64)                       \
	X(CUDNN_DATA_BOOLEAN) X(CUDNN_REDUCE_TENSOR_ADD) X(CUDNN_REDUCE_TENSOR_MAX) X(CUDNN_POINTWISE_ADD)      \
	X(CUDNN_POINTWISE_MUL) X(CUDNN_POINTWISE_DIV) X(CUDNN_POINTWISE_SUB) X(CUDNN_POINTWISE_EXP)             \
	X(CUDNN_POINTWISE_LOG) X(CUDNN_POINTWISE_IDENTITY) X(CUDNN_POINTWISE_CMP_GT)                            \
	X(CUDNN_POINTWISE_CMP_GE) X(CUDNN_POINTWISE_CMP_LT) X(CUDNN_POINTWISE_LOGICAL_AND)                      \
	X(CUDNN_POINTWISE_GEN_INDEX) X(CUDNN_POINTWISE_BINARY_SELECT) X(CUDNN_HEUR_MODE_FALLBACK)               \
	X(CUDNN_HEUR_MODE_A) X(CUDNN_TYPE_HANDLE) X(CUDNN_TYPE_DATA_TYPE) X(CUDNN_TYPE_BOOLEAN)                 \
	X(CUDNN_TYPE_INT64) X(CUDNN_TYPE_FLOAT) X(CUDNN_TYPE_VOID_PTR) X(CUDNN_TYPE_HEUR_MODE)                  \
	X(CUDNN_TYPE_POINTWISE_MODE) X(CUDNN_TYPE_BACKEND_DESCRIPTOR) X(CUDNN_TYPE_REDUCTION_OPERATOR_TYPE)     \
	X(CUDNN_BACKEND_POINTWISE_DESCRIPTOR) X(CUDNN_BACKEND_ENGINE_DESCRIPTOR)                                \
	X(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR) X(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR)                            \
	X(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR) X(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR)              \
	X(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR) X(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR)                     \
	X(CUDNN_BACKEND_TENSOR_DESCRIPTOR) X(CUDNN_BACKEND_MATMUL_DESCRIPTOR)                                   \
	X(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR) X(CUDNN_BACKEND_REDUCTION_DESCRIPTOR)                      \
	X(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR) X(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR)           \
	X(CUDNN_ATTR_POINTWISE_MODE) X(CUDNN_ATTR_POINTWISE_MATH_PREC) X(CUDNN_ATTR_POINTWISE_AXIS)             \
	X(CUDNN_ATTR_ENGINEHEUR_MODE) X(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH)                                  \
	X(CUDNN_ATTR_ENGINEHEUR_RESULTS) X(CUDNN_ATTR_ENGINECFG_ENGINE) X(CUDNN_ATTR_EXECUTION_PLAN_HANDLE)     \
	X(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG) X(CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE)                  \
	X(CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR) X(CUDNN_ATTR_OPERATION_POINTWISE_XDESC)                 \
	X(CUDNN_ATTR_OPERATION_POINTWISE_BDESC) X(CUDNN_ATTR_OPERATION_POINTWISE_YDESC)                         \
	X(CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1) X(CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2)                       \
	X(CUDNN_ATTR_OPERATION_POINTWISE_TDESC) X(CUDNN_ATTR_OPERATIONGRAPH_HANDLE)                             \
	X(CUDNN_ATTR_OPERATIONGRAPH_OPS) X(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT) X(CUDNN_ATTR_TENSOR_DATA_TYPE)     \
	X(CUDNN_ATTR_TENSOR_DIMENSIONS) X(CUDNN_ATTR_TENSOR_STRIDES) X(CUDNN_ATTR_TENSOR_UNIQUE_ID)             \
	X(CUDNN_ATTR_TENSOR_IS_VIRTUAL) X(CUDNN_ATTR_TENSOR_IS_BY_VALUE)                                        \
	X(CUDNN_ATTR_TENSOR_RAGGED_OFFSET_DESC) X(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS)                           \
	X(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS) X(CUDNN_ATTR_VARIANT_PACK_WORKSPACE)                           \
	X(CUDNN_ATTR_ENGINE_GLOBAL_INDEX) X(CUDNN_ATTR_MATMUL_COMP_TYPE)                                        \
	X(CUDNN_ATTR_OPERATION_MATMUL_ADESC) X(CUDNN_ATTR_OPERATION_MATMUL_BDESC)                               \
	X(CUDNN_ATTR_OPERATION_MATMUL_CDESC) X(CUDNN_ATTR_OPERATION_MATMUL_DESC)                                \
	X(CUDNN_ATTR_OPERATION_MATMUL_GEMM_M_OVERRIDE_DESC)                                                     \
	X(CUDNN_ATTR_OPERATION_MATMUL_GEMM_N_OVERRIDE_DESC)                                                     \
	X(CUDNN_ATTR_OPERATION_MATMUL_GEMM_K_OVERRIDE_DESC) X(CUDNN_ATTR_REDUCTION_OPERATOR)                    \
	X(CUDNN_ATTR_REDUCTION_COMP_TYPE) X(CUDNN_ATTR_OPERATION_REDUCTION_XDESC)                               \
	X(CUDNN_ATTR_OPERATION_REDUCTION_YDESC) X(CUDNN_ATTR_OPERATION_REDUCTION_DESC)                          \
	X(CUDNN_ATTR_OPERATION_RESHAPE_XDESC) X(CUDNN_ATTR_OPERATION_RESHAPE_YDESC)

#define DF_CUDNN_TYPES(X)                                                                                       \
	X(cudnnHandle_t) X(cudnnBackendDescriptor_t) X(cudnnStatus_t) X(cudnnBackendAttributeName_t)                \
	X(cudnnBackendAttributeType_t) X(cudnnBackendDescriptorType_t) X(cudnnDataType_t) X(cudnnPointwiseMode_t)   \
	X(cudnnReduceTensorOp_t) X(cudnnBackendHeurMode_t) X(cudaStream_t)

#endif
