/* nop5: calls hot(i, i+1) N times (argv[1]), as fast as it can or, with
 * argv[2] not 0, at that many calls per second (busy-waiting, so the rate
 * holds without sleeps), in each of argv[3] threads (1 by default). hot
 * starts with a 5-byte NOP, the cheapest site for any uprobe (and one that
 * ptwrite uprobes always take). SIGTERM ends the loops early; the program
 * then still prints how many calls each thread made. */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

__attribute__((noinline, noipa)) unsigned long hot(unsigned long a, unsigned long b)
{
	asm volatile(".byte 0x0f, 0x1f, 0x44, 0x00, 0x00" ::: "memory"); /* nopl 0(%rax,%rax,1) */
	return a * 31 + b;
}

static unsigned long n, rate;
static volatile sig_atomic_t stop;

static void on_term(int sig)
{
	(void)sig;
	stop = 1;
}

struct result {
	unsigned long acc, calls;
};

static unsigned long long now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000000000ull + ts.tv_nsec;
}

static void *loop(void *arg)
{
	unsigned long long start = now_ns();
	unsigned long i, acc = 0;

	for (i = 0; i < n && !stop; i++) {
		if (rate)
			while ((now_ns() - start) * rate < i * 1000000000ull && !stop)
				;
		acc += hot(i, i + 1);
	}
	((struct result *)arg)->acc = acc;
	((struct result *)arg)->calls = i;
	return 0;
}

int main(int argc, char **argv)
{
	unsigned long threads = argc > 3 ? strtoul(argv[3], 0, 0) : 1;
	unsigned long i, acc = 0, calls = 0;
	struct result *res;
	pthread_t *tids;

	n = argc > 1 ? strtoul(argv[1], 0, 0) : 100;
	rate = argc > 2 ? strtoul(argv[2], 0, 0) : 0;
	if (threads < 1 || threads > 256) {
		fprintf(stderr, "nop5: threads must be 1 to 256\n");
		return 2;
	}
	signal(SIGTERM, on_term);
	res = calloc(threads, sizeof(*res));
	tids = calloc(threads, sizeof(*tids));
	if (!res || !tids)
		return 1;
	for (i = 1; i < threads; i++)
		if (pthread_create(&tids[i], 0, loop, &res[i])) {
			perror("nop5: pthread_create");
			return 1;
		}
	loop(&res[0]);
	for (i = 1; i < threads; i++)
		pthread_join(tids[i], 0);
	for (i = 0; i < threads; i++) {
		acc += res[i].acc;
		calls += res[i].calls;
	}
	printf("acc=%lu calls=%lu\n", acc, calls);
	return 0;
}
