package main

import (
	"flag"
	"fmt"
	"io"

	"ptfs/perfio"
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
	// ptw records take their time from the TSC through the kernel's
	// conversion, which any perf event's page tells (DESIGN §1).
	switch ok, reason, err := perfio.TSCConversion(); {
	case err != nil:
		fmt.Fprintf(stdout, "ptw time: unknown (%v)\n", err)
	case ok:
		fmt.Fprintln(stdout, "ptw time: yes (TSC converted to perf time by the kernel's cap_user_time_zero)")
	default:
		fmt.Fprintf(stdout, "ptw time: no (%s; ptw records would carry no time= and no tid=)\n", reason)
	}
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
