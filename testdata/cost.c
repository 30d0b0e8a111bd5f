/* cost: calls the function named by argv[1] argv[2] times, each one site
 * of a class of classic uprobe cost (probes.CostClass): site_nop5 starts
 * with the kernel's 5-byte NOP and site_nopw5 with another (optimized),
 * site_nop1 with a 1-byte NOP and site_push with push %rbp (emulated),
 * site_mov with mov %rdi,%rax (single-stepped), site_endbr with endbr64
 * (single-stepped) before a push, site_lock with a lock prefix (refused). Then it prints "trampoline=1" when its
 * memory has the kernel's [uprobes-trampoline] page (an optimized probe
 * was hit), else "trampoline=0", and "xol=1" when it has the kernel's
 * [uprobes] page (the slots the kernel single-steps a probed instruction
 * in: it maps the page at the first hit it does not emulate), else
 * "xol=0". */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SITE(name, bytes)                                         \
	asm(".text\n.p2align 4\n.globl " #name "\n.type " #name ",@function\n" #name ":\n" \
	    bytes "\n.size " #name ", .-" #name "\n")

SITE(site_nop5, ".byte 0x0f,0x1f,0x44,0x00,0x00\nmov %rdi,%rax\nret");
SITE(site_nopw5, ".byte 0x66,0x0f,0x1f,0x40,0x00\nmov %rdi,%rax\nret");
SITE(site_nop1, "nop\nmov %rdi,%rax\nret");
SITE(site_push, "push %rbp\npop %rbp\nmov %rdi,%rax\nret");
SITE(site_mov, "mov %rdi,%rax\nret");
SITE(site_endbr, "endbr64\npush %rbp\npop %rbp\nmov %rdi,%rax\nret");
SITE(site_lock, "lock addl $0,(%rsp)\nmov %rdi,%rax\nret");

unsigned long site_nop5(unsigned long), site_nopw5(unsigned long), site_nop1(unsigned long),
	site_push(unsigned long), site_mov(unsigned long), site_endbr(unsigned long),
	site_lock(unsigned long);

static const struct {
	const char *name;
	unsigned long (*fn)(unsigned long);
} sites[] = {
	{"site_nop5", site_nop5}, {"site_nopw5", site_nopw5}, {"site_nop1", site_nop1},
	{"site_push", site_push}, {"site_mov", site_mov},     {"site_endbr", site_endbr},
	{"site_lock", site_lock},
};

int main(int argc, char **argv)
{
	unsigned long (*volatile fn)(unsigned long) = 0;
	unsigned long i, n, acc = 0;
	char line[512];
	int tramp = 0, xol = 0;
	FILE *maps;

	if (argc < 3) {
		fprintf(stderr, "usage: cost SITE N\n");
		return 2;
	}
	for (i = 0; i < sizeof(sites) / sizeof(sites[0]); i++)
		if (!strcmp(argv[1], sites[i].name))
			fn = sites[i].fn;
	if (!fn) {
		fprintf(stderr, "cost: no site %s\n", argv[1]);
		return 2;
	}
	n = strtoul(argv[2], 0, 0);
	for (i = 0; i < n; i++)
		acc += fn(i);
	maps = fopen("/proc/self/maps", "r");
	while (maps && fgets(line, sizeof(line), maps)) {
		tramp |= strstr(line, "[uprobes-trampoline]") != 0;
		xol |= strstr(line, "[uprobes]\n") != 0;
	}
	if (maps)
		fclose(maps);
	printf("acc=%lu trampoline=%d xol=%d\n", acc, tramp, xol);
	return 0;
}
