// Command ptfs mounts a filesystem that traces binaries with uprobes (ptwrite
// uprobes and Intel PT where the machine has them, classic uprobes elsewhere)
// and decodes Intel PT traces offline.
package main

import (
	"fmt"
	"io"
	"os"

	"github.com/sirupsen/logrus"
)

const usage = `usage: ptfs [-v] COMMAND [ARGS]

commands:
  mount [--mode auto|classic|ptw] [--max-stream BYTES] [--max-stream-hard BYTES]
        [--stream-dir DIR] [--ring-pages N] [--allow-other] [--readers GROUP]
        MOUNTPOINT [NAME=]BINARY...
        mount the tracing filesystem; runs until unmounted or signalled
  check print what this machine supports and which mode ptfs would use
  decode [--events DIR] [--packets] FILE...
        decode raw Intel PT bytes or a perf.data file

-v enables debug logging (on stderr).
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
