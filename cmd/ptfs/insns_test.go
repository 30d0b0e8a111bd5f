package main

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"ptfs/internal/testkit"
)

// insnsKnownFailures are the libipt ptxed expectations ptfs decode --insns
// does not meet, each with the reason.
var insnsKnownFailures = map[string]string{}

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
			t.Errorf("%s: %v", name, err)
			continue
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
