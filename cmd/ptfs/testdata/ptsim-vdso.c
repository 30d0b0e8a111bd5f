/* A vDSO-heavy loop for ptsim: clock_gettime on six clocks, gettimeofday,
   time and clock_getres, 200 times each, all in the vDSO's code (dumped by
   ptsim, never a file on disk) unless the clock source sends them to the
   kernel. */
#include <stdio.h>
#include <sys/time.h>
#include <time.h>
int main(void) {
	static const clockid_t clocks[] = {CLOCK_REALTIME, CLOCK_MONOTONIC, CLOCK_MONOTONIC_RAW,
		CLOCK_REALTIME_COARSE, CLOCK_MONOTONIC_COARSE, CLOCK_BOOTTIME};
	unsigned long sum = 0;
	struct timespec ts;
	struct timeval tv;
	for (int i = 0; i < 200; i++) {
		clock_gettime(clocks[i % 6], &ts);
		sum += ts.tv_nsec & 1;
		gettimeofday(&tv, NULL);
		sum += tv.tv_usec & 1;
		sum += time(NULL) & 1;
		clock_getres(clocks[i % 6], &ts);
		sum += ts.tv_nsec & 1;
	}
	printf("%lu\n", sum);
	return 0;
}
