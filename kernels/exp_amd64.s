//go:build amd64 && !noasm

// Vector exponential and row maximum for the attention softmax (declarations and the
// algorithm in exp_amd64.go / exp.go). Go assembler operand order: the destination is last,
// and for three-operand instructions "OP b, a, dst" is Intel's "op dst, a, b".

#include "textflag.h"

// func expShift512(dst, src *float32, n int, shift float32) float32
// Z31 shift, Z20..Z30 constants; per 16 lanes: Z0 x, Z1 n, Z2 r², Z3 polynomial; Z4 sum.
TEXT ·expShift512(SB), NOSPLIT, $0-36
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	VBROADCASTSS shift+24(FP), Z31
	MOVL $0x42b20000, AX // 89
	VPBROADCASTD AX, Z30
	MOVL $0xc2d20000, AX // -105
	VPBROADCASTD AX, Z29
	MOVL $0x3fb8aa3b, AX // log2 e
	VPBROADCASTD AX, Z28
	MOVL $0x3f318000, AX // C1
	VPBROADCASTD AX, Z27
	MOVL $0xb95e8083, AX // C2
	VPBROADCASTD AX, Z26
	MOVL $0x39506967, AX // P0
	VPBROADCASTD AX, Z25
	MOVL $0x3ab743ce, AX // P1
	VPBROADCASTD AX, Z24
	MOVL $0x3c088908, AX // P2
	VPBROADCASTD AX, Z23
	MOVL $0x3d2aa9c1, AX // P3
	VPBROADCASTD AX, Z22
	MOVL $0x3e2aaaaa, AX // P4
	VPBROADCASTD AX, Z21
	MOVL $0x3f000000, AX // P5
	VPBROADCASTD AX, Z20
	MOVL $0x3f800000, AX // 1
	VPBROADCASTD AX, Z19
	VPXORD Z4, Z4, Z4
	SHRQ $4, CX
	JZ done512
loop512:
	VMOVUPS (SI), Z0
	VSUBPS Z31, Z0, Z0        // x = src - shift
	VMINPS Z0, Z30, Z0        // min(89, x), NaN stays
	VMAXPS Z0, Z29, Z0        // max(-105, x), NaN stays
	VMULPS Z28, Z0, Z1
	VRNDSCALEPS $0, Z1, Z1    // n = round(x·log2 e)
	VFNMADD231PS Z27, Z1, Z0  // r = x - n·C1
	VFNMADD231PS Z26, Z1, Z0  // r -= n·C2
	VMULPS Z0, Z0, Z2         // z = r²
	VMOVAPS Z25, Z3
	VFMADD213PS Z24, Z0, Z3   // p = p·r + P1
	VFMADD213PS Z23, Z0, Z3
	VFMADD213PS Z22, Z0, Z3
	VFMADD213PS Z21, Z0, Z3
	VFMADD213PS Z20, Z0, Z3
	VFMADD213PS Z0, Z2, Z3    // y = p·z + r
	VADDPS Z19, Z3, Z3        // y += 1
	VSCALEFPS Z1, Z3, Z3      // y·2^n, rounded once
	VMOVUPS Z3, (DI)
	VADDPS Z3, Z4, Z4
	ADDQ $64, SI
	ADDQ $64, DI
	DECQ CX
	JNZ loop512
done512:
	VEXTRACTF64X4 $1, Z4, Y5 // AVX-512F (VEXTRACTF32X8 would need DQ)
	VADDPS Y5, Y4, Y4
	VEXTRACTF128 $1, Y4, X5
	VADDPS X5, X4, X4
	VMOVHLPS X4, X4, X5
	VADDPS X5, X4, X4
	VMOVSHDUP X4, X5
	VADDSS X5, X4, X4
	MOVSS X4, ret+32(FP)
	VZEROUPPER
	RET

// func expShift256(dst, src *float32, n int, shift float32) float32
// The same steps on 8 lanes; 2^n as 2^(n>>1)·2^(n−n>>1) built from integers.
// Y15 shift, Y8..Y14 constants (P0..P4 are broadcast from memory); Y4 sum.
TEXT ·expShift256(SB), NOSPLIT, $0-36
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	VBROADCASTSS shift+24(FP), Y15
	MOVL $0x42b20000, AX
	MOVL AX, X0
	VPBROADCASTD X0, Y14
	MOVL $0xc2d20000, AX
	MOVL AX, X0
	VPBROADCASTD X0, Y13
	MOVL $0x3fb8aa3b, AX
	MOVL AX, X0
	VPBROADCASTD X0, Y12
	MOVL $0x3f318000, AX
	MOVL AX, X0
	VPBROADCASTD X0, Y11
	MOVL $0xb95e8083, AX
	MOVL AX, X0
	VPBROADCASTD X0, Y10
	MOVL $0x3f000000, AX
	MOVL AX, X0
	VPBROADCASTD X0, Y9
	MOVL $0x3f800000, AX
	MOVL AX, X0
	VPBROADCASTD X0, Y8
	MOVL $127, AX
	MOVL AX, X0
	VPBROADCASTD X0, Y7
	VXORPS Y4, Y4, Y4
	SHRQ $3, CX
	JZ done256
loop256:
	VMOVUPS (SI), Y0
	VSUBPS Y15, Y0, Y0
	VMINPS Y0, Y14, Y0
	VMAXPS Y0, Y13, Y0
	VMULPS Y12, Y0, Y1
	VROUNDPS $0, Y1, Y1
	VFNMADD231PS Y11, Y1, Y0
	VFNMADD231PS Y10, Y1, Y0
	VMULPS Y0, Y0, Y2
	VBROADCASTSS expc<>+0(SB), Y3
	VBROADCASTSS expc<>+4(SB), Y5
	VFMADD213PS Y5, Y0, Y3
	VBROADCASTSS expc<>+8(SB), Y5
	VFMADD213PS Y5, Y0, Y3
	VBROADCASTSS expc<>+12(SB), Y5
	VFMADD213PS Y5, Y0, Y3
	VBROADCASTSS expc<>+16(SB), Y5
	VFMADD213PS Y5, Y0, Y3
	VFMADD213PS Y9, Y0, Y3
	VFMADD213PS Y0, Y2, Y3
	VADDPS Y8, Y3, Y3
	VCVTPS2DQ Y1, Y1          // n as integers (exact)
	VPSRAD $1, Y1, Y5         // n1 = n>>1
	VPSUBD Y5, Y1, Y1         // n2 = n - n1
	VPADDD Y7, Y5, Y5
	VPSLLD $23, Y5, Y5        // 2^n1
	VPADDD Y7, Y1, Y1
	VPSLLD $23, Y1, Y1        // 2^n2
	VMULPS Y5, Y3, Y3         // exact
	VMULPS Y1, Y3, Y3         // rounded once
	VMOVUPS Y3, (DI)
	VADDPS Y3, Y4, Y4
	ADDQ $32, SI
	ADDQ $32, DI
	DECQ CX
	JNZ loop256
done256:
	VEXTRACTF128 $1, Y4, X5
	VADDPS X5, X4, X4
	VMOVHLPS X4, X4, X5
	VADDPS X5, X4, X4
	VMOVSHDUP X4, X5
	VADDSS X5, X4, X4
	MOVSS X4, ret+32(FP)
	VZEROUPPER
	RET

DATA expc<>+0(SB)/4, $0x39506967
DATA expc<>+4(SB)/4, $0x3ab743ce
DATA expc<>+8(SB)/4, $0x3c088908
DATA expc<>+12(SB)/4, $0x3d2aa9c1
DATA expc<>+16(SB)/4, $0x3e2aaaaa
GLOBL expc<>(SB), RODATA|NOPTR, $20

// func max256(src *float32, n int) float32
// n a multiple of 16; NaNs are ignored (the running maximum is the operand VMAXPS keeps).
TEXT ·max256(SB), NOSPLIT, $0-20
	MOVQ src+0(FP), SI
	MOVQ n+8(FP), CX
	MOVL $0xff800000, AX
	MOVL AX, X0
	VPBROADCASTD X0, Y0
	VMOVAPS Y0, Y1
	SHRQ $4, CX
	JZ donemax
loopmax:
	VMOVUPS (SI), Y2
	VMOVUPS 32(SI), Y3
	VMAXPS Y0, Y2, Y0
	VMAXPS Y1, Y3, Y1
	ADDQ $64, SI
	DECQ CX
	JNZ loopmax
donemax:
	VMAXPS Y1, Y0, Y0
	VEXTRACTF128 $1, Y0, X1
	VMAXPS X1, X0, X0
	VMOVHLPS X0, X0, X1
	VMAXPS X1, X0, X0
	VMOVSHDUP X0, X1
	VMAXPS X1, X0, X0
	MOVSS X0, ret+16(FP)
	VZEROUPPER
	RET

// func dsRow256(p, dp *float32, n int, d float32)
// dp[j] = p[j]·(dp[j] − d) for n a multiple of 8, rounded as the Go loop of dsRow rounds.
TEXT ·dsRow256(SB), NOSPLIT, $0-28
	MOVQ p+0(FP), SI
	MOVQ dp+8(FP), DI
	MOVQ n+16(FP), CX
	VBROADCASTSS d+24(FP), Y0
	SHRQ $3, CX
	JZ doneds
loopds:
	VMOVUPS (DI), Y1
	VSUBPS Y0, Y1, Y1
	VMULPS (SI), Y1, Y1
	VMOVUPS Y1, (DI)
	ADDQ $32, SI
	ADDQ $32, DI
	DECQ CX
	JNZ loopds
doneds:
	VZEROUPPER
	RET
