// Command ptfs mounts a filesystem that traces binaries with uprobes (ptwrite
// uprobes and Intel PT where the machine has them, classic uprobes elsewhere)
// and decodes Intel PT traces offline.
package main

import (
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/sirupsen/logrus"
)

const usage = `usage: ptfs [-v|--verbose] COMMAND [ARGS]

commands:
  mount [--mode auto|classic|ptw] [--max-stream BYTES] [--max-stream-hard BYTES]
        [--stream-dir DIR] [--ring-pages N] [--aux-pages N] [--data-pages N]
        [--aux-watermark BYTES] [--pt-flush DURATION] [--allow-other]
        [--readers GROUP] [--fuse-debug] [--cpuprofile FILE] [-v] MOUNTPOINT [NAME=]BINARY...
        mount the tracing filesystem; runs until unmounted or signalled
  check [--mode auto|classic|ptw]
        print what this machine supports and which mode ptfs would use
  decode [--events DIR] [--packets|--insns] FILE...
        decode raw Intel PT bytes or a perf.data file
  decode --branches [--raw FILE:BASE] [--elf FILE[:BIAS]] [--pages A:D]
        [--maps FILE --root DIR --vdso FILE] [--events DIR] [--tid N]
        [--cpu N] FILE
        print the control flow of a raw trace as branch: lines

-v enables debug logging (on stderr). ptfs COMMAND --help describes the
command's flags.
`

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run dispatches a command line and returns the exit status.
func run(args []string, stdout, stderr io.Writer) int {
	logrus.SetOutput(stderr)
	logrus.SetLevel(logrus.WarnLevel)
	for len(args) > 0 && (args[0] == "-v" || args[0] == "--verbose") {
		logrus.SetLevel(logrus.DebugLevel)
		args = args[1:]
	}
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	switch cmd, rest := args[0], args[1:]; cmd {
	case "mount":
		return runMount(rest, stdout, stderr)
	case "check":
		return runCheck(rest, stdout, stderr)
	case "decode":
		return runDecode(rest, stdout, stderr)
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return 0
	default:
		fmt.Fprintf(stderr, "ptfs: unknown command %q\n%s", cmd, usage)
		return 2
	}
}

// flagUsage returns the Usage of a command's flag set: the synopsis, then
// every flag spelt as README spells it (--name VALUE), with its default.
func flagUsage(fl *flag.FlagSet, synopsis string) func() {
	return func() {
		w := fl.Output()
		fmt.Fprintf(w, "%s\n\nflags:\n", synopsis)
		fl.VisitAll(func(f *flag.Flag) {
			dash := "--"
			if len(f.Name) == 1 {
				dash = "-"
			}
			arg, help := flag.UnquoteUsage(f)
			if arg != "" {
				arg = " " + arg
			}
			switch f.DefValue {
			case "", "0", "false", "0s":
			default:
				help += fmt.Sprintf(" (default %s)", f.DefValue)
			}
			fmt.Fprintf(w, "  %s%s%s\n    \t%s\n", dash, f.Name, arg, help)
		})
	}
}
