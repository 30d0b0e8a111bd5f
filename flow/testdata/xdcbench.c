/*
 * xdcbench: libxdc (github.com/nyx-fuzz/libxdc, built apart and found
 * through PTFS_LIBXDC: none of its code is in this repository) as the
 * reference for ptfs's flow benchmarks, through its public API (libxdc.h)
 * only.
 *
 *   xdcbench TRACE ADDR DUMP START END
 *   xdcbench -edges TRACE ADDR DUMP START END
 *
 * ADDR and DUMP are a page dump as kAFL writes one: ADDR a list of
 * little-endian u64 page addresses, DUMP the 4 KiB pages in the same order
 * (an address with any of its low 12 bits set names a page that was not
 * mapped, as in kAFL's page cache). libxdc reads code only through its page
 * fetch callback, which answers from the dump. START and END (hex) are
 * libxdc's filter: the one IP range it decodes.
 *
 * With -edges, a fresh decoder in libxdc's trace mode decodes TRACE once
 * and prints every edge its edge callback reports, "SRC->DST" in hex as
 * libxdc's own tester writes them; the exit status is 0 only if libxdc
 * says decoder_success or decoder_success_pt_overflow.
 *
 * Otherwise, for each line read on stdin ("warm", "cold" or "warm-edges")
 * one pass decodes all of TRACE and the answer is "RESULT HASH EDGES
 * CPUNS": libxdc's decoder_result_t, the hash of the coverage bitmap the
 * pass filled (libxdc_bitmap_get_hash; the bitmap is cleared before each
 * pass), the edges the edge callback reported (warm-edges only, else 0)
 * and the CPU time of the pass (CLOCK_PROCESS_CPUTIME_ID, which other
 * processes on a shared machine do not inflate; the harness has one
 * thread). warm decodes with one decoder kept across passes, as libxdc's
 * own benchmark (libxdc_experiments, experiments/libxdc/main.c) repeats
 * libxdc_decode on one decoder: its trace cache, filled by the first pass,
 * replays whole runs of TNT bits into the bitmap. cold makes a fresh
 * decoder for the pass (libxdc_init and libxdc_free timed, as a fresh
 * libipt decoder is in ptblk.c). warm-edges is warm in libxdc's trace
 * mode, where each edge goes to the edge callback as ptfs hands edges to
 * its Handler: libxdc then walks its control-flow graph for every branch
 * and does not use its trace cache.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <libxdc.h>

#define PAGE 4096
#define BITMAP_SIZE 0x10000 /* kAFL's and libxdc_experiments' size */

struct pages {
	uint64_t *addr; /* sorted */
	uint8_t **data;
	size_t n;
	uint64_t last_addr; /* a decoder asks for one page many times in a row */
	uint8_t *last_data;
};

static uint8_t *read_file(const char *path, size_t *size, size_t pad)
{
	FILE *f = fopen(path, "rb");
	if (!f) {
		perror(path);
		exit(1);
	}
	fseek(f, 0, SEEK_END);
	long n = ftell(f);
	fseek(f, 0, SEEK_SET);
	uint8_t *buf = malloc(n + pad);
	if (!buf || fread(buf, 1, n, f) != (size_t)n) {
		fprintf(stderr, "read %s failed\n", path);
		exit(1);
	}
	fclose(f);
	*size = n;
	return buf;
}

static struct pages *sort_pages;

static int by_addr(const void *a, const void *b)
{
	uint64_t x = sort_pages->addr[*(const size_t *)a];
	uint64_t y = sort_pages->addr[*(const size_t *)b];
	return x < y ? -1 : x > y;
}

static void load_pages(struct pages *p, const char *addr_path, const char *dump_path)
{
	size_t addr_size, dump_size;
	uint64_t *addr = (uint64_t *)read_file(addr_path, &addr_size, 0);
	uint8_t *dump = read_file(dump_path, &dump_size, 0);
	size_t n = addr_size / 8;
	if (dump_size < n * PAGE) {
		fprintf(stderr, "%s: %zu pages listed, %zu bytes of pages\n", dump_path, n, dump_size);
		exit(1);
	}
	size_t *order = malloc(n * sizeof(*order));
	p->addr = malloc(n * sizeof(*p->addr));
	p->data = malloc(n * sizeof(*p->data));
	p->n = 0;
	for (size_t i = 0; i < n; i++) {
		uint64_t a;
		memcpy(&a, &addr[i], 8);
		if (a & (PAGE - 1))
			continue; /* kAFL's mark of a page it could not dump */
		p->addr[p->n] = a;
		p->data[p->n] = dump + i * PAGE;
		order[p->n] = p->n;
		p->n++;
	}
	/* Sort addresses and pages together through an index. */
	sort_pages = p;
	qsort(order, p->n, sizeof(*order), by_addr);
	uint64_t *sa = malloc(p->n * sizeof(*sa));
	uint8_t **sd = malloc(p->n * sizeof(*sd));
	for (size_t i = 0; i < p->n; i++) {
		sa[i] = p->addr[order[i]];
		sd[i] = p->data[order[i]];
	}
	free(p->addr);
	free(p->data);
	free(order);
	free(addr);
	p->addr = sa;
	p->data = sd;
	p->last_addr = UINT64_MAX;
	p->last_data = NULL;
}

/* fetch is libxdc's page fetch callback: the page at addr's page, or
 * *success false. */
static void *fetch(void *opaque, uint64_t addr, bool *success)
{
	struct pages *p = opaque;
	uint64_t page = addr & ~(uint64_t)(PAGE - 1);
	if (page == p->last_addr) {
		*success = true;
		return p->last_data;
	}
	size_t lo = 0, hi = p->n;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		if (p->addr[mid] < page)
			lo = mid + 1;
		else
			hi = mid;
	}
	if (lo == p->n || p->addr[lo] != page) {
		*success = false;
		return NULL;
	}
	p->last_addr = page;
	p->last_data = p->data[lo];
	*success = true;
	return p->last_data;
}

/* libxdc's release 2 added the disassembler mode to the edge callback;
 * release 1 (the libxdc of libxdc_experiments) has none. */
#if LIBXDC_RELEASE_VERSION >= 2
#define EDGE_ARGS void *opaque, __attribute__((unused)) disassembler_mode_t mode, uint64_t src, uint64_t dst
#else
#define EDGE_ARGS void *opaque, uint64_t src, uint64_t dst
#endif

static void print_edge(EDGE_ARGS)
{
	(void)opaque;
	printf("%" PRIx64 "->%" PRIx64 "\n", src, dst);
}

static void count_edge(EDGE_ARGS)
{
	(void)src;
	(void)dst;
	(*(uint64_t *)opaque)++;
}

static libxdc_t *new_decoder(uint64_t filter[4][2], struct pages *pages, uint8_t *bitmap)
{
	libxdc_t *d = libxdc_init(filter, fetch, pages, bitmap, BITMAP_SIZE);
	if (!d || d == (void *)-1) {
		fprintf(stderr, "libxdc_init failed\n");
		exit(1);
	}
	return d;
}

static uint64_t cpu_ns(void)
{
	struct timespec t;
	clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
	return (uint64_t)t.tv_sec * 1000000000 + (uint64_t)t.tv_nsec;
}

int main(int argc, char **argv)
{
	int edges_only = argc > 1 && strcmp(argv[1], "-edges") == 0;
	if (argc != 6 + edges_only) {
		fprintf(stderr, "usage: xdcbench [-edges] TRACE ADDR DUMP START END\n");
		return 2;
	}
	argv += edges_only;

	/* libxdc_decode asserts the byte after the trace is PT_TRACE_END;
	 * its packet reads may look up to 8 bytes past a packet. */
	size_t len;
	uint8_t *trace = read_file(argv[1], &len, 16);
	memset(trace + len, PT_TRACE_END, 16);

	struct pages pages;
	load_pages(&pages, argv[2], argv[3]);

	uint64_t filter[4][2] = {{0}};
	filter[0][0] = strtoull(argv[4], NULL, 16);
	filter[0][1] = strtoull(argv[5], NULL, 16);
	uint8_t *bitmap = calloc(1, BITMAP_SIZE);

	if (edges_only) {
		libxdc_t *d = new_decoder(filter, &pages, bitmap);
		libxdc_enable_tracing(d);
		libxdc_register_edge_callback(d, print_edge, NULL);
		decoder_result_t r = libxdc_decode(d, trace, len);
		libxdc_free(d);
		if (fflush(stdout) != 0)
			return 1;
		/* An OVF packet in the trace (mruby has one) is a success
		 * for libxdc too. */
		if (r != decoder_success && r != decoder_success_pt_overflow) {
			fprintf(stderr, "libxdc_decode: result %d\n", r);
			return 1;
		}
		return 0;
	}

	libxdc_t *warm = new_decoder(filter, &pages, bitmap);
	uint64_t edges = 0;
	libxdc_t *warm_edges = new_decoder(filter, &pages, bitmap);
	libxdc_enable_tracing(warm_edges);
	libxdc_register_edge_callback(warm_edges, count_edge, &edges);

	char line[64];
	while (fgets(line, sizeof(line), stdin)) {
		line[strcspn(line, "\n")] = 0;
		libxdc_t *d;
		if (strcmp(line, "warm") == 0)
			d = warm;
		else if (strcmp(line, "warm-edges") == 0)
			d = warm_edges;
		else if (strcmp(line, "cold") == 0)
			d = NULL;
		else {
			fprintf(stderr, "xdcbench: unknown request %s\n", line);
			return 2;
		}
		/* Cleared outside the timing, so that each pass's hash is its
		 * own bitmap: libxdc_experiments never clears it. */
		memset(bitmap, 0, BITMAP_SIZE);
		edges = 0;
		uint64_t t0 = cpu_ns();
		int cold = d == NULL;
		if (cold)
			d = new_decoder(filter, &pages, bitmap);
		decoder_result_t r = libxdc_decode(d, trace, len);
		uint64_t cpu = cpu_ns() - t0;
		uint64_t hash = libxdc_bitmap_get_hash(d); /* untimed */
		if (cold) {
			t0 = cpu_ns();
			libxdc_free(d);
			cpu += cpu_ns() - t0;
		}
		printf("%d %" PRIx64 " %" PRIu64 " %" PRIu64 "\n", (int)r, hash, edges, cpu);
		fflush(stdout);
	}
	libxdc_free(warm);
	libxdc_free(warm_edges);
	return 0;
}
