//go:build amd64 && !purego

#include "textflag.h"

// func expSub4(dst *float32, src *float32, n int, sub float32, tab *expTable)
// Four elements a pass: x = src - sub in float32; Exp32's float64 steps on
// the four lanes; then the float32 result, +Inf above tab.hi, 0 below
// tab.lo and x itself where x is NaN, as Exp32 does.
TEXT ·expSub4(SB), NOSPLIT, $0-40
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	VBROADCASTSS sub+24(FP), X15
	MOVQ tab+32(FP), R8
	XORQ AX, AX
loop:
	VMOVUPS (SI)(AX*4), X0
	VSUBPS X15, X0, X0
	VCVTPS2PD X0, Y1
	VMULPD 0(R8), Y1, Y1
	VADDPD 32(R8), Y1, Y2
	VSUBPD 32(R8), Y2, Y3
	VSUBPD Y3, Y1, Y4
	VMULPD 64(R8), Y4, Y4
	VMULPD 128(R8), Y4, Y5
	VADDPD 160(R8), Y5, Y5
	VMULPD Y5, Y4, Y5
	VADDPD 192(R8), Y5, Y5
	VMULPD Y5, Y4, Y5
	VADDPD 224(R8), Y5, Y5
	VMULPD Y5, Y4, Y5
	VADDPD 256(R8), Y5, Y5
	VMULPD Y5, Y4, Y5
	VADDPD 288(R8), Y5, Y5
	VMULPD Y5, Y4, Y5
	VADDPD 96(R8), Y5, Y5
	VMULPD Y5, Y4, Y5
	VADDPD 96(R8), Y5, Y5
	VPSUBQ 32(R8), Y2, Y6
	VPADDQ 320(R8), Y6, Y6
	VPSLLQ $52, Y6, Y6
	VMULPD Y6, Y5, Y5
	VCVTPD2PSY Y5, X5
	VCMPPS $0x1e, 352(R8), X0, X7
	VBLENDVPS X7, 384(R8), X5, X5
	VCMPPS $0x11, 368(R8), X0, X7
	VXORPS X8, X8, X8
	VBLENDVPS X7, X8, X5, X5
	VCMPPS $0x03, X0, X0, X7
	VBLENDVPS X7, X0, X5, X5
	VMOVUPS X5, (DI)(AX*4)
	ADDQ $4, AX
	CMPQ AX, CX
	JLT loop
	VZEROUPPER
	RET
