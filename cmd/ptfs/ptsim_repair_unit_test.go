package main

import (
	"encoding/binary"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// lostRecording writes a small ptsim recording, as ptsim-trace writes one
// on a machine that loses the step after CPUID, and returns its directory.
// Code (a file mapped at 0x400000 from offset 0x1000):
//
//	400000 cpuid           recorded
//	400002 mov %eax,%ebx   lost
//	400004 syscall         recorded: mmap, then snapshot 2 maps 500000
//	400006 jmp 500000      recorded
//	400100 cpuid           recorded, the signal's handler
//	400102 nop             recorded: a step not lost
//	400103 cpuid           recorded, then killed at 400105 (--max)
//
// and anonymous code at 0x500000, dumped at its first instruction
// (snapshot 3):
//
//	500000 cpuid                     recorded
//	500002 mov 0x100(%rsp),%rax      lost
//	50000a cpuid                     recorded, a probe site
//	50000c nop                       lost
//	50000d                           a signal interrupts it
//
// patch may change the code (the file's, the dump's) before it is written.
func lostRecording(t *testing.T, patch func(code, dump []byte)) string {
	t.Helper()
	dir := t.TempDir()
	file := make([]byte, 0x2000)
	code := file[0x1000:]
	for off, b := range map[int][]byte{
		0x000: {0x0f, 0xa2}, 0x002: {0x89, 0xc3}, 0x004: {0x0f, 0x05}, 0x006: {0xe9, 0xf5, 0xff, 0x0f, 0x00},
		0x100: {0x0f, 0xa2}, 0x102: {0x90}, 0x103: {0x0f, 0xa2}, 0x105: {0xc3},
	} {
		copy(code[off:], b)
	}
	dump := make([]byte, 0x1000)
	for off, b := range map[int][]byte{
		0x00: {0x0f, 0xa2}, 0x02: {0x48, 0x8b, 0x84, 0x24, 0x00, 0x01, 0x00, 0x00},
		0x0a: {0x0f, 0xa2}, 0x0c: {0x90}, 0x0d: {0xc3},
	} {
		copy(dump[off:], b)
	}
	if patch != nil {
		patch(code, dump)
	}
	bin := filepath.Join(dir, "code.bin")
	fileMap := "00400000-00401000 r-xp 00001000 fe:00 7 " + bin + "\n"
	anonMap := "00500000-00501000 r-xp 00000000 00:00 0 \n"
	var insns []byte
	for _, ip := range []uint64{0x400000, 0x400004, 0x400006, 0x500000, 0x50000a, 0x400100, 0x400102, 0x400103} {
		insns = binary.LittleEndian.AppendUint64(insns, ip)
	}
	for name, data := range map[string][]byte{
		"code.bin":         file,
		"mem/3-500000.bin": dump,
		"insns.bin":        insns,
		"maps.txt": []byte("# snapshot 0 exec\n" + fileMap +
			"# snapshot 2 syscall\n" + fileMap + anonMap +
			"# snapshot 3 newcode\n" + fileMap + anonMap + "# dump 500000-501000 mem/3-500000.bin\n"),
		"syscalls.txt": []byte("# INDEX syscall IP RESUME nr=N | INDEX signal IP HANDLER sig=N\n" +
			"1 syscall 0x400004 0x400006 nr=9\n" +
			"5 signal 0x50000d 0x400100 sig=14\n" +
			"8 signal 0x400105 death sig=9\n"),
		"probes.txt": []byte("# INDEX IP rdi rsi rdx rcx r8 r9 rsp\n" +
			"4 0x50000a 0x1 0x2 0x3 0x4 0x5 0x6 0x7fffffffe000\n"),
	} {
		path := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// recordingFiles reads the files of a recording that the repair rewrites.
func recordingFiles(t *testing.T, dir string) map[string]string {
	t.Helper()
	files := map[string]string{}
	for _, name := range []string{"insns.bin", "maps.txt", "syscalls.txt", "probes.txt"} {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		files[name] = string(b)
	}
	return files
}

// TestRepairStepLost restores the instructions lost after CPUIDs in a
// synthetic recording (from a file and from a dump that only a later
// snapshot holds; before a recorded instruction and before a signal's
// interrupted IP) and renumbers what follows, and refuses, writing nothing,
// a recording with a gap that is not exactly one instruction that falls
// through.
func TestRepairStepLost(t *testing.T) {
	insns := func(ips ...uint64) string {
		var b []byte
		for _, ip := range ips {
			b = binary.LittleEndian.AppendUint64(b, ip)
		}
		return string(b)
	}
	for _, tc := range []struct {
		name   string
		patch  func(code, dump []byte)
		probes []uint64
		want   string // the error, or "" for the repaired recording below
	}{
		{name: "restored"},
		{name: "probe elsewhere", probes: []uint64{0x50000a}},
		{name: "jump after cpuid", patch: func(code, _ []byte) { copy(code[2:], []byte{0xeb, 0x00}) },
			want: "insn 0: cpuid at 0x400000, then 0x400004: not restored: the instruction at 0x400002 is a jump"},
		{name: "syscall after cpuid", patch: func(_, dump []byte) { copy(dump[2:], []byte{0x0f, 0x05}) },
			want: "insn 3: cpuid at 0x500000, then 0x50000a: not restored: the instruction at 0x500002 is a far transfer"},
		{name: "shorter than the gap", patch: func(code, _ []byte) { copy(code[2:], []byte{0x90, 0x90}) },
			want: "insn 0: cpuid at 0x400000, then 0x400004: not restored: the instruction at 0x400002 is 1 bytes, not 2"},
		{name: "longer than the gap", patch: func(_, dump []byte) { copy(dump[0x0c:], []byte{0x48, 0x90}) /* rex.w nop */ },
			want: "insn 4: cpuid at 0x50000a, then 0x50000d: not restored: the instruction at 0x50000c is 2 bytes, not 1"},
		{name: "undecodable", patch: func(code, _ []byte) { code[2] = 0x06 /* push %es: invalid in 64-bit mode */ },
			want: "insn 0: cpuid at 0x400000, then 0x400004: not restored: the instruction at 0x400002: "},
		{name: "probe site lost", probes: []uint64{0x400002},
			want: "insn 0: cpuid at 0x400000, then 0x400004: not restored: 0x400002 is a probe site"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := lostRecording(t, tc.patch)
			before := recordingFiles(t, dir)
			n, err := repairStepLost(dir, tc.probes)
			if tc.want != "" {
				if err == nil || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("got %d, %v; want the error %q", n, err, tc.want)
				}
				if after := recordingFiles(t, dir); !maps.Equal(before, after) {
					t.Errorf("a refused repair rewrote the recording")
				}
				return
			}
			if err != nil || n != 3 {
				t.Fatalf("got %d, %v; want 3 restored", n, err)
			}
			got := recordingFiles(t, dir)
			bin := filepath.Join(dir, "code.bin")
			fileMap := "00400000-00401000 r-xp 00001000 fe:00 7 " + bin + "\n"
			anonMap := "00500000-00501000 r-xp 00000000 00:00 0 \n"
			for name, want := range map[string]string{
				"insns.bin": insns(0x400000, 0x400002, 0x400004, 0x400006, 0x500000, 0x500002,
					0x50000a, 0x50000c, 0x400100, 0x400102, 0x400103),
				"maps.txt": "# snapshot 0 exec\n" + fileMap +
					"# snapshot 3 syscall\n" + fileMap + anonMap +
					"# snapshot 4 newcode\n" + fileMap + anonMap + "# dump 500000-501000 mem/3-500000.bin\n",
				"syscalls.txt": "# INDEX syscall IP RESUME nr=N | INDEX signal IP HANDLER sig=N\n" +
					"2 syscall 0x400004 0x400006 nr=9\n" +
					"8 signal 0x50000d 0x400100 sig=14\n" +
					"11 signal 0x400105 death sig=9\n",
				"probes.txt": "# INDEX IP rdi rsi rdx rcx r8 r9 rsp\n" +
					"6 0x50000a 0x1 0x2 0x3 0x4 0x5 0x6 0x7fffffffe000\n",
			} {
				if got[name] != want {
					t.Errorf("%s:\n%q\nwant\n%q", name, got[name], want)
				}
			}
			// Whole now: a second repair finds nothing to restore.
			if n, err := repairStepLost(dir, tc.probes); n != 0 || err != nil {
				t.Errorf("second repair: %d, %v", n, err)
			}
		})
	}
}

// TestRepairStepLostEncodes holds the synthetic recording to ptsim's own
// encoder, which checks every instruction against the code and the
// syscall, signal and snapshot indexes: it refuses the recording as
// ptsim-trace wrote it and takes it repaired, with the flow's branches.
func TestRepairStepLostEncodes(t *testing.T) {
	p := newPtsim(t)
	dir := lostRecording(t, nil)
	encode := func() (string, error) {
		b, err := exec.Command(filepath.Join(p.bin, "ptsim-encode"), dir).CombinedOutput()
		return string(b), err
	}
	if out, err := encode(); err == nil || !strings.Contains(out, "insn 0: 0x400000 (len 2) not a branch but next is 0x400004") {
		t.Fatalf("the recording with lost steps: %v\n%s", err, out)
	}
	if n, err := repairStepLost(dir, nil); n != 3 || err != nil {
		t.Fatalf("repair: %d, %v", n, err)
	}
	if out, err := encode(); err != nil {
		t.Fatalf("the repaired recording: %v\n%s", err, out)
	}
	b, err := os.ReadFile(filepath.Join(dir, "expected.branches"))
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"0x400004 => 0x400006 syscall", "0x400006 => 0x500000 jmp", "0x50000d => 0x400100 async"}
	if got := strings.Split(strings.TrimSpace(string(b)), "\n"); !slices.Equal(got, want) {
		t.Errorf("branches %q, want %q", got, want)
	}
}

// TestPtsimEncodeOpts checks that ptsim-run's options become the encoder
// arguments ptsim-run gives and the tracer's probe addresses.
func TestPtsimEncodeOpts(t *testing.T) {
	for _, tc := range []struct {
		opts   []string
		enc    []string
		probes []uint64
		err    string
	}{
		{opts: []string{"--max", "100000"}},
		{opts: []string{"--ptw", "0x401840:7:2", "--psb-period", "16", "--ret-flush-on-disable", "--probe", "4198400"},
			enc:    []string{"-psb-period", "16", "-ret-flush-on-disable", "-ptw", "0x401840:7:2"},
			probes: []uint64{0x401840, 4198400}},
		{opts: []string{"--max"}, err: "ptsim-run option --max: no value"},
		{opts: []string{"--probe", "fib"}, err: `ptsim-run option --probe fib: strconv.ParseUint: parsing "fib": invalid syntax`},
		{opts: []string{"--aslr"}, err: "ptsim-run option --aslr: unknown"},
	} {
		enc, probes, err := ptsimEncodeOpts(tc.opts)
		if tc.err != "" {
			if err == nil || err.Error() != tc.err {
				t.Errorf("%q: error %v, want %q", tc.opts, err, tc.err)
			}
			continue
		}
		if err != nil || !slices.Equal(enc, tc.enc) || !slices.Equal(probes, tc.probes) {
			t.Errorf("%q: %q %#x %v; want %q %#x", tc.opts, enc, probes, err, tc.enc, tc.probes)
		}
	}
}
