package main

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"ptfs/internal/testkit"
)

// typesProbes are probes of testdata/types.c with every fetch type of
// classic uprobes, at most 8 arguments each (the struct's layout is in the
// program).
var typesProbes = []struct{ name, fn, args string }{
	{"p1", "types1", "a=+0(%di):s64 ax=+0(%di):x64 au=+0(%di):u64 b=+8(%di):u8 bs=+8(%di):s8 bx=+8(%di):x8 c=+9(%di):char d=+10(%di):s16"},
	{"p2", "types2", "dx=+10(%di):x16 e=+12(%di):u16 f=+16(%di):s32 fx=+16(%di):x32 g=+20(%di):u32 bf=+24(%di):b4@4/32 bf64=+24(%di):b12@40/64 bf8=+24(%di):b3@5/8"},
	{"p3", "types3", "str=+0(%si):string us=+0(%si):ustring nm=+32(%di):string gs=+20(%di):s32"},
}

// TestTypesKernel: every type, on a real mount, against the kernel's own
// trace output for the same hits. Beside each ptfs probe the test makes a
// classic probe of its own (a line ptfs did not make, in its own group, on
// the binary's path) with the same fetchargs, enabled in a tracefs
// instance of its own, and compares each hit's values: numbers as the
// kernel prints them, strings equal once ptfs's escapes are undone (the
// kernel prints a string's bytes raw, newlines and escape sequences
// included), a faulted read as (fault) in both.
func TestTypesKernel(t *testing.T) {
	needKernel(t)
	bin := buildC(t, "types", "types")
	tfs := tracefsDir(t)
	m := startMount(t, "t="+bin)
	const runs = 12
	group := fmt.Sprintf("typesref%d", os.Getpid())
	inst := filepath.Join(tfs, "instances", group)
	if err := os.Mkdir(inst, 0o755); err != nil {
		t.Fatalf("tracefs instance: %v", err)
	}
	t.Cleanup(func() {
		if err := os.Remove(inst); err != nil {
			t.Errorf("remove tracefs instance: %v", err)
		}
	})
	for _, p := range typesProbes {
		spec := p.fn + " " + p.args
		m.setProbe("t", p.name, spec)
		if got := m.probeText("t", p.name); !strings.HasPrefix(got, spec+"\n# state: installed (classic mode") ||
			!strings.Contains(got, " "+p.args+"\n") {
			t.Fatalf("probe file:\n%s", got)
		}
		line := fmt.Sprintf("p:%s/%s %s:0x%x %s", group, p.name, bin, testkit.FuncOffset(t, bin, p.fn), p.args)
		if out, err := shell(fmt.Sprintf("echo %s >> %s", shellQuote(line), filepath.Join(tfs, "uprobe_events"))); err != nil {
			t.Fatalf("reference probe %q: %v: %s", line, err, out)
		}
		t.Cleanup(func() { removeLine(t, line) })
		enable := filepath.Join(inst, "events", group, p.name, "enable")
		if err := os.WriteFile(enable, []byte("1\n"), 0); err != nil {
			t.Fatalf("enable the reference probe: %v", err)
		}
		t.Cleanup(func() {
			if err := os.WriteFile(enable, []byte("0\n"), 0); err != nil {
				t.Errorf("disable the reference probe: %v", err)
			}
		})
	}
	runProg(t, bin, strconv.Itoa(runs))
	records := m.waitLines(3*runs, "t", "records")
	if err := os.WriteFile(filepath.Join(inst, "events", group, "enable"), []byte("0\n"), 0); err != nil {
		t.Fatal(err)
	}
	trace, err := os.ReadFile(filepath.Join(inst, "trace"))
	if err != nil {
		t.Fatal(err)
	}
	kernel := kernelHits(t, string(trace))
	ours := map[string][]string{}
	recRE := regexp.MustCompile(`^record \d+: event=ptfs_t/(p\d) id=0x[0-9a-f]+ args=\[(.*)\] tid=(\d+) cpu=\d+ time=\d+\.\d{9} pid=\d+ comm=types$`)
	for _, l := range records {
		mk := recRE.FindStringSubmatch(l)
		if mk == nil {
			t.Fatalf("record line %q", l)
		}
		ours[mk[1]] = append(ours[mk[1]], mk[3]+" "+mk[2])
	}
	checked := 0
	for _, p := range typesProbes {
		names := argNames(p.args)
		k, o := kernel[p.name], ours[p.name]
		if len(k) != runs || len(o) != runs {
			t.Fatalf("probe %s: %d kernel hits, %d records, want %d each\ntrace:\n%s\nrecords:\n%s",
				p.name, len(k), len(o), runs, trace, strings.Join(records, "\n"))
		}
		for i := range runs {
			ktid, kargs, _ := strings.Cut(k[i], " ")
			otid, oargs, _ := strings.Cut(o[i], " ")
			kv, ov := splitArgs(kargs, names, " "), splitArgs(oargs, names, ", ")
			if ktid != otid || kv == nil || ov == nil {
				t.Fatalf("probe %s hit %d: kernel %q, ptfs %q", p.name, i, k[i], o[i])
			}
			for j, n := range names {
				if got, want := unescape(t, ov[j]), kv[j]; got != want {
					t.Errorf("probe %s hit %d: %s: ptfs %q (%q), kernel %q", p.name, i, n, ov[j], got, want)
				}
				checked++
			}
		}
	}
	// The values the program chose, as a check of the check: the kernel
	// and ptfs could agree on garbage.
	want := []string{`a=-1, ax=0xffffffffffffffff, au=18446744073709551615, b=250, bs=-6, bx=0xfa, c='A', d=-300`,
		`dx=0xfed4, e=65000, f=-70000, fx=0xfffeee90, g=4000000000, bf=3, bf64=3518, bf8=1`,
		`str="plain", us="plain", nm="even \"n\"", gs=-294967296`,
		`str="", us="", nm="odd"`,
		`str="tab\there \"q\" back\\slash"`,
		`str="esc\x1b[31m \xc3\xa9 nl\nend"`,
		`str="a, b=c] d"`,
		`str=(fault), us=(fault), nm="odd"`}
	all := strings.Join(records, "\n")
	for _, w := range want {
		if !strings.Contains(all, w) {
			t.Errorf("records lack %q:\n%s", w, all)
		}
	}
	t.Logf("%d values of %d hits equal to the kernel's", checked, 3*runs)
}

// kernelHits returns the hits of each event in a trace file: "PID ARGS" per
// hit, in order. A hit's text runs to the next hit's header: a string may
// hold a newline.
func kernelHits(t *testing.T, trace string) map[string][]string {
	t.Helper()
	hdr := regexp.MustCompile(`(?m)^ +\S+-(\d+) +\[\d+\] \S+ +\d+\.\d+: (p\d): \(0x[0-9a-f]+\) `)
	locs := hdr.FindAllStringSubmatchIndex(trace, -1)
	hits := map[string][]string{}
	for i, l := range locs {
		end := len(trace)
		if i+1 < len(locs) {
			end = locs[i+1][0]
		}
		ev := trace[l[4]:l[5]]
		hits[ev] = append(hits[ev], trace[l[2]:l[3]]+" "+strings.TrimSuffix(trace[l[1]:end], "\n"))
	}
	return hits
}

// argNames returns the names of a spec's arguments.
func argNames(args string) []string {
	var names []string
	for _, a := range strings.Fields(args) {
		n, _, _ := strings.Cut(a, "=")
		names = append(names, n)
	}
	return names
}

// splitArgs cuts "n1=V1<sep>n2=V2..." at the known names, or nil.
func splitArgs(s string, names []string, sep string) []string {
	var vals []string
	for i, n := range names {
		rest, ok := strings.CutPrefix(s, n+"=")
		if !ok {
			return nil
		}
		end := len(rest)
		if i+1 < len(names) {
			if end = strings.Index(rest, sep+names[i+1]+"="); end < 0 {
				return nil
			}
		}
		vals = append(vals, rest[:end])
		if i+1 < len(names) {
			s = rest[end+len(sep):]
		}
	}
	return vals
}

// unescape undoes ptfs's escapes of a quoted string or char, so that it
// compares with the kernel's raw bytes; other values stay as they are.
func unescape(t *testing.T, v string) string {
	if len(v) < 2 || v[0] != '"' && v[0] != '\'' {
		return v
	}
	var b strings.Builder
	for i := 1; i < len(v)-1; i++ {
		c := v[i]
		if c != '\\' {
			b.WriteByte(c)
			continue
		}
		i++
		switch v[i] {
		case 'n':
			b.WriteByte('\n')
		case 't':
			b.WriteByte('\t')
		case 'r':
			b.WriteByte('\r')
		case 'x':
			n, err := strconv.ParseUint(v[i+1:i+3], 16, 8)
			if err != nil {
				t.Fatalf("bad escape in %q", v)
			}
			b.WriteByte(byte(n))
			i += 2
		default:
			b.WriteByte(v[i])
		}
	}
	return string(v[0]) + b.String() + string(v[len(v)-1])
}
