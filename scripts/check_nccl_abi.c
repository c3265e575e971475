// Compares kernels/cuda/nccl_abi.h with NCCL's nccl.h (scripts/check_nccl_abi.sh builds it
// twice). Built with -DOURS it prints every constant, type size and alignment and exported
// symbol name as nccl_abi.h declares them; built without, as nccl.h declares them. Compiled with
// -DSIGNATURES (and without OURS), it assigns each real entry point to a pointer of the
// signature nccl_abi_funcs.h writes down, which -Werror turns into an error when they differ.
// With -DNO_OPTIONAL (a release before 2.18) DF_NCCL_OPTIONAL_FUNCS is left out.
#include <stdio.h>
#ifdef OURS
#include "nccl_abi.h"
#define SYMBOL(name) ""
#else
#include <nccl.h>
#include "nccl_abi_funcs.h"
#define STR2(x) #x
#define SYMBOL(name) STR2(name)
#ifdef SIGNATURES
#define CHECK_SIGNATURE(name, sym, ret, params) ret(*check_##name) params = &name;
DF_NCCL_FUNCS(CHECK_SIGNATURE)
#ifndef NO_OPTIONAL
DF_NCCL_OPTIONAL_FUNCS(CHECK_SIGNATURE)
#endif
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
	DF_NCCL_CONSTS(PRINT_CONST)
	DF_NCCL_TYPES(PRINT_TYPE)
	DF_NCCL_FUNCS(PRINT_SYM)
#ifndef NO_OPTIONAL
	DF_NCCL_OPTIONAL_FUNCS(PRINT_SYM)
#endif
	return 0;
}
