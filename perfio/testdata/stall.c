/* stall: on a line of stdin, calls hot(p) with p in a page registered with
 * userfaultfd, then hot(&one). The first read of *p, which only a uprobe's
 * fetch of +0(%di) makes, waits in the kernel, inside the uprobe's
 * handler, until argv[1] ms after the fault; "fault" on stdout says that
 * it waits, "resolving" comes before the thread that resolves it (with a
 * zero page) lets it go on. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

__attribute__((noinline, noipa)) unsigned long hot(unsigned long *p)
{
	asm volatile(".byte 0x0f, 0x1f, 0x44, 0x00, 0x00" ::: "memory"); /* nopl 0(%rax,%rax,1) */
	return (unsigned long)p;
}

static int uffd;
static long page, delay_ms;

static void *resolve(void *arg)
{
	struct uffd_msg msg;
	struct uffdio_zeropage zp = {0};

	(void)arg;
	if (read(uffd, &msg, sizeof(msg)) != sizeof(msg) || msg.event != UFFD_EVENT_PAGEFAULT) {
		perror("stall: read uffd");
		exit(1);
	}
	printf("fault\n");
	fflush(stdout);
	usleep(delay_ms * 1000);
	printf("resolving\n");
	fflush(stdout);
	zp.range.start = msg.arg.pagefault.address & ~(page - 1);
	zp.range.len = page;
	if (ioctl(uffd, UFFDIO_ZEROPAGE, &zp)) {
		perror("stall: UFFDIO_ZEROPAGE");
		exit(1);
	}
	return 0;
}

int main(int argc, char **argv)
{
	struct uffdio_api api = {.api = UFFD_API};
	struct uffdio_register reg = {0};
	static unsigned long one = 1;
	pthread_t th;
	char line[16];
	void *p;

	delay_ms = argc > 1 ? strtol(argv[1], 0, 0) : 1000;
	page = sysconf(_SC_PAGESIZE);
	uffd = syscall(SYS_userfaultfd, O_CLOEXEC);
	if (uffd < 0 || ioctl(uffd, UFFDIO_API, &api)) {
		perror("stall: userfaultfd");
		return 2;
	}
	p = mmap(0, page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED) {
		perror("stall: mmap");
		return 1;
	}
	reg.range.start = (unsigned long)p;
	reg.range.len = page;
	reg.mode = UFFDIO_REGISTER_MODE_MISSING;
	if (ioctl(uffd, UFFDIO_REGISTER, &reg)) {
		perror("stall: UFFDIO_REGISTER");
		return 2;
	}
	if (pthread_create(&th, 0, resolve, 0)) {
		perror("stall: pthread_create");
		return 1;
	}
	if (!fgets(line, sizeof(line), stdin))
		return 1;
	hot(p);
	hot(&one);
	pthread_join(th, 0);
	return 0;
}
