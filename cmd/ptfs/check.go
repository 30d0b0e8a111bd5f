package main

import (
	"flag"
	"fmt"
	"io"

	"ptfs/session"
)

// runCheck implements `ptfs check`: what the machine supports, the mode a
// mount would run in by default and why, and with --mode whether that mode
// can run. It exits 1 when the mode asked for cannot run.
func runCheck(args []string, stdout, stderr io.Writer) int {
	fl := flag.NewFlagSet("check", flag.ContinueOnError)
	fl.SetOutput(stderr)
	mode := fl.String("mode", "auto", "the mode to check for: auto, classic or ptw")
	fl.Usage = flagUsage(fl, "usage: ptfs check [flags]")
	if err := fl.Parse(args); err != nil {
		return 2
	}
	m, err := session.ParseMode(*mode)
	if err != nil {
		fmt.Fprintln(stderr, "ptfs:", err)
		return 2
	}
	c := session.Detect()
	stdout.Write(c.AppendText(nil))
	got, why, err := c.Choose(session.ModeAuto)
	if err != nil {
		fmt.Fprintf(stdout, "mode: none (%v)\n", err)
		return 1
	}
	fmt.Fprintf(stdout, "mode: %s (%s)\n", got, why)
	if m == session.ModeAuto {
		return 0
	}
	if got, why, err = c.Choose(m); err != nil {
		fmt.Fprintf(stdout, "--mode=%s: cannot run (%v)\n", m, err)
		return 1
	}
	fmt.Fprintf(stdout, "--mode=%s: %s (%s)\n", m, got, why)
	return 0
}
