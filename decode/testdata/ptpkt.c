/*
 * ptpkt: libipt's packet decoder as a reference for ptfs's tests.
 *
 *   ptpkt dump FILE    one line per packet: hex offset, type, fields; an
 *                      "OFFSET error CODE" line for bytes that do not decode,
 *                      then a resync with pt_pkt_sync_forward.
 *   ptpkt bench FILE   for each line read on stdin, decode all of FILE
 *                      (counting packets, printing nothing) and answer with
 *                      the packet count; for benchmarks.
 *
 * Decoding starts at offset 0 (pt_pkt_sync_set), as ptfs's decoder does.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <intel-pt.h>

static const char *errname(int err)
{
	switch (pt_errcode(err)) {
	case pte_bad_opc:
		return "bad_opc";
	case pte_bad_packet:
		return "bad_packet";
	case pte_eos:
		return "eos";
	default:
		return pt_errstr(pt_errcode(err));
	}
}

static void print(uint64_t off, const struct pt_packet *p)
{
	printf("%" PRIx64 " ", off);
	switch (p->type) {
	case ppt_pad: puts("pad"); break;
	case ppt_psb: puts("psb"); break;
	case ppt_psbend: puts("psbend"); break;
	case ppt_stop: puts("stop"); break;
	case ppt_ovf: puts("ovf"); break;
	case ppt_tnt_8:
	case ppt_tnt_64:
		printf("%s %u %" PRIx64 "\n", p->type == ppt_tnt_8 ? "tnt.8" : "tnt.64",
		       p->payload.tnt.bit_size, p->payload.tnt.payload);
		break;
	case ppt_fup:
	case ppt_tip:
	case ppt_tip_pge:
	case ppt_tip_pgd:
		printf("%s %d %" PRIx64 "\n",
		       p->type == ppt_fup ? "fup" : p->type == ppt_tip ? "tip" :
		       p->type == ppt_tip_pge ? "tip.pge" : "tip.pgd",
		       (int)p->payload.ip.ipc, p->payload.ip.ip);
		break;
	case ppt_mode:
		if (p->payload.mode.leaf == pt_mol_exec)
			printf("mode.exec %u %u\n", p->payload.mode.bits.exec.csl,
			       p->payload.mode.bits.exec.csd);
		else
			printf("mode.tsx %u %u\n", p->payload.mode.bits.tsx.intx,
			       p->payload.mode.bits.tsx.abrt);
		break;
	case ppt_pip:
		printf("pip %" PRIx64 " %u\n", p->payload.pip.cr3, p->payload.pip.nr);
		break;
	case ppt_vmcs: printf("vmcs %" PRIx64 "\n", p->payload.vmcs.base); break;
	case ppt_cbr: printf("cbr %u\n", p->payload.cbr.ratio); break;
	case ppt_tsc: printf("tsc %" PRIx64 "\n", p->payload.tsc.tsc); break;
	case ppt_tma: printf("tma %x %x\n", p->payload.tma.ctc, p->payload.tma.fc); break;
	case ppt_mtc: printf("mtc %x\n", p->payload.mtc.ctc); break;
	case ppt_cyc: printf("cyc %" PRIx64 "\n", p->payload.cyc.value); break;
	case ppt_mnt: printf("mnt %" PRIx64 "\n", p->payload.mnt.payload); break;
	case ppt_exstop: printf("exstop %u\n", p->payload.exstop.ip); break;
	case ppt_mwait:
		printf("mwait %x %x\n", p->payload.mwait.hints, p->payload.mwait.ext);
		break;
	case ppt_pwre:
		/* The HW flag is left out: libipt reads it from bit 3, the SDM
		 * (and ptfs) from bit 7. */
		printf("pwre %x %x\n", p->payload.pwre.state, p->payload.pwre.sub_state);
		break;
	case ppt_pwrx:
		printf("pwrx %x %x %x\n", p->payload.pwrx.last, p->payload.pwrx.deepest,
		       p->payload.pwrx.interrupt | p->payload.pwrx.store << 2 |
		       p->payload.pwrx.autonomous << 3);
		break;
	case ppt_ptw:
		printf("ptw %d %" PRIx64 " %u\n", pt_ptw_size(p->payload.ptw.plc),
		       p->payload.ptw.payload, p->payload.ptw.ip);
		break;
	default:
		printf("type%d\n", (int)p->type);
	}
}

/* decode walks the whole buffer; with out set it prints, else it counts. */
static long decode(struct pt_packet_decoder *d, size_t len, int out)
{
	struct pt_packet pkt;
	long n = 0;
	int err = pt_pkt_sync_set(d, 0);

	while (err >= 0) {
		uint64_t off;

		pt_pkt_get_offset(d, &off);
		err = pt_pkt_next(d, &pkt, sizeof(pkt));
		if (err >= 0) {
			n++;
			if (out)
				print(off, &pkt);
			continue;
		}
		if (off >= len)
			break;
		if (out)
			printf("%" PRIx64 " error %s\n", off, errname(err));
		if (pt_errcode(err) == pte_eos)
			break;
		err = pt_pkt_sync_forward(d);
	}
	return n;
}

int main(int argc, char **argv)
{
	struct pt_packet_decoder *d;
	struct pt_config cfg;
	uint8_t *buf;
	long len;
	FILE *f;

	if (argc != 3 || (strcmp(argv[1], "dump") && strcmp(argv[1], "bench"))) {
		fprintf(stderr, "usage: ptpkt dump|bench FILE\n");
		return 2;
	}
	f = fopen(argv[2], "rb");
	if (!f || fseek(f, 0, SEEK_END) || (len = ftell(f)) < 0 || fseek(f, 0, SEEK_SET)) {
		perror(argv[2]);
		return 1;
	}
	buf = malloc(len ? len : 1);
	if (!buf || fread(buf, 1, len, f) != (size_t)len) {
		perror(argv[2]);
		return 1;
	}
	fclose(f);
	pt_config_init(&cfg);
	cfg.begin = buf;
	cfg.end = buf + len;
	d = pt_pkt_alloc_decoder(&cfg);
	if (!d) {
		fprintf(stderr, "pt_pkt_alloc_decoder failed\n");
		return 1;
	}
	if (!strcmp(argv[1], "dump")) {
		decode(d, len, 1);
	} else {
		char line[64];

		while (fgets(line, sizeof(line), stdin)) {
			printf("%ld\n", decode(d, len, 0));
			fflush(stdout);
		}
	}
	pt_pkt_free_decoder(d);
	free(buf);
	return fflush(stdout) ? 1 : 0;
}
