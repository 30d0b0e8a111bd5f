package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"ptfs/decode/ptenc"
)

// decodeProc is `ptfs decode ARGS` run as its own process (the test binary
// as ptfs) with standard input a pipe the test writes.
type decodeProc struct {
	cmd            *exec.Cmd
	stdin          io.WriteCloser
	stdout, stderr *lockedBuffer
}

func startDecode(t *testing.T, stdout io.Writer, args ...string) *decodeProc {
	t.Helper()
	p := &decodeProc{stdout: &lockedBuffer{}, stderr: &lockedBuffer{}}
	p.cmd = exec.Command(os.Args[0], append([]string{"decode"}, args...)...)
	p.cmd.Env = append(os.Environ(), "PTFS_TEST_MAIN=1")
	p.cmd.Stdout, p.cmd.Stderr = p.stdout, p.stderr
	if stdout != nil {
		p.cmd.Stdout = stdout
	}
	var err error
	if p.stdin, err = p.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if p.cmd.ProcessState == nil {
			_ = p.cmd.Process.Kill()
			_ = p.cmd.Wait()
		}
	})
	return p
}

// peakMiB is the running process's peak resident memory, its VmHWM (the
// getrusage of a child would count the test binary's memory it was cloned
// from).
func (p *decodeProc) peakMiB(t *testing.T) int64 {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			var kib int64
			if _, err := fmt.Sscanf(strings.TrimSpace(v), "%d kB", &kib); err != nil {
				t.Fatalf("VmHWM %q: %v", v, err)
			}
			return kib >> 10
		}
	}
	t.Fatalf("no VmHWM in /proc/%d/status", p.cmd.Process.Pid)
	return 0
}

// checkPeak fails t when the running process's peak resident memory
// exceeds peakBoundMiB.
func (p *decodeProc) checkPeak(t *testing.T, what string) {
	t.Helper()
	if peak := p.peakMiB(t); peak > peakBoundMiB {
		t.Errorf("%s: peak resident memory %d MiB, want at most %d", what, peak, peakBoundMiB)
	} else {
		t.Logf("%s: peak resident memory %d MiB", what, peak)
	}
}

// feed writes n bytes of block repeated to w, ending early when w fails
// (the reader is gone); it returns what was written.
func feed(w io.Writer, block []byte, n int64) int64 {
	var done int64
	for done < n {
		m, err := w.Write(block[:min(int64(len(block)), n-done)])
		done += int64(m)
		if err != nil {
			break
		}
	}
	return done
}

// pipeInputMiB is the input of the bounded-memory tests: the code before
// them held all of it, so their peak memory exceeded it.
const pipeInputMiB = 192

// peakBoundMiB bounds the peak resident memory of ptfs decode on any raw
// input: the Go runtime, a piece (feedSize), the decoders' windows.
const peakBoundMiB = 32

// Standard input that never syncs (zeros, random bytes: no PSB) is read in
// bounded memory by every mode and refused at its end with the count of
// bytes it held; the code before read it whole into memory first.
func TestDecodePipeNoPSBBounded(t *testing.T) {
	if testing.Short() {
		t.Skip("pipes 192 MiB through 8 processes")
	}
	dir := t.TempDir()
	code := filepath.Join(dir, "code.bin")
	if err := os.WriteFile(code, bytes.Repeat([]byte{0x90}, 4096), 0o644); err != nil {
		t.Fatal(err)
	}
	random := make([]byte, 1<<20)
	rand.New(rand.NewSource(5)).Read(random)
	if bytes.Contains(random, []byte{2, 0x82, 2, 0x82}) {
		t.Fatal("the random block holds PSB bytes: pick another seed")
	}
	inputs := []struct {
		name  string
		block []byte
	}{{"zeros", make([]byte, 1<<20)}, {"random", random}}
	modes := []struct {
		name string
		args []string
	}{
		{"packets", []string{"--packets", "-"}},
		{"events", []string{"--events", writeGenEvents(t, dir), "-"}},
		{"branches", []string{"--branches", "--raw", code + ":0x400000", "-"}},
		{"insns", []string{"--insns", "--raw", code + ":0x400000", "--pt", "-"}},
	}
	const n = pipeInputMiB << 20
	for _, in := range inputs {
		for _, m := range modes {
			t.Run(in.name+"/"+m.name, func(t *testing.T) {
				p := startDecode(t, nil, m.args...)
				if got := feed(p.stdin, in.block, n); got != n {
					t.Errorf("ptfs decode took %d of %d bytes", got, n)
				}
				// It waits for the end of its input: all but the last
				// piece is read.
				p.checkPeak(t, fmt.Sprintf("%d MiB of input", pipeInputMiB))
				p.stdin.Close()
				err := p.cmd.Wait()
				var ee *exec.ExitError
				if !errors.As(err, &ee) || ee.ExitCode() != 1 {
					t.Fatalf("exit %v, want status 1; stderr %q", err, p.stderr.String())
				}
				want := fmt.Sprintf("no PSB packet in %d bytes", n)
				if !strings.Contains(p.stderr.String(), want) {
					t.Errorf("stderr %q, want %q", p.stderr.String(), want)
				}
			})
		}
	}
}

// An endless input stops promptly: SIGINT while it never syncs, SIGPIPE
// when the reader of its listing goes away; memory stays bounded.
func TestDecodeEndlessStops(t *testing.T) {
	zeros := make([]byte, 1<<20)
	t.Run("sigint", func(t *testing.T) {
		p := startDecode(t, nil, "--events", writeGenEvents(t, t.TempDir()), "-")
		fed := make(chan int64, 1)
		go func() { fed <- feed(p.stdin, zeros, 1<<62) }()
		// Wait until it has taken 64 MiB: it reads, it does not hang.
		for start := time.Now(); time.Since(start) < 30*time.Second; time.Sleep(10 * time.Millisecond) {
			if pos, _ := readInputPos(p.cmd.Process.Pid); pos >= 64<<20 {
				break
			}
		}
		p.checkPeak(t, "64 MiB of input")
		if err := p.cmd.Process.Signal(os.Interrupt); err != nil {
			t.Fatal(err)
		}
		waitExit(t, p, syscall.SIGINT)
		if got := <-fed; got < 64<<20 {
			t.Errorf("ptfs decode took %d bytes before SIGINT, want 64 MiB", got)
		}
	})
	t.Run("sigpipe", func(t *testing.T) {
		pr, pw, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		// --no-sync lists the PADs: an endless listing.
		p := startDecode(t, pw, "--packets", "--no-sync", "-")
		pw.Close()
		go feed(p.stdin, zeros, 1<<62)
		if _, err := io.CopyN(io.Discard, pr, 64<<20); err != nil {
			t.Fatalf("listing: %v; stderr %q", err, p.stderr.String())
		}
		p.checkPeak(t, "64 MiB of listing")
		pr.Close()
		waitExit(t, p, syscall.SIGPIPE)
	})
}

// readInputPos is the position of pid's standard input (a pipe: what it
// has read so far), from /proc/PID/io's rchar.
func readInputPos(pid int) (int64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/io", pid))
	if err != nil {
		return 0, err
	}
	var rchar int64
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "rchar: "); ok {
			_, err = fmt.Sscan(v, &rchar)
		}
	}
	return rchar, err
}

// waitExit waits (at most 10 s) for p to end by sig.
func waitExit(t *testing.T, p *decodeProc, sig syscall.Signal) {
	t.Helper()
	done := make(chan error, 1)
	start := time.Now()
	go func() { done <- p.cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatalf("ptfs decode still runs 10 s after %v", sig)
	}
	ws := p.cmd.ProcessState.Sys().(syscall.WaitStatus)
	if !ws.Signaled() || ws.Signal() != sig {
		t.Errorf("ended with %v, want by %v; stderr %q", p.cmd.ProcessState, sig, p.stderr.String())
	}
	t.Logf("ended by %v %v after it", sig, time.Since(start).Round(time.Millisecond))
}

// Garbage before a trace's first PSB is skipped and reported: the records
// are the clean trace's, from a mapped file and from a pipe, and the
// packet listing has the clean trace's packets.
func TestDecodeGarbageBeforePSB(t *testing.T) {
	dir := t.TempDir()
	events := writeGenEvents(t, dir)
	trace := ptenc.Generate(ptenc.PTWHeavy, 2*feedSize, 7)
	garbage := make([]byte, feedSize+feedSize/2+3)
	rand.New(rand.NewSource(9)).Read(garbage)
	if bytes.Contains(garbage, []byte{2, 0x82, 2, 0x82}) {
		t.Fatal("the garbage holds PSB bytes: pick another seed")
	}
	clean, dirty := filepath.Join(dir, "clean.pt"), filepath.Join(dir, "dirty.pt")
	if err := os.WriteFile(clean, trace, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dirty, append(garbage, trace...), 0o644); err != nil {
		t.Fatal(err)
	}
	note := fmt.Sprintf("gap: %d bytes before the first PSB skipped", len(garbage))

	code, want, errs := runDecodeT("--events", events, clean)
	if code != 0 || !strings.Contains(want, "records=") || errs != "" {
		t.Fatalf("clean: exit %d, stderr %q", code, errs)
	}
	code, got, errs := runDecodeT("--events", events, dirty)
	if code != 0 || got != want || !strings.Contains(errs, note) {
		t.Errorf("mapped: exit %d, the same records: %v, stderr %q, want %q", code, got == want, errs, note)
	}
	p := startDecode(t, nil, "--events", events, "-")
	feed(p.stdin, append(garbage, trace...), int64(len(garbage)+len(trace)))
	p.stdin.Close()
	if err := p.cmd.Wait(); err != nil || p.stdout.String() != want || !strings.Contains(p.stderr.String(), note) {
		t.Errorf("pipe: %v, the same records: %v, stderr %q, want %q", err, p.stdout.String() == want, p.stderr.String(), note)
	}

	_, wantList, _ := runDecodeT("--packets", clean)
	code, gotList, errs := runDecodeT("--packets", dirty)
	if code != 0 || !strings.Contains(errs, note) || len(lines(gotList)) != len(lines(wantList)) || len(lines(wantList)) < 1000 {
		t.Errorf("packets: exit %d, %d lines, want %d; stderr %q", code, len(lines(gotList)), len(lines(wantList)), errs)
	}
}

// The pieces of a raw trace start at its first PSB wherever the piece
// boundaries cut it, and count the bytes before it; read or mapped.
func TestTracePiecesPSBAcrossPieces(t *testing.T) {
	trace := ptenc.Generate(ptenc.PTWHeavy, 2*feedSize, 3)
	for _, lead := range []int{0, 1, feedSize - 16, feedSize - 15, feedSize - 8, feedSize - 1, feedSize, feedSize + 3, 2*feedSize - 7} {
		input := append(bytes.Repeat([]byte{0xff}, lead), trace...)
		name := filepath.Join(t.TempDir(), "trace.pt")
		if err := os.WriteFile(name, input, 0o644); err != nil {
			t.Fatal(err)
		}
		for _, how := range []string{"mapped", "pipe"} {
			var got []byte
			notes := &bytes.Buffer{}
			err := withStdin(t, name, how == "pipe", func() error {
				in, err := openInput(map[string]string{"mapped": name, "pipe": "-"}[how])
				if err != nil {
					return err
				}
				defer in.close()
				if (in.mem != nil) != (how == "mapped") {
					return fmt.Errorf("mapped %v", in.mem != nil)
				}
				next, err := in.pieces(true, notes)
				if err != nil {
					return err
				}
				for {
					d, _, err := next()
					if err == io.EOF {
						return nil
					}
					if err != nil {
						return err
					}
					got = append(got, d...)
				}
			})
			note := fmt.Sprintf(" %d bytes before", lead)
			if err != nil || !bytes.Equal(got, trace) || (lead > 0) != strings.Contains(notes.String(), note) {
				t.Errorf("%d bytes before the PSB, %s: %v, %d bytes out of %d, the trace: %v, notes %q", lead, how, err, len(got), len(trace), bytes.Equal(got, trace), notes)
			}
		}
	}
}

// withStdin runs fn with standard input the file name through a pipe
// (pipe) or not replaced.
func withStdin(t *testing.T, name string, pipe bool, fn func() error) error {
	if !pipe {
		return fn()
	}
	data, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Close()
	go func() {
		pw.Write(data)
		pw.Close()
	}()
	old := os.Stdin
	os.Stdin = pr
	defer func() { os.Stdin = old }()
	return fn()
}

// perf.data through a pipe is held whole up to a limit and refused past
// it; a mapped file is not limited.
func TestPerfDataReadLimit(t *testing.T) {
	data := append([]byte("PERFILE2"), make([]byte, 3*feedSize)...)
	name := filepath.Join(t.TempDir(), "big.perf.data")
	if err := os.WriteFile(name, data, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		limit int64
		want  error
	}{{2 * feedSize, errPerfTooLarge}, {int64(len(data)), nil}, {8 * feedSize, nil}} {
		var got []byte
		err := withStdin(t, name, true, func() error {
			in, err := openInput("-")
			if err != nil {
				return err
			}
			defer in.close()
			got, err = in.perfData(c.limit)
			got = bytes.Clone(got)
			return err
		})
		if !errors.Is(err, c.want) || (err == nil && !bytes.Equal(got, data)) {
			t.Errorf("limit %d: %v (%d bytes), want %v", c.limit, err, len(got), c.want)
		}
	}
	in, err := openInput(name)
	if err != nil {
		t.Fatal(err)
	}
	defer in.close()
	if got, err := in.perfData(feedSize); err != nil || !bytes.Equal(got, data) {
		t.Errorf("mapped file: %v, %d bytes", err, len(got))
	}
}
