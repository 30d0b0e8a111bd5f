package main

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

// readmeFlags returns the flags that README's Commands section documents,
// by command ("" for the bullets that name no command, such as -v).
func readmeFlags(t *testing.T) map[string][]string {
	t.Helper()
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	text := string(b)
	start := strings.Index(text, "\n## Commands\n")
	if start < 0 {
		t.Fatal("README has no Commands section")
	}
	section := text[start+len("\n## Commands\n"):]
	if end := strings.Index(section, "\n## "); end >= 0 {
		section = section[:end]
	}
	command := regexp.MustCompile("^`ptfs ([a-z]+)")
	// A flag starts a word: --name, or -v alone.
	flagRe := regexp.MustCompile(`(?:^|[^\w-])(--[a-z][a-z0-9-]*|-[a-z])\b`)
	out := map[string][]string{}
	for _, bullet := range strings.Split(section, "\n- ")[1:] {
		cmd := ""
		if m := command.FindStringSubmatch(bullet); m != nil {
			cmd = m[1]
		}
		for _, m := range flagRe.FindAllStringSubmatch(bullet, -1) {
			out[cmd] = append(out[cmd], m[1])
		}
	}
	return out
}

// hasFlag reports whether help names flag as a whole word: --max-stream
// is not found in --max-stream-hard.
func hasFlag(help, flag string) bool {
	return regexp.MustCompile(`(?:^|[^\w-])` + regexp.QuoteMeta(flag) + `(?:[^\w-]|$)`).MatchString(help)
}

// TestHelpListsReadmeFlags checks that `ptfs --help` and `ptfs COMMAND
// --help` name every flag README's Commands section documents for that
// command, so that the two cannot drift apart.
func TestHelpListsReadmeFlags(t *testing.T) {
	flags := readmeFlags(t)
	// The section must be found and parsed: these are documented today.
	for cmd, want := range map[string]string{"mount": "--readers", "check": "--mode", "decode": "--packets", "": "-v"} {
		if !hasFlag(strings.Join(flags[cmd], " "), want) {
			t.Fatalf("README parse: %q not among the flags found for %q: %q", want, cmd, flags)
		}
	}
	var top, topErr strings.Builder
	if code := run([]string{"--help"}, &top, &topErr); code != 0 {
		t.Fatalf("ptfs --help: exit %d, stderr %q", code, topErr.String())
	}
	for cmd, list := range flags {
		help := ""
		if cmd != "" {
			var stdout, stderr strings.Builder
			run([]string{cmd, "--help"}, &stdout, &stderr)
			help = stdout.String() + stderr.String()
		}
		for _, f := range list {
			if !hasFlag(top.String(), f) {
				t.Errorf("ptfs --help does not list %s (README documents it for %q)", f, cmd)
			}
			if cmd != "" && !hasFlag(help, f) {
				t.Errorf("ptfs %s --help does not list %s:\n%s", cmd, f, help)
			}
		}
	}
}

func TestHasFlag(t *testing.T) {
	tests := []struct {
		help, flag string
		want       bool
	}{
		{"[--max-stream-hard BYTES]", "--max-stream", false},
		{"[--max-stream BYTES]", "--max-stream", true},
		{"  --max-stream int64\n", "--max-stream", true},
		{"--mode=ptw", "--mode", true},
		{"usage: ptfs [-v] COMMAND", "-v", true},
		{"--verbose", "-v", false},
		{"no-v here", "-v", false},
	}
	for _, tc := range tests {
		if got := hasFlag(tc.help, tc.flag); got != tc.want {
			t.Errorf("hasFlag(%q, %q) = %v, want %v", tc.help, tc.flag, got, tc.want)
		}
	}
}
