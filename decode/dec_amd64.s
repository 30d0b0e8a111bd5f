#include "textflag.h"

// putListSSSE3 (dec_amd64.go) converts a value below 1e16 as two values
// below 1e8 at once: their four 4-digit groups are split into digits in
// 16-bit lanes by multiplications with reciprocals (W. Muła's SSE2
// conversion) and packed into 16 digit bytes, whose leading zeros, counted
// from the value's bit length, one PSHUFB shuffles out.

DATA div10000<>+0x00(SB)/8, $0xd1b71759d1b71759 // 2**45/1e4, rounded up
DATA div10000<>+0x08(SB)/8, $0xd1b71759d1b71759
GLOBL div10000<>(SB), RODATA|NOPTR, $16

DATA ten4<>+0x00(SB)/8, $0x0000271000002710
DATA ten4<>+0x08(SB)/8, $0x0000271000002710
GLOBL ten4<>(SB), RODATA|NOPTR, $16

// A 4-digit group abcd times 4 in each of four lanes, high-multiplied by
// these and then by shiftpow, gives abcd/1000, abcd/100, abcd/10, abcd.
DATA divpow<>+0x00(SB)/8, $0x80003334147b20c5 // 8389, 5243, 13108, 32768
DATA divpow<>+0x08(SB)/8, $0x80003334147b20c5
GLOBL divpow<>(SB), RODATA|NOPTR, $16

DATA shiftpow<>+0x00(SB)/8, $0x8000200008000080 // 128, 2048, 8192, 32768
DATA shiftpow<>+0x08(SB)/8, $0x8000200008000080
GLOBL shiftpow<>(SB), RODATA|NOPTR, $16

DATA tenw<>+0x00(SB)/8, $0x000a000a000a000a
DATA tenw<>+0x08(SB)/8, $0x000a000a000a000a
GLOBL tenw<>(SB), RODATA|NOPTR, $16

DATA asciiz<>+0x00(SB)/8, $0x3030303030303030
DATA asciiz<>+0x08(SB)/8, $0x3030303030303030
GLOBL asciiz<>(SB), RODATA|NOPTR, $16

// shiftz<>+16*z shuffles 16 bytes z places down: the PSHUFB that drops z
// leading zeros.
DATA shiftz<>+0x00(SB)/8, $0x0706050403020100
DATA shiftz<>+0x08(SB)/8, $0x0f0e0d0c0b0a0908
DATA shiftz<>+0x10(SB)/8, $0x0807060504030201
DATA shiftz<>+0x18(SB)/8, $0x800f0e0d0c0b0a09
DATA shiftz<>+0x20(SB)/8, $0x0908070605040302
DATA shiftz<>+0x28(SB)/8, $0x80800f0e0d0c0b0a
DATA shiftz<>+0x30(SB)/8, $0x0a09080706050403
DATA shiftz<>+0x38(SB)/8, $0x8080800f0e0d0c0b
DATA shiftz<>+0x40(SB)/8, $0x0b0a090807060504
DATA shiftz<>+0x48(SB)/8, $0x808080800f0e0d0c
DATA shiftz<>+0x50(SB)/8, $0x0c0b0a0908070605
DATA shiftz<>+0x58(SB)/8, $0x80808080800f0e0d
DATA shiftz<>+0x60(SB)/8, $0x0d0c0b0a09080706
DATA shiftz<>+0x68(SB)/8, $0x8080808080800f0e
DATA shiftz<>+0x70(SB)/8, $0x0e0d0c0b0a090807
DATA shiftz<>+0x78(SB)/8, $0x808080808080800f
DATA shiftz<>+0x80(SB)/8, $0x0f0e0d0c0b0a0908
DATA shiftz<>+0x88(SB)/8, $0x8080808080808080
DATA shiftz<>+0x90(SB)/8, $0x800f0e0d0c0b0a09
DATA shiftz<>+0x98(SB)/8, $0x8080808080808080
DATA shiftz<>+0xa0(SB)/8, $0x80800f0e0d0c0b0a
DATA shiftz<>+0xa8(SB)/8, $0x8080808080808080
DATA shiftz<>+0xb0(SB)/8, $0x8080800f0e0d0c0b
DATA shiftz<>+0xb8(SB)/8, $0x8080808080808080
DATA shiftz<>+0xc0(SB)/8, $0x808080800f0e0d0c
DATA shiftz<>+0xc8(SB)/8, $0x8080808080808080
DATA shiftz<>+0xd0(SB)/8, $0x80808080800f0e0d
DATA shiftz<>+0xd8(SB)/8, $0x8080808080808080
DATA shiftz<>+0xe0(SB)/8, $0x8080808080800f0e
DATA shiftz<>+0xe8(SB)/8, $0x8080808080808080
DATA shiftz<>+0xf0(SB)/8, $0x808080808080800f
DATA shiftz<>+0xf8(SB)/8, $0x8080808080808080
GLOBL shiftz<>(SB), RODATA|NOPTR, $256

// pow10<>+8*t is 10**t.
DATA pow10<>+0x00(SB)/8, $1
DATA pow10<>+0x08(SB)/8, $10
DATA pow10<>+0x10(SB)/8, $100
DATA pow10<>+0x18(SB)/8, $1000
DATA pow10<>+0x20(SB)/8, $10000
DATA pow10<>+0x28(SB)/8, $100000
DATA pow10<>+0x30(SB)/8, $1000000
DATA pow10<>+0x38(SB)/8, $10000000
DATA pow10<>+0x40(SB)/8, $100000000
DATA pow10<>+0x48(SB)/8, $1000000000
DATA pow10<>+0x50(SB)/8, $10000000000
DATA pow10<>+0x58(SB)/8, $100000000000
DATA pow10<>+0x60(SB)/8, $1000000000000
DATA pow10<>+0x68(SB)/8, $10000000000000
DATA pow10<>+0x70(SB)/8, $100000000000000
DATA pow10<>+0x78(SB)/8, $1000000000000000
DATA pow10<>+0x80(SB)/8, $10000000000000000
GLOBL pow10<>(SB), RODATA|NOPTR, $136

// DIGITS turns X, two values below 1e8 in its low and high quadwords, into
// their 16 digits (byte values 0-9, the low value's first), using T and U:
// x/1e4 and x%1e4 by multiplying with a reciprocal, the four 4-digit
// groups in order in words times 4, each spread over four lanes, the low
// value's in X and the high one's in T; the lanes high-multiplied by
// divpow and shiftpow hold a, ab, abc, abcd of a group abcd, and less ten
// times their neighbour a, b, c, d.
#define DIGITS(X, T, U) \
	MOVO     X, T                   \
	PMULULQ  div10000<>(SB), T      \
	PSRLQ    $45, T                 \
	MOVO     T, U                   \
	PMULULQ  ten4<>(SB), U          \
	PSUBQ    U, X                   \
	PSLLQ    $32, X                 \
	POR      T, X                   \
	PACKSSLW X, X                   \
	PSLLW    $2, X                  \
	PUNPCKLWL X, X                  \
	MOVO     X, T                   \
	PUNPCKLLQ X, X                  \
	PUNPCKHLQ T, T                  \
	PMULHUW  X10, X                 \
	PMULHUW  X11, X                 \
	MOVO     X, U                   \
	PMULLW   X12, U                 \
	PSLLQ    $16, U                 \
	PSUBW    U, X                   \
	PMULHUW  X10, T                 \
	PMULHUW  X11, T                 \
	MOVO     T, U                   \
	PMULLW   X12, U                 \
	PSLLQ    $16, U                 \
	PSUBW    U, T                   \
	PACKUSWB T, X

// func putListSSSE3(b *byte, vals *uint64, n int) int
TEXT ·putListSSSE3(SB), NOSPLIT, $0-32
	MOVQ  b+0(FP), DI
	MOVQ  vals+8(FP), SI
	MOVQ  n+16(FP), CX
	TESTQ CX, CX
	JZ    done
	MOVOU divpow<>(SB), X10
	MOVOU shiftpow<>(SB), X11
	MOVOU tenw<>(SB), X12
	PXOR  X13, X13
	MOVOU asciiz<>(SB), X14
	LEAQ  shiftz<>(SB), R13
	LEAQ  pow10<>(SB), R11
	MOVQ  $0xabcc77118461cefd, R9 // 2**90/1e8, rounded up

loop:
	MOVQ  (SI), BX
	ADDQ  $8, SI
	CMPQ  BX, 128(R11)
	JAE   big
	// The leading zeros z = 16 - digits, from the bit length, early:
	// the next value's place then waits for no digit.
	MOVQ  BX, R10
	ORQ   $1, R10                 // 0 has a digit too
	BSRQ  R10, R8
	INCQ  R8
	IMUL3Q $1233, R8, R8
	SHRQ  $12, R8                 // t = digits or digits-1
	MOVQ  $15, R12
	SUBQ  R8, R12
	CMPQ  R10, (R11)(R8*8)
	ADCQ  $0, R12                 // z = 15-t, +1 below 10**t
	MOVQ  BX, AX
	MULQ  R9
	SHRQ  $26, DX                 // hi = v/1e8
	IMUL3Q $100000000, DX, R8
	MOVQ  BX, R10
	SUBQ  R8, R10                 // lo = v%1e8
	MOVQ  DX, X0
	MOVQ  R10, X1
	PUNPCKLQDQ X1, X0
	DIGITS(X0, X1, X2)
	PADDB X14, X0
	MOVQ  R12, AX
	SHLQ  $4, AX
	PSHUFB (R13)(AX*1), X0
	MOVOU X0, (DI)
	ADDQ  $16, DI
	SUBQ  R12, DI

next:
	DECQ  CX
	JZ    done
	MOVW  $0x202c, (DI)           // ", "
	ADDQ  $2, DI
	JMP   loop

big:
	// 17 to 20 digits: hi = v/1e8, lo = v%1e8, top = hi/1e8 (1 to 4
	// digits), mid = hi%1e8.
	MOVQ  BX, AX
	MULQ  R9
	SHRQ  $26, DX
	IMUL3Q $100000000, DX, R8
	MOVQ  BX, R10
	SUBQ  R8, R10
	MOVQ  R10, X3
	MOVQ  DX, R10
	MOVQ  DX, AX
	MULQ  R9
	SHRQ  $26, DX
	IMUL3Q $100000000, DX, R8
	SUBQ  R8, R10
	MOVQ  DX, X0
	MOVQ  R10, X1
	PUNPCKLQDQ X1, X0
	DIGITS(X0, X1, X2)
	DIGITS(X3, X1, X2)
	// The leading zeros of top's eight digits: 4 to 7, since top > 0.
	MOVO  X0, X1
	PCMPEQB X13, X1
	PMOVMSKB X1, AX
	XORL  $0xffff, AX
	BSFL  AX, AX
	PADDB X14, X0
	PADDB X14, X3
	SHLQ  $4, AX
	PSHUFB (R13)(AX*1), X0
	MOVOU X0, (DI)
	SHRQ  $4, AX
	ADDQ  $16, DI
	SUBQ  AX, DI
	MOVQ  X3, (DI)
	ADDQ  $8, DI
	JMP   next

done:
	SUBQ  b+0(FP), DI
	MOVQ  DI, ret+24(FP)
	RET
