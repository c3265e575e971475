// Compares kernels/cuda/cudnn_abi.h with cuDNN's cudnn_graph.h (scripts/check_cudnn_abi.sh builds
// it twice). Built with -DOURS it prints every constant, type size and alignment and exported
// symbol name as cudnn_abi.h declares them; built without, as cuDNN's headers declare them.
// Compiled with -DSIGNATURES (and without OURS), it assigns each real entry point to a pointer of
// the signature cudnn_abi_funcs.h writes down, which -Werror turns into an error when they differ.
#include <stdio.h>
#ifdef OURS
#include "cudnn_abi.h"
#define SYMBOL(name) ""
#else
#include <cudnn_graph.h>
#include "cudnn_abi_funcs.h"
#define STR2(x) #x
#define SYMBOL(name) STR2(name)
#ifdef SIGNATURES
#define CHECK_SIGNATURE(name, sym, ret, params) ret(*check_##name) params = &name;
DF_CUDNN_FUNCS(CHECK_SIGNATURE)
#endif
#endif

#define PRINT_CONST(name) printf("constant %s %lld\n", #name, (long long)(name));
#define PRINT_TYPE(name) printf("sizeof %s %zu alignof %zu\n", #name, sizeof(name), _Alignof(name));
#ifdef OURS
#define PRINT_SYM(name, sym, ret, params) printf("symbol %s %s\n", #name, sym);
#else
#define PRINT_SYM(name, sym, ret, params) printf("symbol %s %s\n", #name, SYMBOL(name));
#endif

int main(void) {
	DF_CUDNN_CONSTS(PRINT_CONST)
	DF_CUDNN_TYPES(PRINT_TYPE)
	DF_CUDNN_FUNCS(PRINT_SYM)
	return 0;
}
