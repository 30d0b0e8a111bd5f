/* target: calls target(i, i+1) and other(i) N times (argv[1], default 100),
 * sleeping argv[2] microseconds between iterations (default 0). */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

__attribute__((noinline, noipa)) unsigned long target(unsigned long a, unsigned long b)
{
	asm volatile("" ::: "memory");
	return a * 31 + b;
}

__attribute__((noinline, noipa)) unsigned long other(unsigned long a)
{
	asm volatile("" ::: "memory");
	return a ^ 0x5a;
}

int main(int argc, char **argv)
{
	unsigned long n = argc > 1 ? strtoul(argv[1], 0, 0) : 100;
	unsigned long delay = argc > 2 ? strtoul(argv[2], 0, 0) : 0;
	unsigned long i, acc = 0;

	for (i = 0; i < n; i++) {
		acc += target(i, i + 1);
		acc += other(i);
		if (delay)
			usleep(delay);
	}
	printf("acc=%lu\n", acc);
	return 0;
}
