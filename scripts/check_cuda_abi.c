// Compares kernels/cuda/cuda_abi.h with NVIDIA's headers (scripts/check_cuda_abi.sh builds it
// twice). Built with -DOURS it prints every constant, type size and exported symbol name as
// cuda_abi.h declares them; built without, as cuda.h and cublas_v2.h declare them. Compiled
// with -DSIGNATURES (and without OURS), it assigns each real entry point to a pointer of the
// signature cuda_abi_funcs.h writes down, which -Werror turns into an error when they differ.
#include <stdio.h>
#ifdef OURS
#include "cuda_abi.h"
#define SYMBOL(name) ""
#else
#include <cuda.h>
#include <cublas_v2.h>
#include "cuda_abi_funcs.h"
#define STR2(x) #x
#define SYMBOL(name) STR2(name)
#ifdef SIGNATURES
#define CHECK_SIGNATURE(name, sym, ret, params) ret(*check_##name) params = &name;
DF_CU_FUNCS(CHECK_SIGNATURE)
DF_CU_TIMING_FUNCS(CHECK_SIGNATURE)
DF_BLAS_FUNCS(CHECK_SIGNATURE)
DF_BLAS_OPTIONAL_FUNCS(CHECK_SIGNATURE)
#endif
#endif

#define PRINT_CONST(name) printf("constant %s %lld\n", #name, (long long)(name));
#define PRINT_TYPE(name) printf("sizeof %s %zu\n", #name, sizeof(name));
#ifdef OURS
#define PRINT_SYM(name, sym, ret, params) printf("symbol %s %s\n", #name, sym);
#else
#define PRINT_SYM(name, sym, ret, params) printf("symbol %s %s\n", #name, SYMBOL(name));
#endif

int main(void) {
	DF_CONSTS(PRINT_CONST)
	DF_TYPES(PRINT_TYPE)
	DF_CU_FUNCS(PRINT_SYM)
	DF_CU_TIMING_FUNCS(PRINT_SYM)
	DF_BLAS_FUNCS(PRINT_SYM)
	DF_BLAS_OPTIONAL_FUNCS(PRINT_SYM)
	return 0;
}
