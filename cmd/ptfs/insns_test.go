package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"ptfs/internal/testkit"
)

// insnsKnownFailures are the libipt ptxed expectations ptfs decode --insns
// does not meet yet, each with the reason; what ptfs does instead is in
// docs/DESIGN.md §5 (ptfs decode --insns).
var insnsKnownFailures = map[string]string{
	"ptxed-resync-bad_query-fup-tip": reasonLookahead + "the jnz finds FUP p4 taken (an async branch queued for TIP p5, the lookahead): " +
		"error at p5 (0x1e); the resync's TIP p5 completes it: [interrupt] and l4 listed. ptfs read FUP and TIP: error at 0x21, resumes at FUP p6 + TIP.PGD p7 ([disabled] only)",
	"ptxed-resync-nomap-fup-tip": reasonLookahead + "FUP p4 taken before decoding at 0x100100 (lookahead TIP p5): error at 0x1e, " +
		"[interrupt] to 0x100300, whose FUP p6 is taken (lookahead TIP p7): a second error at 0x24. ptfs: error at 0x21, resumes at FUP p6 + TIP p7 (one error, one interrupt)",
	"ptxed-resync-nomap-mode_exec-fup": reasonLookahead + "MODE.Exec p5 taken before decoding the call's target (queued for FUP p6, the lookahead): " +
		"error at 0x24; the resync's FUP p6 gives l2: [interrupts disabled] and l2 (0x100003) listed. ptfs has not read the MODE.Exec: " +
		"error at 0x22, and resumes with tracing off, so l2 is not listed",
	"ptxed-resync-nomap-mode_tsx-eos": reasonLookahead + "MODE.TSX p4 taken (queued for FUP p5): error at 0x1d; the resync's FUP p5 gives " +
		"[begin transaction] at 0x100200, no code there: error at 0x26 (MODE.TSX p6 taken), [committed] at 0x100300 by FUP p7, then the end. " +
		"ptfs read MODE.TSX and FUP: error at 0x24, [committed], and the last FUP, read on its own while resynchronising, an error (unexpected packet context)",
	"ptxed-resync-nomap-mode_tsx-fup-tip": reasonLookahead + "MODE.TSX abort p5 taken (queued for FUP p6): error at 0x1f; the resync's FUP p6 gives " +
		"[aborted]; an abort leaves the FUP unbound (pt_evt_decode_fup sets bound only when not aborted), so with TIP p7 it is also an async branch: " +
		"[interrupt] to l3, l3 listed. ptfs read MODE.TSX, FUP and TIP: error at 0x27, resumes at FUP p8 + TIP.PGD p9 ([disabled] only)",
	"ptxed-resync-nomap-mode_tsx-tip_pgd": reasonLookahead + "as mode_tsx-eos (errors at 0x1d, 0x26, [begin transaction], [committed]), then TIP.PGD p8 " +
		"taken to reach 0x100300: a third error at the end (0x32) and [disabled]. ptfs: error at 0x24, [committed], [disabled]",
	"ptxed-resync-nomap-psb": reasonLookahead + "the PSB+ p4-p7 taken up to its PSBEND (header events wait for it) before decoding at 0x100100: " +
		"error at 0x34; the resync resumes at its FUP's 0x100200, no code: a second error at 0x37 (TNT p8 cached, lookahead PSB p9). " +
		"ptfs read the whole PSB+: error at 0x36, resumes at PSB p9 (one error)",
	"ptxed-resync-psb-nomap-psb": reasonLookahead + "after syncing at PSB p0 (IP 0x100100) the next PSB+ is taken up to its PSBEND before decoding: " +
		"the first error at 0x34; ptfs has not read that PSB+ yet: 0x1b. The rest is equal",
	"mwait-pwre-exstop_ip-fup-ovf": reasonPwreHW,
	"mwait-pwre-exstop_ip-ovf":     reasonPwreHWOrder,
	"mwait-pwre-ovf":               reasonPwreHW,
	"ovf-pwre-pwrx-tip_pge":        reasonPwreHW,
	"pwre-exstop_ip-pwrx":          reasonPwreHW,
	"tip_pge-pwre-pwrx-tip_pgd":    reasonPwreHW,
}

const (
	// reasonLookahead is libipt's event decoder (pt_event_decoder.c),
	// which ptfs does not model: one packet of lookahead (decoder->packet),
	// an error reported at that packet's offset (pt_evt_get_offset:
	// position minus decoder->packet.size), and, before the flow decodes
	// at a new IP, the packets that open an event taken into its queue,
	// the packet that closes it left as the lookahead: a FUP queues an
	// async branch for the next TIP (pt_evt_decode_fup), MODE.Exec and
	// MODE.TSX queue an event for the FUP after them, PSB+ header
	// packets wait for PSBEND (pt_evt_decode_psbend). pt_insn_resync
	// (pt_blk_resync) goes on from that lookahead with the queue, so it
	// reports the queued events and resumes at the IP they give. ptfs
	// reads an event's packets together when the flow needs them (its
	// error offset is after them, or before a MODE/PSB+ not read yet)
	// and resynchronises at the next packet that gives an IP after what
	// it read, dropping a half-read event. Each case says what that
	// makes of it.
	reasonLookahead   = "libipt's one-packet lookahead and event queue around an error (see reasonLookahead): "
	reasonPwreHW      = "libipt quirk: pttc puts PWRE's hw bit at bit 3 of the payload (pt_pl_pwre_hw_mask), the SDM and Linux perf at bit 7; ptfs follows the SDM, so libipt's [pwre c1.0 hw] prints as [pwre c1.0] (as in the ptdump test's known differences)"
	reasonPwreHWOrder = "the PWRE hw bit quirk (see reasonPwreHW), and libipt reports the PWRE before the MWAIT when the EXSTOP's FUP is lost to an overflow; ptfs keeps MWAIT, EXSTOP, PWRE"
)

var (
	pttOrg   = regexp.MustCompile(`(?m)^org\s+(\S+)`)
	pttOpt   = regexp.MustCompile(`(?m)^;\s*opt:ptxed\s+(.*)$`)
	pttCPU   = regexp.MustCompile(`(?m)^;\s*cpu\s+(\S+)`)
	wsRun    = regexp.MustCompile(`[ \t]+`)
	trailing = regexp.MustCompile(`[ \t]+\n`)
)

// ptxedArgs builds the command line libipt's test runner gives ptxed for
// test name: --raw NAME.bin:ORG [--cpu F/M] OPTS --no-inst --check --pt NAME.pt.
func ptxedArgs(t *testing.T, name string, ptt []byte) []string {
	t.Helper()
	m := pttOrg.FindSubmatch(ptt)
	if m == nil {
		t.Fatalf("%s.ptt: no org", name)
	}
	args := []string{"--raw", name + ".bin:" + string(m[1])}
	if c := pttCPU.FindSubmatch(ptt); c != nil {
		args = append(args, "--cpu", string(c[1]))
	}
	for _, o := range pttOpt.FindAllSubmatch(ptt, -1) {
		args = append(args, strings.Fields(string(o[1]))...)
	}
	return append(args, "--no-inst", "--check", "--pt", name+".pt")
}

// diffB normalises text as diff -b compares it: runs of blanks are one,
// trailing blanks none.
func diffB(s string) string {
	return trailing.ReplaceAllString(wsRun.ReplaceAllString(s, " "), "\n")
}

func TestInsnsLibipt(t *testing.T) {
	dir := filepath.Join(testkit.Corpus(t), "libipt")
	exps, err := filepath.Glob(filepath.Join(dir, "*-ptxed.exp"))
	if err != nil || len(exps) == 0 {
		t.Fatalf("no *-ptxed.exp in %s: %v", dir, err)
	}
	sort.Strings(exps)
	// The runner runs ptxed in the test directory: --raw names in
	// opt:ptxed lines are relative to it.
	t.Chdir(dir)
	var failed []string
	passed := 0
	for _, exp := range exps {
		name := strings.TrimSuffix(filepath.Base(exp), "-ptxed.exp")
		want, err := os.ReadFile(exp)
		if err != nil {
			t.Fatal(err)
		}
		ptt, err := os.ReadFile(name + ".ptt")
		if err != nil {
			t.Fatal(err)
		}
		var got bytes.Buffer
		if err := listInsns(&got, ptxedArgs(t, name, ptt)); err != nil {
			// A refused option: the listing is the error.
			fmt.Fprintf(&got, "error: %v\n", err)
		}
		ok := diffB(got.String()) == diffB(string(want))
		reason, known := insnsKnownFailures[name]
		switch {
		case ok && known:
			t.Errorf("%s: listed as a known failure (%s) but now matches; remove it", name, reason)
		case !ok && !known:
			failed = append(failed, name)
			t.Errorf("%s: listing differs\n--- got\n%s--- want\n%s", name, got.String(), want)
		case ok:
			passed++
		}
	}
	t.Logf("%d of %d libipt ptxed expectations match; %d known failures; unexpected failures (%d): %v",
		passed, len(exps), len(insnsKnownFailures), len(failed), failed)
}

// TestDecodeInsnsCLI runs `ptfs decode --insns` as a user would: a corpus
// test through the command line, and the errors of bad arguments.
func TestDecodeInsnsCLI(t *testing.T) {
	dir := filepath.Join(testkit.Corpus(t), "libipt")
	name := filepath.Join(dir, "loop-tnt")
	want, err := os.ReadFile(name + "-ptxed.exp")
	if err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	if rc := runDecode([]string{"--insns", "--raw", name + ".bin:0x100000", "--no-inst", name + ".pt"}, &out, &errb); rc != 0 {
		t.Fatalf("exit %d: %s", rc, errb.String())
	}
	if diffB(out.String()) != diffB(string(want)) {
		t.Errorf("listing\n--- got\n%s--- want\n%s", out.String(), want)
	}
	for _, tc := range []struct {
		args []string
		rc   int
		msg  string
	}{
		{[]string{"--insns", name + ".pt"}, 2, "no code"},
		{[]string{"--insns", "--raw", name + ".bin:0x100000"}, 2, "no trace file"},
		{[]string{"--insns", "--raw", name + ".bin", name + ".pt"}, 2, "FILE[:START[-END]]:BASE"},
		{[]string{"--insns", "--raw", name + ".bin:0x100000", "--bogus", name + ".pt"}, 2, "unknown option --bogus"},
		{[]string{"--insns", "--raw", name + ".bin:0x100000", "--nom-freq", "300", name + ".pt"}, 2, "too big"},
		{[]string{"--insns", "--raw", name + ".bin:0x100000", "--time", name + ".pt"}, 2, "not supported"},
		{[]string{"--insns", "--raw", name + ".bin:5-1:0x1000", name + ".pt"}, 2, "FILE[:START[-END]]:BASE"},
		{[]string{"--insns", "--raw", name + ".bin:0x100000:0x1000", name + ".pt"}, 2, "beyond"},
		{[]string{"--insns", "--raw", filepath.Join(dir, "missing.bin") + ":0x1000", name + ".pt"}, 1, "no such file"},
	} {
		out.Reset()
		errb.Reset()
		if rc := runDecode(tc.args, &out, &errb); rc != tc.rc || !strings.Contains(errb.String(), tc.msg) {
			t.Errorf("%q: exit %d, stderr %q; want exit %d and %q", tc.args, rc, errb.String(), tc.rc, tc.msg)
		}
	}
}
