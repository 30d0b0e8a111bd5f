// procs: processes and threads for the pid=/comm= and %return tests of
// ptfs (issue 12). hit(a, b) is the probe site (b is always the caller's
// pid or tid), fib the recursive function of return probes. Modes:
//   procs fork EXEC   the parent hits, a child renames itself "child" and
//                     hits, a second child hits and then execs EXEC (a
//                     link to this program under another name) as "run 1"
//   procs threads N   the main thread and N threads named "worker" hit
//   procs fib N       fib(N), then hit(0, fib(N))
//   procs run K       hit K times
//   procs wait K      after a byte on stdin, hit K times
// Every mode waits for stdin to close before it exits, so that its
// processes are alive (and /proc names them) until the test has read them.
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

__attribute__((noinline)) long hit(long a, long b) {
	__asm__ volatile("" ::: "memory");
	return a + b;
}

__attribute__((noinline)) long fib(long n) {
	if (n < 2)
		return n;
	return fib(n - 1) + fib(n - 2);
}

static void wait_eof(void) {
	char buf[64];
	while (read(0, buf, sizeof buf) > 0)
		;
}

static void *worker(void *arg) {
	pthread_setname_np(pthread_self(), "worker");
	hit((long)arg, gettid());
	return NULL;
}

int main(int argc, char **argv) {
	if (argc < 3)
		return 2;
	if (!strcmp(argv[1], "fork")) {
		hit(0, getpid());
		pid_t c1 = fork();
		if (c1 == 0) {
			prctl(PR_SET_NAME, "child");
			hit(1, getpid());
			wait_eof();
			return 0;
		}
		pid_t c2 = fork();
		if (c2 == 0) {
			hit(2, getpid());
			execl(argv[2], argv[2], "run", "1", (char *)NULL);
			return 3;
		}
		int st1, st2;
		waitpid(c1, &st1, 0);
		waitpid(c2, &st2, 0);
		return WIFEXITED(st1) && WEXITSTATUS(st1) == 0 && WIFEXITED(st2) && WEXITSTATUS(st2) == 0 ? 0 : 1;
	}
	if (!strcmp(argv[1], "threads")) {
		int n = atoi(argv[2]);
		pthread_t t[64];
		if (n < 0 || n > 64)
			return 2;
		hit(0, gettid());
		for (int i = 0; i < n; i++)
			pthread_create(&t[i], NULL, worker, (void *)(long)(i + 1));
		for (int i = 0; i < n; i++)
			pthread_join(t[i], NULL);
		wait_eof();
		return 0;
	}
	if (!strcmp(argv[1], "fib")) {
		hit(0, fib(atol(argv[2])));
		wait_eof();
		return 0;
	}
	if (!strcmp(argv[1], "wait") || !strcmp(argv[1], "run")) {
		long k = atol(argv[2]);
		char c;
		if (!strcmp(argv[1], "wait") && read(0, &c, 1) != 1)
			return 4;
		for (long i = 0; i < k; i++)
			hit(i, getpid());
		wait_eof();
		return 0;
	}
	return 2;
}
