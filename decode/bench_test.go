package decode

import (
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"ptfs/decode/ptenc"
	"ptfs/internal/testkit"
)

// benchSize is the size of the generated benchmark streams.
const benchSize = 64 << 20

var benchStreams [3]struct {
	once sync.Once
	data []byte
}

// benchStream returns the 64 MiB stream of profile p, generated once per
// process (PSB+ every 4 KiB).
func benchStream(p ptenc.Profile) []byte {
	s := &benchStreams[p]
	s.once.Do(func() { s.data = ptenc.Generate(p, benchSize, int64(p)+1) })
	return s.data
}

var benchProfiles = []ptenc.Profile{ptenc.Mixed, ptenc.PTWHeavy, ptenc.TNTHeavy}

// countPackets decodes buf in batches and returns the number of packets.
func countPackets(d *PacketDecoder, buf []byte) (int, error) {
	var out [256]Packet
	d.Reset(buf)
	n := 0
	for {
		k, err := d.Decode(out[:])
		n += k
		if err == io.EOF {
			return n, nil
		}
		if err != nil {
			return n, err
		}
	}
}

// BenchmarkPackets decodes each 64 MiB stream with ptfs's packet decoder,
// in batches of 256 packets (Decode) and one packet a call (Next).
func BenchmarkPackets(b *testing.B) {
	for _, p := range benchProfiles {
		buf := benchStream(p)
		b.Run(p.String()+"/batch", func(b *testing.B) {
			b.SetBytes(int64(len(buf)))
			b.ReportAllocs()
			d := NewPacketDecoder(nil)
			n := 0
			for i := 0; i < b.N; i++ {
				k, err := countPackets(d, buf)
				if err != nil {
					b.Fatalf("decode error in a generated stream: %v", err)
				}
				n += k
			}
			b.ReportMetric(float64(n)/float64(b.N), "packets/op")
		})
		b.Run(p.String()+"/next", func(b *testing.B) {
			b.SetBytes(int64(len(buf)))
			b.ReportAllocs()
			d := NewPacketDecoder(nil)
			var pk Packet
			for i := 0; i < b.N; i++ {
				d.Reset(buf)
				for {
					err := d.Next(&pk)
					if err == io.EOF {
						break
					}
					if err != nil {
						b.Fatalf("decode error in a generated stream: %v", err)
					}
				}
			}
		})
	}
}

// nullOutput counts what the assembler delivers.
type nullOutput struct{ records, manual int }

func (o *nullOutput) Record(*Record) { o.records++ }
func (o *nullOutput) Manual(*Manual) { o.manual++ }

// BenchmarkRecords measures records-only decoding: packets to assembled
// records, nothing printed.
func BenchmarkRecords(b *testing.B) {
	b.Run("ptw", func(b *testing.B) {
		buf := benchStream(ptenc.PTWHeavy)
		var out nullOutput
		a := NewAssembler(testEvents(), &out)
		b.SetBytes(int64(len(buf)))
		b.ReportAllocs()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			a.Feed(buf)
			a.End()
		}
		b.StopTimer()
		if c := a.Counters(); c.Errors != 0 || c.Dropped != 0 || c.Records == 0 {
			b.Fatalf("counters %+v", c)
		}
		b.ReportMetric(float64(out.records)/float64(b.N), "records/op")
	})
}

// BenchmarkLibipt times libipt's packet decoder (the harness's bench mode:
// decode and count, no printing) on the same streams, for the ratio.
func BenchmarkLibipt(b *testing.B) {
	for _, p := range benchProfiles {
		b.Run(p.String(), func(b *testing.B) {
			dir := b.TempDir()
			bin := buildLibipt(b, dir)
			buf := benchStream(p)
			path := filepath.Join(dir, "stream.pt")
			if err := os.WriteFile(path, buf, 0o644); err != nil {
				b.Fatal(err)
			}
			ask := testkit.Harness(b, bin, "bench", path)
			round := func() int {
				line := ask("go")
				n, err := strconv.Atoi(strings.TrimSpace(line))
				if err != nil {
					b.Fatalf("libipt harness answered %q: %v", line, err)
				}
				return n
			}
			// Same packets as ptfs counts, and the file is in memory.
			want, err := countPackets(NewPacketDecoder(nil), buf)
			if err != nil {
				b.Fatal(err)
			}
			if got := round(); got != want {
				b.Fatalf("libipt counts %d packets, ptfs %d", got, want)
			}
			b.SetBytes(int64(len(buf)))
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				round()
			}
		})
	}
}
