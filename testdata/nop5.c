/* nop5: calls hot(i, i+1) N times (argv[1]), as fast as it can or, with
 * argv[2], at that many calls per second (busy-waiting, so the rate holds
 * without sleeps). hot starts with a 5-byte NOP, the cheapest site for any
 * uprobe (and one that ptwrite uprobes always take). */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

__attribute__((noinline, noipa)) unsigned long hot(unsigned long a, unsigned long b)
{
	asm volatile(".byte 0x0f, 0x1f, 0x44, 0x00, 0x00" ::: "memory"); /* nopl 0(%rax,%rax,1) */
	return a * 31 + b;
}

static unsigned long long now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000000000ull + ts.tv_nsec;
}

int main(int argc, char **argv)
{
	unsigned long n = argc > 1 ? strtoul(argv[1], 0, 0) : 100;
	unsigned long rate = argc > 2 ? strtoul(argv[2], 0, 0) : 0;
	unsigned long long start = now_ns();
	unsigned long i, acc = 0;

	for (i = 0; i < n; i++) {
		if (rate)
			while ((now_ns() - start) * rate < i * 1000000000ull)
				;
		acc += hot(i, i + 1);
	}
	printf("acc=%lu\n", acc);
	return 0;
}
