/* moved: calls work(i, i+1) N times (argv[1], default 3) and checks the sum
 * against its own arithmetic, exiting 1 when they differ (a probe at a stale
 * offset can corrupt an instruction). Built with -DPAD, a function before
 * work moves it to another offset; with -DGONE, work is called work2. */
#include <stdio.h>
#include <stdlib.h>

#ifdef PAD
__attribute__((noinline, noipa)) void pad(void)
{
	asm volatile(".skip 200, 0x90" ::: "memory");
}
#endif

#ifdef GONE
#define work work2
#endif

__attribute__((noinline, noipa)) unsigned long work(unsigned long a, unsigned long b)
{
	asm volatile("" ::: "memory");
	return a * 1000003 + (b ^ 0x12345678);
}

int main(int argc, char **argv)
{
	unsigned long n = argc > 1 ? strtoul(argv[1], 0, 0) : 3;
	volatile unsigned long k = 1000003, x = 0x12345678;
	unsigned long i, sum = 0, want = 0;

#ifdef PAD
	pad();
#endif
	for (i = 0; i < n; i++) {
		sum += work(i, i + 1);
		want += i * k + ((i + 1) ^ x);
	}
	printf("sum=%lu\n", sum);
	if (sum != want) {
		fprintf(stderr, "wrong sum %lu, want %lu\n", sum, want);
		return 1;
	}
	return 0;
}
