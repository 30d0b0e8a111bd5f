// Test program for the capture package: calls target(i, i+1) and
// target2(-i, &pair) and target_nop(i, i+1) n times, optionally pinned to one CPU.
// Usage: target N [CPU [RATE]]: CPU -1 runs anywhere; RATE > 0 paces the
// iterations to RATE per second, steadily: a program kept off the CPU goes
// on at RATE from where it is instead of catching up in a burst (which,
// at several times RATE, was a faster stream than the one claimed).
#define _GNU_SOURCE
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

struct pair {
	int x;
	unsigned int y;
};

// noipa keeps gcc from cloning or specialising the probed functions.
__attribute__((noinline, noipa)) long target(long a, long b)
{
	__asm__ volatile("" ::: "memory");
	return a + b;
}

__attribute__((noinline, noipa)) long target2(long a, struct pair *p)
{
	__asm__ volatile("" ::: "memory");
	return a + p->x + p->y;
}

// target_nop starts with a 5-byte NOP, which uprobes emulate: the cheapest
// probe site, for rate tests. Written in assembly to keep the NOP first.
__asm__(".text\n"
	".globl target_nop\n"
	".type target_nop, @function\n"
	"target_nop:\n"
	"	.byte 0x0f, 0x1f, 0x44, 0x00, 0x00\n"
	"	mov %rdi, %rax\n"
	"	sub %rsi, %rax\n"
	"	ret\n"
	".size target_nop, .-target_nop\n");
long target_nop(long a, long b);

int main(int argc, char **argv)
{
	long n = argc > 1 ? atol(argv[1]) : 10;
	int cpu = argc > 2 ? atoi(argv[2]) : -1;
	long rate = argc > 3 ? atol(argv[3]) : 0;
	struct timespec t0, now;
	volatile long sink = 0;

	if (cpu >= 0) {
		cpu_set_t set;
		CPU_ZERO(&set);
		CPU_SET(cpu, &set);
		if (sched_setaffinity(0, sizeof set, &set) != 0) {
			perror("sched_setaffinity");
			return 2;
		}
	}
	double behind = 0; // seconds the schedule moved on after a delay
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (long i = 0; i < n; i++) {
		if (rate > 0) {
			double due = (double)i / rate + behind, at;
			do {
				clock_gettime(CLOCK_MONOTONIC, &now);
				at = (now.tv_sec - t0.tv_sec) + (now.tv_nsec - t0.tv_nsec) / 1e9;
			} while (at < due);
			// Over a millisecond late: start again from now.
			if (at - due > 1e-3)
				behind += at - due;
		}
		struct pair p = {(int)(i * 7), 0xdead0000u + (unsigned int)i};
		sink += target(i, i + 1);
		sink += target2(-i, &p);
		sink += target_nop(i, i + 1);
	}
	return sink == 42;
}
