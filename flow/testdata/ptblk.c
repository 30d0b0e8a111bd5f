/*
 * ptblk: libipt's block decoder as the reference for ptfs's flow
 * benchmarks.
 *
 *   ptblk TRACE SECTION...
 *
 * SECTION is FILE:OFFSET:SIZE:VADDR (hex numbers): SIZE bytes of FILE from
 * OFFSET, mapped at VADDR (pt_iscache_add_file and pt_image_add_cached,
 * as ptxed does; a later section wins where
 * two overlap). For each line read on stdin, a fresh block decoder decodes
 * all of TRACE (pt_blk_sync_forward, then pt_blk_event/pt_blk_next until
 * the end, resynchronising at the next PSB after an error, as ptxed does)
 * and the answer is "INSNS ERRORS CPUNS": instructions decoded, errors met
 * and the CPU time the pass took (CLOCK_PROCESS_CPUTIME_ID, which other
 * processes on a shared machine do not inflate).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <intel-pt.h>

static void decode(struct pt_config *cfg, struct pt_image *image,
		   uint64_t *insns, uint64_t *errors)
{
	struct pt_block_decoder *dec = pt_blk_alloc_decoder(cfg);
	if (!dec) {
		fprintf(stderr, "pt_blk_alloc_decoder failed\n");
		exit(1);
	}
	if (pt_blk_set_image(dec, image) < 0) {
		fprintf(stderr, "pt_blk_set_image failed\n");
		exit(1);
	}
	*insns = *errors = 0;
	for (;;) {
		int status = pt_blk_sync_forward(dec);
		if (status < 0) {
			if (status == -pte_eos)
				break;
			(*errors)++;
			continue;
		}
		for (;;) {
			while (status & pts_event_pending) {
				struct pt_event ev;
				status = pt_blk_event(dec, &ev, sizeof(ev));
				if (status < 0)
					break;
			}
			if (status < 0)
				break;
			struct pt_block blk = {0};
			status = pt_blk_next(dec, &blk, sizeof(blk));
			*insns += blk.ninsn;
			if (status < 0)
				break;
		}
		if (status == -pte_eos)
			break;
		(*errors)++;
	}
	pt_blk_free_decoder(dec);
}

int main(int argc, char **argv)
{
	if (argc < 3) {
		fprintf(stderr, "usage: ptblk TRACE FILE:OFFSET:SIZE:VADDR...\n");
		return 2;
	}
	FILE *f = fopen(argv[1], "rb");
	if (!f) {
		perror(argv[1]);
		return 1;
	}
	fseek(f, 0, SEEK_END);
	long n = ftell(f);
	fseek(f, 0, SEEK_SET);
	uint8_t *buf = malloc(n);
	if (!buf || fread(buf, 1, n, f) != (size_t)n) {
		fprintf(stderr, "read %s failed\n", argv[1]);
		return 1;
	}
	fclose(f);

	/* Sections through an image section cache, as ptxed adds them:
	 * without one libipt maps and unmaps a file section on every read. */
	struct pt_image_section_cache *iscache = pt_iscache_alloc("bench");
	struct pt_image *image = pt_image_alloc("bench");
	for (int i = 2; i < argc; i++) {
		char name[4096];
		uint64_t off, size, vaddr;
		char *c = strrchr(argv[i], ':'), *b, *a;
		if (!c)
			goto bad;
		*c = 0;
		b = strrchr(argv[i], ':');
		if (!b)
			goto bad;
		*b = 0;
		a = strrchr(argv[i], ':');
		if (!a)
			goto bad;
		*a = 0;
		snprintf(name, sizeof(name), "%s", argv[i]);
		off = strtoull(a + 1, NULL, 16);
		size = strtoull(b + 1, NULL, 16);
		vaddr = strtoull(c + 1, NULL, 16);
		int isid = pt_iscache_add_file(iscache, name, off, size, vaddr);
		int err = isid < 0 ? isid : pt_image_add_cached(image, iscache, isid, NULL);
		if (err < 0) {
			fprintf(stderr, "%s: %s\n", name, pt_errstr(pt_errcode(err)));
			return 1;
		}
		continue;
	bad:
		fprintf(stderr, "bad section %s\n", argv[i]);
		return 2;
	}

	struct pt_config cfg;
	pt_config_init(&cfg);
	cfg.begin = buf;
	cfg.end = buf + n;

	char line[64];
	while (fgets(line, sizeof(line), stdin)) {
		uint64_t insns, errors;
		struct timespec t0, t1;
		clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t0);
		decode(&cfg, image, &insns, &errors);
		clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t1);
		printf("%" PRIu64 " %" PRIu64 " %" PRIu64 "\n", insns, errors,
		       (uint64_t)(t1.tv_sec - t0.tv_sec) * 1000000000 +
			       (uint64_t)t1.tv_nsec - (uint64_t)t0.tv_nsec);
		fflush(stdout);
	}
	pt_image_free(image);
	pt_iscache_free(iscache);
	free(buf);
	return 0;
}
