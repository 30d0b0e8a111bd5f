/* Test program for package probes: known instruction bytes at known offsets
 * of the function "sites", a page-crossing instruction, a patchable entry of
 * five 1-byte NOPs, a mangled C++ name and an ordinary C function. */
#include <stdio.h>

__asm__(
	".text\n"
	".globl sites\n"
	".type sites, @function\n"
	".balign 4096\n"
	"sites:\n"
	"	.byte 0x0f, 0x1f, 0x44, 0x00, 0x00\n"	/*  0: nopl 5 bytes */
	"	mov %rdi, %rax\n"			/*  5: 48 89 f8 */
	"	.byte 0x90, 0x90, 0x90, 0x90, 0x90\n"	/*  8: aligned multinop */
	"	.byte 0x90, 0x90, 0x90, 0x90, 0x90\n"	/* 13: unaligned multinop */
	"	call sites\n"				/* 18: e8 rel32 */
	"	call *%rax\n"				/* 23: ff d0 */
	"	.byte 0x74, 0x00\n"			/* 25: je rel8 */
	"	syscall\n"				/* 27: 0f 05 */
	"	int3\n"					/* 29: cc */
	"	.byte 0xf3, 0x0f, 0x1e, 0xfa\n"		/* 30: endbr64 */
	"	movabs $0x1122334455667788, %rax\n"	/* 34: 10 bytes */
	"	ret\n"					/* 44: c3 */
	".size sites, .-sites\n"
	".globl pagecross\n"
	".type pagecross, @function\n"
	".org sites + 4093, 0x90\n"
	"pagecross:\n"
	"	mov %rdi, %rax\n"			/* crosses into the next page */
	"	ret\n"
	".size pagecross, .-pagecross\n"
);

__attribute__((noinline, patchable_function_entry(5))) unsigned long
patched(unsigned long a)
{
	return a + 1;
}

/* A mangled C++ name: demangles to ns::fn(int). */
__attribute__((noinline)) int cxx(int a) __asm__("_ZN2ns2fnEi");
__attribute__((noinline)) int cxx(int a)
{
	return a * 3;
}

__attribute__((noinline)) unsigned long
target(unsigned long a, unsigned long b)
{
	__asm__ volatile(".byte 0x0f, 0x1f, 0x44, 0x00, 0x00");
	return a * 31 + b;
}

int main(void)
{
	unsigned long i, acc = 0;
	for (i = 0; i < 100; i++)
		acc += target(i, i + 1) + patched(i) + (unsigned long)cxx((int)i);
	printf("acc=%lu\n", acc);
	return 0;
}
