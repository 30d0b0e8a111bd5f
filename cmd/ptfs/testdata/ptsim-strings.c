/* A dynamically linked program for ptsim: ld.so, then libc's string
   functions (AVX2/EVEX variants chosen by the CPU) on long strings. */
#include <stdio.h>
#include <string.h>
#include <stdlib.h>
static char a[5000], b[5000];
int main(int argc, char **argv) {
	memset(a, 'x', sizeof a - 1);
	size_t t = 0;
	for (int i = 0; i < 20; i++) {
		a[4000 - i * 97] = 0;
		t += strlen(a);
		memcpy(b, a, 4000 - i * 50);
		t += strchr(b, 'y') == NULL;
		t += memcmp(a, b, 100 + i);
		a[4000 - i * 97] = 'x';
	}
	printf("%zu\n", t);
	return 0;
}
