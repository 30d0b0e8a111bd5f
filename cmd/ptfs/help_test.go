package main

import (
	"go/ast"
	goparser "go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
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

// codeFlags returns every flag that cmd/ptfs's own code defines, read from
// its source: the names given to a flag.FlagSet (String, IntVar, ...) and
// the options the hand-written parsers compare against ("--raw").
func codeFlags(t *testing.T) []string {
	t.Helper()
	fset := token.NewFileSet()
	pkgs, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	option := regexp.MustCompile(`^--[a-z][a-z0-9-]*$`)
	seen := map[string]bool{}
	var out []string
	add := func(f string) {
		if !seen[f] && f != "--help" {
			seen[f] = true
			out = append(out, f)
		}
	}
	for _, name := range pkgs {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		file, err := goparser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(file, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.CallExpr:
				sel, ok := n.Fun.(*ast.SelectorExpr)
				if !ok {
					return true
				}
				arg := -1
				switch sel.Sel.Name {
				case "String", "Bool", "Int", "Int64", "Uint", "Uint64", "Duration", "Float64", "Func":
					arg = 0
				case "StringVar", "BoolVar", "IntVar", "Int64Var", "UintVar", "Uint64Var", "DurationVar", "Float64Var", "Var":
					arg = 1
				}
				if arg < 0 || len(n.Args) <= arg {
					return true
				}
				if lit, ok := n.Args[arg].(*ast.BasicLit); ok && lit.Kind == token.STRING {
					if v, err := strconv.Unquote(lit.Value); err == nil && regexp.MustCompile(`^[a-z][a-z0-9-]*$`).MatchString(v) {
						if len(v) == 1 {
							add("-" + v)
						} else {
							add("--" + v)
						}
					}
				}
			case *ast.BasicLit:
				if v, err := strconv.Unquote(n.Value); n.Kind == token.STRING && err == nil && option.MatchString(v) {
					add(v)
				}
			}
			return true
		})
	}
	return out
}

// TestHelpListsEveryFlag checks that `ptfs --help` names every flag the
// code defines, whatever README says.
func TestHelpListsEveryFlag(t *testing.T) {
	flags := codeFlags(t)
	// The source must be read: these are defined today.
	for _, want := range []string{"--readers", "--fuse-debug", "--mode", "--raw", "--tid", "-v"} {
		if !slices.Contains(flags, want) {
			t.Fatalf("source scan: %s not among the flags found: %q", want, flags)
		}
	}
	var top, topErr strings.Builder
	if code := run([]string{"--help"}, &top, &topErr); code != 0 {
		t.Fatalf("ptfs --help: exit %d, stderr %q", code, topErr.String())
	}
	for _, f := range flags {
		if !hasFlag(top.String(), f) {
			t.Errorf("ptfs --help does not list %s, which the code defines:\n%s", f, top.String())
		}
	}
}
