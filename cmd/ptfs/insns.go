package main

import (
	"errors"
	"fmt"
	"io"
	"os"

	"ptfs/flow"
)

// errNoCode: an address outside every --raw image.
var errNoCode = errors.New("no code at this address")

// rawImage is code memory made of ptxed's --raw files; where they overlap,
// the one given later wins, as in libipt's image.
type rawImage struct {
	segs []rawSeg
}

type rawSeg struct {
	base uint64
	data []byte
}

// ReadAt copies the code at addr into dst, up to the end of its file.
func (m *rawImage) ReadAt(dst []byte, addr uint64) (int, error) {
	for i := len(m.segs) - 1; i >= 0; i-- {
		s := &m.segs[i]
		if addr >= s.base && addr-s.base < uint64(len(s.data)) {
			return copy(dst, s.data[addr-s.base:]), nil
		}
	}
	return 0, fmt.Errorf("%#x: %w", addr, errNoCode)
}

// loadRaws reads the --raw files into an image.
func loadRaws(raws []flow.Raw) (*rawImage, error) {
	img := &rawImage{}
	for _, r := range raws {
		data, err := os.ReadFile(r.File)
		if err != nil {
			return nil, fmt.Errorf("--raw: %w", err)
		}
		end := uint64(len(data))
		if r.End != 0 {
			if r.End > end {
				return nil, fmt.Errorf("--raw %s: range end %#x beyond its %d bytes: %w", r.File, r.End, len(data), flow.ErrBadOption)
			}
			end = r.End
		}
		if r.Start >= end {
			return nil, fmt.Errorf("--raw %s: offset %#x beyond its %d bytes: %w", r.File, r.Start, len(data), flow.ErrBadOption)
		}
		if r.Base+(end-r.Start)-1 < r.Base {
			return nil, fmt.Errorf("--raw %s: base %#x: image wraps the address space: %w", r.File, r.Base, flow.ErrBadOption)
		}
		img.segs = append(img.segs, rawSeg{base: r.Base, data: data[r.Start:end]})
	}
	return img, nil
}

// listInsns implements `ptfs decode --insns PTXED-OPTIONS`: the flow as
// libipt's ptxed prints it. The trace (--pt, "-": standard input) is read
// and decoded as a stream (flow.Stream), in pieces.
func listInsns(w, notes io.Writer, args []string) error {
	opts, err := flow.ParsePtxedArgs(args)
	if err != nil {
		return err
	}
	img, err := loadRaws(opts.Raws)
	if err != nil {
		return err
	}
	in, err := openInput(opts.PT)
	if err != nil {
		return err
	}
	defer in.close()
	next, err := in.pieces(false, notes)
	if err != nil {
		return err
	}
	if _, err := io.WriteString(w, flow.CPUDiag(opts.CPU)); err != nil {
		return fmt.Errorf("write output: %w", err)
	}
	p := flow.NewPtxed(w, &opts)
	d := flow.New(img, opts.FlowOptions())
	err = feedStream(next, flow.NewStream(d, p))
	d.Close() // feedStream closed the Stream
	if err != nil {
		return err
	}
	p.Stats()
	if err := p.Flush(); err != nil {
		return fmt.Errorf("write output: %w", err)
	}
	return nil
}
