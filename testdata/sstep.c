/* sstep: tells whether ptrace's single-step is exact here over CPUID.
 * A child runs cpuid and then nops, single-stepped by its parent from the
 * cpuid; every step must end at the next instruction. Under some
 * hypervisors CPUID is emulated and the trap flag's #DB after it is lost:
 * the step ends one instruction later, and a recorder that single-steps
 * (ptsim) misses that instruction. Prints "exact" or "skips ADDR" (the
 * instruction whose step was lost), and exits 0 either way; 1 if it
 * cannot tell. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/ptrace.h>
#include <sys/user.h>
#include <sys/wait.h>
#include <unistd.h>

extern char sstep_start[], sstep_nop1[], sstep_nop2[], sstep_end[];

static void body(void)
{
	asm volatile(".globl sstep_start, sstep_nop1, sstep_nop2, sstep_end\n"
		     "sstep_start: xor %%eax, %%eax\n"
		     "cpuid\n"
		     "sstep_nop1: nop\n"
		     "sstep_nop2: nop\n"
		     "sstep_end: nop\n"
		     : : : "eax", "ebx", "ecx", "edx");
}

int main(void)
{
	pid_t pid = fork();
	if (pid < 0)
		return 1;
	if (pid == 0) {
		if (ptrace(PTRACE_TRACEME, 0, 0, 0) < 0)
			_exit(1);
		raise(SIGSTOP);
		body();
		_exit(0);
	}
	int st;
	struct user_regs_struct r;
	if (waitpid(pid, &st, 0) < 0 || !WIFSTOPPED(st))
		return 1;
	/* Run to sstep_start one step at a time: the steps before it are
	 * not under test. */
	for (int i = 0; i < 1000000; i++) {
		if (ptrace(PTRACE_GETREGS, pid, 0, &r) < 0)
			return 1;
		if (r.rip == (unsigned long)sstep_start)
			break;
		if (ptrace(PTRACE_SINGLESTEP, pid, 0, 0) < 0 || waitpid(pid, &st, 0) < 0 || !WIFSTOPPED(st))
			return 1;
	}
	if (r.rip != (unsigned long)sstep_start)
		return 1;
	/* xor, cpuid, nop, nop: each step must end where the next begins. */
	unsigned long want[] = {0, (unsigned long)sstep_nop1, (unsigned long)sstep_nop2, (unsigned long)sstep_end};
	unsigned long prev = r.rip;
	for (int i = 0; i < 4; i++) {
		if (ptrace(PTRACE_SINGLESTEP, pid, 0, 0) < 0 || waitpid(pid, &st, 0) < 0 || !WIFSTOPPED(st))
			return 1;
		if (ptrace(PTRACE_GETREGS, pid, 0, &r) < 0)
			return 1;
		if (i > 0 && r.rip != want[i]) {
			printf("skips %#lx\n", prev);
			kill(pid, SIGKILL);
			return 0;
		}
		prev = r.rip;
	}
	kill(pid, SIGKILL);
	printf("exact\n");
	return 0;
}
