package session

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"ptfs/decode/ptenc"
	"ptfs/engine"
	"ptfs/engine/enginetest"
	"ptfs/internal/testkit"
	"ptfs/perfdata"
	"ptfs/tracefs"
	"ptfs/tracefs/tracefstest"
)

// typesSpecs have every type of classic uprobes that ptw mode takes (two
// probes: at most 8 arguments each), where the stub writes u64 and u32
// words and ptfs formats the rest.
var typesSpecs = map[string]string{
	"a": "target a=%di:s64 b=%si:x64 c=%dx:u8 d=%cx:s8 e=%r8:x16 f=%r9:s16 g=%ax:char",
	"b": "other h=%bx:b4@4/32 i=%bp:b12@40/64 j=%sp:s32 k=%di:u16",
}

// ptw mode on the simulated ptwrite kernel: the kernel gets the words its
// stub writes (u32 for the narrow types and the bitfield of a 32-bit
// container, untyped u64 for 8-byte ones, s32 as it is), the probe file
// says which types ptfs formats, and the records print them as a classic
// probe would; with a kernel that refuses typed fetchargs too. A string
// fetch is refused before the kernel sees anything, with the reason in the
// probe file.
func TestPTWTypes(t *testing.T) {
	for _, refuse := range []bool{false, true} {
		t.Run(fmt.Sprintf("refuse-types=%v", refuse), func(t *testing.T) {
			s, tg, k, rep := newPTWSession(t, tracefstest.Options{PTW: true, RefuseTypes: refuse})
			dir := mountSession(t, s)
			probesDir := filepath.Join(dir, "t", "probes")
			group := tracefs.GroupName(os.Getpid(), "t")
			args := map[string]string{"a": "a=%di b=%si c=%dx:u32 d=%cx:u32 e=%r8:u32 f=%r9:u32 g=%ax:u32",
				"b": "h=%bx:u32 i=%bp j=%sp:s32 k=%di:u32"}
			if refuse {
				args = map[string]string{"a": "a=%di b=%si c=%dx d=%cx e=%r8 f=%r9 g=%ax", "b": "h=%bx i=%bp j=%sp k=%di"}
			}
			formatted := map[string]string{"a": "a=s64 b=x64 c=u8 d=s8 e=x16 f=s16 g=char", "b": "h=b4@4/32 i=b12@40/64 k=u16"}
			ids := map[string]uint16{}
			for _, name := range []string{"a", "b"} {
				spec := typesSpecs[name]
				if err := os.WriteFile(filepath.Join(probesDir, name), []byte(spec+"\n"), 0o644); err != nil {
					t.Fatalf("write: %v\n%s", err, readFile(t, probesDir, name))
				}
				off := testkit.FuncOffset(t, tg.path, strings.Fields(spec)[0])
				line := fmt.Sprintf("ptw:%s/%s %s:0x%x %s", group, name, tg.bin.FDPath(), off, args[name])
				text := readFile(t, probesDir, name)
				for _, want := range []string{spec + "\n# state: installed (ptw mode", "# tracefs: " + line + "\n",
					"# ptw: ptfs formats " + formatted[name] + " from the stub's u64/u32 words\n"} {
					if !strings.Contains(text, want) {
						t.Errorf("probe file:\n%s\nwant %q", text, want)
					}
				}
				if refuse != strings.Contains(text, "installed untyped") {
					t.Errorf("probe file:\n%s\nuntyped note wanted: %v", text, refuse)
				}
				id, err := k.Tracefs.EventID(group, name)
				if err != nil {
					t.Fatal(err)
				}
				ids[name] = id
			}
			// The stub's words: 8-byte loads where the kernel took no
			// types, so high bytes carry garbage that ptfs must cut.
			var enc ptenc.Encoder
			enc.PSB()
			enc.TSC(1000)
			enc.PSBEnd()
			enc.Probe(ids["a"], 0x7f0000001000, true, 1<<64-1, 0xdeadbeefcafe1234, 0xffff_ff_fa, 0xaaaa_00fb, 0x1_fed4,
				0xffff_fed4, 0x41)
			enc.TSC(2000)
			enc.Probe(ids["b"], 0x7f0000002000, true, 0xdead_cafe1234, 0xdeadbeefcafe1234, 0x1_ffff_fffe, 0xffff_1234_fffe)
			if err := rep.Queue(enginetest.Batch{0: {enginetest.TimeConv(perfdata.TimeConv{Mult: 1, Zero: 5_000_000_000}),
				enginetest.Side(engine.SideEvent{Kind: engine.SideITraceStart, Time: 5_000_000_000, PID: 1, TID: 2}),
				enginetest.Trace(enc.Bytes())}}); err != nil {
				t.Fatal(err)
			}
			if err := rep.Flush(); err != nil {
				t.Fatal(err)
			}
			got := readFile(t, dir, "t", "records")
			want := fmt.Sprintf("record 1: event=ptfs_t/a id=0x%x args=[a=-1, b=0xdeadbeefcafe1234, c=250, d=-5, e=0xfed4, f=-300, g='A'] tid=2 cpu=0 time=5.000001000 pid=1\n"+
				"record 2: event=ptfs_t/b id=0x%x args=[h=3, i=3518, j=-2, k=65534] tid=2 cpu=0 time=5.000002000 pid=1\n", ids["a"], ids["b"])
			if got != want {
				t.Errorf("records:\n%s\nwant:\n%s", got, want)
			}

			// Strings: refused before the kernel is asked.
			before := len(k.Commands())
			err := tg.SetProbe("s", "target s=+0(%si):string")
			if !errors.Is(err, syscall.EOPNOTSUPP) {
				t.Fatalf("string probe: %v, want EOPNOTSUPP", err)
			}
			text := readFile(t, probesDir, "s")
			if !strings.Contains(text, "# state: refused") || !strings.Contains(text, "cannot copy a string") || !strings.Contains(text, "--mode classic") {
				t.Errorf("probe file of the string probe:\n%s", text)
			}
			if cmds := k.Commands()[before:]; len(cmds) != 0 {
				t.Errorf("the kernel got %q for a string probe", cmds)
			}
		})
	}
}
