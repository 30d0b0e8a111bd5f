/* fetch: exercises every fetcharg form. fetch(neg, &pair, 0, 0, 0, 0, seventh)
 * is called N times (argv[1], default 10); at its entry %di holds -(i+1),
 * +0(%si) the u32 i*3, +4(%si) the s32 -i, and $stack1 the 7th argument i*10. */
#include <stdio.h>
#include <stdlib.h>

struct pair {
	unsigned int x;
	int y;
};

__attribute__((noinline, noipa)) long fetch(long neg, struct pair *p, long c, long d,
					    long e, long f, long seventh)
{
	return neg + p->x + p->y + c + d + e + f + seventh;
}

int main(int argc, char **argv)
{
	long n = argc > 1 ? strtol(argv[1], 0, 0) : 10;
	long i, acc = 0;

	for (i = 0; i < n; i++) {
		struct pair pr = { .x = (unsigned int)(i * 3), .y = (int)-i };
		acc += fetch(-i - 1, &pr, 0, 0, 0, 0, i * 10);
	}
	printf("acc=%ld\n", acc);
	return 0;
}
