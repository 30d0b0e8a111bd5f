package fs

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"
	"unsafe"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"github.com/hanwen/go-fuse/v2/splice"

	"golang.org/x/sys/unix"

	"ptfs/stream"
)

// readSnapshot serves a read of a content snapshot.
func readSnapshot(ctx context.Context, data, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	if ctx.Err() != nil {
		return nil, syscall.EINTR
	}
	if off < 0 {
		return nil, syscall.EINVAL
	}
	if off >= int64(len(data)) {
		return fuse.ReadResultData(nil), 0
	}
	return fuse.ReadResultData(data[off:min(int64(len(data)), off+int64(len(dest)))]), 0
}

// wantsWrite reports whether open flags ask for write access.
func wantsWrite(flags uint32) bool {
	return flags&syscall.O_ACCMODE != syscall.O_RDONLY
}

// genNode is a small read-only file whose content the engine generates:
// the `status` files and `symbols`. Each open takes a snapshot, so a read
// in several chunks is consistent. The files are opened with DIRECT_IO:
// reads go to the snapshot whatever size an earlier stat saw.
type genNode struct {
	gofs.Inode
	perms   *perms
	born    time.Time
	content func() ([]byte, error)
}

var (
	_ gofs.NodeOpener    = (*genNode)(nil)
	_ gofs.NodeGetattrer = (*genNode)(nil)
	_ gofs.NodeSetattrer = (*genNode)(nil)
	_ gofs.FileReader    = (*genHandle)(nil)
)

// newStatusNode returns a `status` file, the root's or a target's.
func newStatusNode(p *perms, born time.Time, r Reporter) *genNode {
	return &genNode{perms: p, born: born, content: func() ([]byte, error) { return r.Status(), nil }}
}

// genHandle is one open of a genNode: the snapshot taken at open.
type genHandle struct {
	data []byte
}

// Open snapshots the content.
func (g *genNode) Open(_ context.Context, flags uint32) (gofs.FileHandle, uint32, syscall.Errno) {
	if wantsWrite(flags) {
		return nil, 0, syscall.EACCES
	}
	data, err := g.content()
	if errno := toErrno("generate content", err); errno != 0 {
		return nil, 0, errno
	}
	return &genHandle{data: data}, fuse.FOPEN_DIRECT_IO, 0
}

// Read serves the snapshot.
func (h *genHandle) Read(ctx context.Context, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	return readSnapshot(ctx, h.data, dest, off)
}

// Getattr reports the size of the open handle's snapshot, or of freshly
// generated content when stat is called on the name.
func (g *genNode) Getattr(_ context.Context, f gofs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	var size int
	if h, ok := f.(*genHandle); ok {
		size = len(h.data)
	} else if data, err := g.content(); err == nil {
		size = len(data)
	} else {
		// The file exists even when its content cannot be made now: stat
		// (ls -l) succeeds with size 0 and open reports the error.
		toErrno("generate content for stat", err)
	}
	g.perms.setAttr(&out.Attr, syscall.S_IFREG|0o444, int64(size), g.born)
	out.SetTimeout(0)
	return 0
}

// Setattr refuses: the file is read-only.
func (g *genNode) Setattr(context.Context, gofs.FileHandle, *fuse.SetAttrIn, *fuse.AttrOut) syscall.Errno {
	return syscall.EACCES
}

// streamNode is a growing text file, `records` or `branches`. It reports
// its true size with attribute timeout 0: GNU tail -f polls st_size of a
// FUSE file and reads what it grew by. Reads are DIRECT_IO: each goes to
// the open's stream.Reader at the file position, which returns whole
// lines and gap lines (DESIGN §2, §5); the page cache would serve bytes
// by size instead.
type streamNode struct {
	gofs.Inode
	perms *perms
	born  time.Time
	// open returns the handle for one open; for `branches` it starts
	// branch tracing, which may be refused.
	open func() (*streamHandle, error)

	mu sync.Mutex
	// last is the stream of the most recent open (for records, its only
	// stream), for stat and truncate on the name.
	last *stream.Stream
	// seen, seenSize, seenResets and mtime track content changes: mtime is the
	// time a change was first observed, so that a reader sees a new mtime
	// even when a truncation brought the size back to where it was.
	seen       *stream.Stream
	seenSize   int64
	seenResets uint64
	mtime      time.Time
}

var (
	_ gofs.NodeOpener    = (*streamNode)(nil)
	_ gofs.NodeGetattrer = (*streamNode)(nil)
	_ gofs.NodeSetattrer = (*streamNode)(nil)
	_ gofs.FileReader    = (*streamHandle)(nil)
	_ gofs.FileWriter    = (*streamHandle)(nil)
	_ gofs.FileReleaser  = (*streamHandle)(nil)
)

// newRecordsNode returns the `records` file of r.
func newRecordsNode(p *perms, born time.Time, r Recorder) *streamNode {
	return &streamNode{
		perms: p,
		born:  born,
		open:  func() (*streamHandle, error) { return &streamHandle{s: r.Records()}, nil },
		// records exists before anyone opens it: stat and truncate
		// work on the name alone.
		last: r.Records(),
	}
}

// newBranchesNode returns the `branches` file of b; each open asks b for
// a stream, and tells it when the open ends if b is a BranchesCloser.
func newBranchesNode(p *perms, born time.Time, b Brancher) *streamNode {
	return &streamNode{
		perms: p,
		born:  born,
		open: func() (*streamHandle, error) {
			s, err := b.Branches()
			if err != nil {
				return nil, err
			}
			h := &streamHandle{s: s}
			if c, ok := b.(BranchesCloser); ok {
				h.release = c.CloseBranches
			}
			return h, nil
		},
	}
}

// streamHandle is one open of a streamNode.
type streamHandle struct {
	s *stream.Stream
	// r reads for this open; nil for a write-only open (`: > records`),
	// which must not hold back what the stream discards.
	r       *stream.Reader
	release func()
}

// Open starts serving the stream. Opening for write is allowed to those
// who control the mount, so that `: > records` can truncate; writes
// themselves are refused.
func (n *streamNode) Open(ctx context.Context, flags uint32) (gofs.FileHandle, uint32, syscall.Errno) {
	if wantsWrite(flags) {
		if errno := n.perms.control(ctx, "open stream for write", syscall.EACCES); errno != 0 {
			return nil, 0, errno
		}
	}
	h, err := n.open()
	if errno := toErrno("open stream", err); errno != 0 {
		return nil, 0, errno
	}
	if flags&syscall.O_ACCMODE != syscall.O_WRONLY {
		h.r = h.s.NewReader()
	}
	n.mu.Lock()
	n.last = h.s
	n.mu.Unlock()
	return h, fuse.FOPEN_DIRECT_IO, 0
}

// Read returns whole lines from the open's reader; at the end it returns
// no data at once rather than waiting, so a reader never blocks in the
// file system.
func (h *streamHandle) Read(ctx context.Context, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	if ctx.Err() != nil {
		return nil, syscall.EINTR
	}
	if off < 0 {
		return nil, syscall.EINVAL
	}
	if h.r == nil {
		return nil, syscall.EBADF
	}
	n, span, lent, err := h.r.ReadSpan(dest, off)
	switch {
	case lent && span.Mem != nil:
		return &memResult{span}, 0
	case lent && span.N+spliceSpare <= splice.MaxPipeSize():
		return &spanResult{span}, 0
	case lent:
		// Too big for go-fuse's pipe: copied after all.
		_, err = span.ReadAt(dest)
		span.Release()
		if err != nil {
			return nil, toErrno("read stream", err)
		}
	case err == nil, errors.Is(err, io.EOF):
		// FUSE expresses the end as a short (here empty) read.
	case errors.Is(err, stream.ErrClosed):
		// The target is gone: the file ends here.
	default:
		return nil, toErrno("read stream", err)
	}
	if n == 0 {
		return fuse.ReadResultData(nil), 0
	}
	// Copied into dest: go-fuse writes a vectored result with the reply's
	// header in one writev. Plain data it would first try to splice,
	// writing the bytes into a pipe only to copy them out again: two more
	// syscalls a request, most of a tail -f reader's reply cost (DESIGN §4,
	// the thirteenth pass).
	return fuse.ReadResultVector([][]byte{dest[:n]}), 0
}

// spliceSpare is what go-fuse's splice of a read reply needs in its pipe
// besides the data: the reply's header and a page.
var spliceSpare = int(unsafe.Sizeof(fuse.OutHeader{})) + os.Getpagesize()

// spanResult is a read's lines still in the stream's spill file: go-fuse
// splices them from the file into the reply (page references into a pipe,
// then one copy into the reader's buffer, where a pread into dest and the
// reply's write of it copied twice), then calls Done.
type spanResult struct{ span stream.Span }

// Seekable tells go-fuse's splice where the bytes are.
func (r *spanResult) Seekable() (fd uintptr, off int64, sz int) {
	return r.span.Fd, r.span.Off, r.span.N
}

// Bytes copies the bytes, where go-fuse does not splice.
func (r *spanResult) Bytes(buf []byte) ([]byte, fuse.Status) {
	if cap(buf) < r.span.N {
		buf = make([]byte, r.span.N)
	}
	n, err := r.span.ReadAt(buf[:r.span.N])
	if err != nil {
		return nil, fuse.Status(toErrno("read stream spill", err))
	}
	return buf[:n], fuse.OK
}

// Size is the bytes' length.
func (r *spanResult) Size() int { return r.span.N }

// Done releases the span: go-fuse calls it once the reply is written.
func (r *spanResult) Done() { r.span.Release() }

// memResult is a read's lines still in the stream's memory: go-fuse writes
// them into the reply from there (Slices, one writev with the header), then
// calls Done. A copy into go-fuse's reply buffer cost the copy and, as the
// pool's 1 MiB buffers were fresh, 700-odd page faults in a 200,000-record
// run (DESIGN §4, the eighth pass).
type memResult struct{ span stream.Span }

// Slices makes go-fuse write the bytes as they are (its withSlice).
func (r *memResult) Slices() ([][]byte, fuse.Status) { return [][]byte{r.span.Mem}, fuse.OK }

// Bytes copies the bytes, where go-fuse does not take Slices: it may call
// Done before it writes them.
func (r *memResult) Bytes(buf []byte) ([]byte, fuse.Status) {
	if cap(buf) < r.span.N {
		buf = make([]byte, r.span.N)
	}
	return buf[:copy(buf[:r.span.N], r.span.Mem)], fuse.OK
}

// Size is the bytes' length.
func (r *memResult) Size() int { return r.span.N }

// Done releases the span: go-fuse calls it once the reply is written.
func (r *memResult) Done() { r.span.Release() }

// Write refuses: the content comes from the trace.
func (h *streamHandle) Write(context.Context, []byte, int64) (uint32, syscall.Errno) {
	return 0, syscall.EPERM
}

// Release lets the stream discard what this open held, and ends branch
// tracing for this open if the engine asked to know.
func (h *streamHandle) Release(context.Context) syscall.Errno {
	if h.r != nil {
		h.r.Close()
	}
	if h.release != nil {
		h.release()
	}
	return 0
}

// Getattr reports the stream's current size.
func (n *streamNode) Getattr(_ context.Context, f gofs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	var s *stream.Stream
	n.mu.Lock()
	defer n.mu.Unlock()
	if h, ok := f.(*streamHandle); ok {
		s = h.s
	} else {
		s = n.last
	}
	n.fillAttr(s, &out.Attr)
	out.SetTimeout(0)
	return 0
}

// fillAttr sets size and mtime from s (nil: nothing opened yet). Called
// with mu held.
func (n *streamNode) fillAttr(s *stream.Stream, out *fuse.Attr) {
	var size int64
	var resets uint64
	if s != nil {
		resets = s.Resets()
		size = s.Size()
	}
	if n.mtime.IsZero() {
		n.mtime = n.born
	}
	if s != n.seen || size != n.seenSize || resets != n.seenResets {
		n.seen, n.seenSize, n.seenResets = s, size, resets
		n.mtime = time.Now()
	}
	n.perms.setAttr(out, syscall.S_IFREG|n.perms.private, size, n.mtime)
}

// Setattr empties the stream on truncation to size 0 (`: > records`).
// Other sizes and ownership changes are refused; time changes (touch) are
// accepted and ignored because the times reflect the content. Only those
// who control the mount may do either.
func (n *streamNode) Setattr(ctx context.Context, f gofs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	if errno := n.perms.control(ctx, "setattr stream", syscall.EPERM); errno != 0 {
		return errno
	}
	if in.Valid&(fuse.FATTR_MODE|fuse.FATTR_UID|fuse.FATTR_GID) != 0 {
		return syscall.EPERM
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	s := n.last
	if h, ok := f.(*streamHandle); ok {
		s = h.s
	}
	if sz, ok := in.GetSize(); ok {
		if sz != 0 {
			return syscall.EINVAL
		}
		if s != nil {
			s.Truncate()
		}
	}
	n.fillAttr(s, &out.Attr)
	out.SetTimeout(0)
	return 0
}

// probesDir is a target's probes/ directory.
type probesDir struct {
	gofs.Inode
	refuseChanges
	probes ProbeSet
	perms  *perms
	born   time.Time
}

var (
	_ gofs.NodeGetattrer = (*probesDir)(nil)
	_ gofs.NodeLookuper  = (*probesDir)(nil)
	_ gofs.NodeReaddirer = (*probesDir)(nil)
	_ gofs.NodeCreater   = (*probesDir)(nil)
	_ gofs.NodeUnlinker  = (*probesDir)(nil)
	_ gofs.NodeRmdirer   = (*probesDir)(nil)
	_ gofs.NodeSymlinker = (*probesDir)(nil)
)

// Getattr reports a directory.
func (d *probesDir) Getattr(_ context.Context, _ gofs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	d.perms.setAttr(&out.Attr, syscall.S_IFDIR|d.perms.privateDir, 0, d.born)
	out.SetTimeout(staticTimeout)
	return 0
}

// node returns the inode for probe name, reusing the one already in the
// tree so that open files and lookups agree.
func (d *probesDir) node(ctx context.Context, name string) *gofs.Inode {
	if ch := d.GetChild(name); ch != nil {
		return ch
	}
	return d.NewInode(ctx, &probeNode{probes: d.probes, perms: d.perms, name: name, born: time.Now()}, gofs.StableAttr{Mode: syscall.S_IFREG})
}

// Lookup finds a probe the engine knows.
func (d *probesDir) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	if _, ok := d.probes.ProbeText(name); !ok {
		// The engine may have dropped the probe on its own.
		d.RmChild(name)
		return nil, syscall.ENOENT
	}
	ch := d.node(ctx, name)
	return ch, entryOut(ctx, ch, out)
}

// Readdir lists the engine's probes, sorted.
func (d *probesDir) Readdir(context.Context) (gofs.DirStream, syscall.Errno) {
	names := d.probes.Probes()
	sort.Strings(names)
	entries := make([]fuse.DirEntry, len(names))
	for i, n := range names {
		entries[i] = fuse.DirEntry{Name: n, Mode: syscall.S_IFREG}
	}
	return gofs.NewListDirStream(entries), 0
}

// Create makes an empty probe; the spec comes with the first write.
func (d *probesDir) Create(ctx context.Context, name string, flags, _ uint32, out *fuse.EntryOut) (*gofs.Inode, gofs.FileHandle, uint32, syscall.Errno) {
	if errno := d.perms.control(ctx, "create probe", syscall.EACCES); errno != 0 {
		return nil, nil, 0, errno
	}
	if errno := toErrno("create probe "+name, d.probes.CreateProbe(name)); errno != 0 {
		return nil, nil, 0, errno
	}
	ch := d.node(ctx, name)
	pn, ok := ch.Operations().(*probeNode)
	if !ok {
		return nil, nil, 0, syscall.EIO
	}
	h := &probeHandle{probe: pn, appendMode: flags&syscall.O_APPEND != 0, exclusive: flags&syscall.O_EXCL != 0}
	if errno := entryOut(ctx, ch, out); errno != 0 {
		return nil, nil, 0, errno
	}
	return ch, h, fuse.FOPEN_DIRECT_IO, 0
}

// Unlink removes a probe: `rm probes/NAME`.
func (d *probesDir) Unlink(ctx context.Context, name string) syscall.Errno {
	if errno := d.perms.control(ctx, "remove probe", syscall.EPERM); errno != 0 {
		return errno
	}
	return toErrno("remove probe "+name, d.probes.RemoveProbe(name))
}

// Rename renames a probe within probes/ (`mv`, and the temp file that
// `sed -i` renames over the probe it edits); across directories it
// gives EXDEV, so that mv copies and then the copy is checked as a write.
func (d *probesDir) Rename(ctx context.Context, name string, newParent gofs.InodeEmbedder, newName string, flags uint32) syscall.Errno {
	if errno := d.perms.control(ctx, "rename probe", syscall.EPERM); errno != 0 {
		return errno
	}
	if newParent.EmbeddedInode() != d.EmbeddedInode() {
		return syscall.EXDEV
	}
	if flags&^unix.RENAME_NOREPLACE != 0 {
		return syscall.EINVAL
	}
	errno := toErrno("rename probe "+name, d.probes.RenameProbe(name, newName, flags&unix.RENAME_NOREPLACE != 0))
	if errno == 0 {
		if ch := d.GetChild(name); ch != nil {
			if pn, ok := ch.Operations().(*probeNode); ok {
				pn.setName(newName)
			}
		}
	}
	return errno
}

// Rmdir refuses: probes are files.
func (d *probesDir) Rmdir(_ context.Context, name string) syscall.Errno {
	if _, ok := d.probes.ProbeText(name); ok {
		return syscall.ENOTDIR
	}
	return syscall.ENOENT
}

// Symlink refuses: a probe is a spec, not a link.
func (d *probesDir) Symlink(context.Context, string, string, *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	return nil, syscall.EPERM
}

// probeNode is probes/NAME.
type probeNode struct {
	gofs.Inode
	probes ProbeSet
	perms  *perms
	born   time.Time

	mu   sync.Mutex // guards name, which a rename changes
	name string
}

// probeName returns the probe's name.
func (p *probeNode) probeName() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.name
}

func (p *probeNode) setName(name string) {
	p.mu.Lock()
	p.name = name
	p.mu.Unlock()
}

var (
	_ gofs.NodeOpener    = (*probeNode)(nil)
	_ gofs.NodeGetattrer = (*probeNode)(nil)
	_ gofs.NodeSetattrer = (*probeNode)(nil)
	_ gofs.FileReader    = (*probeHandle)(nil)
	_ gofs.FileWriter    = (*probeHandle)(nil)
	_ gofs.FileFlusher   = (*probeHandle)(nil)
	_ gofs.NodeRenamer   = (*probesDir)(nil)
)

// probeHandle is one open of a probe file: the text shown at open, and
// the text written through this open so far.
type probeHandle struct {
	probe      *probeNode
	appendMode bool
	// exclusive: created with O_EXCL, a temp file to be renamed over a
	// probe (StageProbe).
	exclusive bool

	mu       sync.Mutex
	snapshot []byte
	pending  []byte
	// dirty: pending has text that was not given to the engine yet (a
	// line without its newline).
	dirty bool
}

// Open snapshots the probe's text. Opening with O_TRUNC leaves the
// working probe alone: it only means this open's pending text starts
// empty, which it always does. Only those who control the mount may open
// for write.
func (p *probeNode) Open(ctx context.Context, flags uint32) (gofs.FileHandle, uint32, syscall.Errno) {
	if wantsWrite(flags) {
		if errno := p.perms.control(ctx, "open probe for write", syscall.EACCES); errno != 0 {
			return nil, 0, errno
		}
	}
	text, ok := p.probes.ProbeText(p.probeName())
	if !ok {
		return nil, 0, syscall.ENOENT
	}
	return &probeHandle{probe: p, snapshot: text, appendMode: flags&syscall.O_APPEND != 0}, fuse.FOPEN_DIRECT_IO, 0
}

// Getattr reports the size of the probe's text.
func (p *probeNode) Getattr(_ context.Context, f gofs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	text, ok := p.probes.ProbeText(p.probeName())
	if !ok {
		h, open := f.(*probeHandle)
		if !open {
			return syscall.ENOENT
		}
		// Removed while open: describe what this open still shows.
		h.mu.Lock()
		text = h.snapshot
		h.mu.Unlock()
	}
	p.perms.setAttr(&out.Attr, syscall.S_IFREG|p.perms.private, int64(len(text)), p.born)
	out.SetTimeout(0)
	return 0
}

// Setattr on truncation to 0 (`>` without atomic O_TRUNC) resets the
// pending text of that open and keeps the working probe. Time changes are
// accepted and ignored; other changes are refused.
func (p *probeNode) Setattr(ctx context.Context, f gofs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	if errno := p.perms.control(ctx, "setattr probe", syscall.EPERM); errno != 0 {
		return errno
	}
	// What the node has already is no change: `sed -i` copies the
	// owner and mode of the file it edits to its temp file.
	if !p.perms.sameAttr(in) {
		return syscall.EPERM
	}
	if sz, ok := in.GetSize(); ok {
		if sz != 0 {
			return syscall.EINVAL
		}
		if h, ok := f.(*probeHandle); ok {
			h.mu.Lock()
			h.pending, h.dirty = h.pending[:0], false
			h.mu.Unlock()
		}
	}
	return p.Getattr(ctx, f, out)
}

// Read serves the text snapshotted at open.
func (h *probeHandle) Read(ctx context.Context, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return readSnapshot(ctx, h.snapshot, dest, off)
}

// maxSpec bounds the text one open may write: a spec is one line.
const maxSpec = 64 << 10

// Write places data at off in this open's pending text and installs the
// result once the line is complete: at once when the text ends with a
// newline, else at close (Flush), so that a spec written in pieces
// (`printf a; printf b`) is parsed whole. The check must happen in Write
// where it can: bash's echo reports a write error but ignores a close
// error, and it always ends its line.
func (h *probeHandle) Write(ctx context.Context, data []byte, off int64) (uint32, syscall.Errno) {
	if errno := h.probe.perms.control(ctx, "write probe", syscall.EPERM); errno != 0 {
		return 0, errno
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.appendMode {
		// The kernel passes the file size it knows, which is the size of
		// the probe's text, not of what this open wrote.
		off = int64(len(h.pending))
	}
	if off < 0 || off > int64(len(h.pending)) {
		// A hole would put NUL bytes into the spec.
		return 0, syscall.EINVAL
	}
	end := off + int64(len(data))
	if end > maxSpec {
		return 0, syscall.EFBIG
	}
	if end > int64(len(h.pending)) {
		h.pending = append(h.pending, make([]byte, end-int64(len(h.pending)))...)
	}
	copy(h.pending[off:], data)
	h.dirty = true
	if !bytes.HasSuffix(h.pending, []byte("\n")) {
		return uint32(len(data)), 0
	}
	if errno := h.install(); errno != 0 {
		return 0, errno
	}
	return uint32(len(data)), 0
}

// Flush installs a last line written without its newline.
func (h *probeHandle) Flush(context.Context) syscall.Errno {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.dirty {
		return 0
	}
	return h.install()
}

// install gives the pending text to the engine; h.mu is held.
func (h *probeHandle) install() syscall.Errno {
	h.dirty = false
	name := h.probe.probeName()
	spec := strings.TrimRight(string(h.pending), "\r\n")
	set := h.probe.probes.SetProbe
	if h.exclusive {
		set = h.probe.probes.StageProbe
	}
	return toErrno("set probe "+name, set(name, spec))
}
