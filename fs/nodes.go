package fs

import (
	"context"
	"path"
	"sort"
	"sync"
	"syscall"
	"time"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// staticTimeout is the attribute timeout of nodes whose attributes never
// change (directories, exe). Everything else uses 0.
const staticTimeout = time.Second

// entryOut fills a lookup reply from the child's own Getattr, keeping its
// attribute timeout; the entry timeout stays 0 because names come and go.
func entryOut(ctx context.Context, ch *gofs.Inode, out *fuse.EntryOut) syscall.Errno {
	g, ok := ch.Operations().(gofs.NodeGetattrer)
	if !ok {
		return 0
	}
	var a fuse.AttrOut
	if errno := g.Getattr(ctx, nil, &a); errno != 0 {
		return errno
	}
	out.Attr = a.Attr
	out.SetAttrTimeout(a.Timeout())
	return 0
}

// forgetTree drops a persistent subtree that is no longer reachable.
func forgetTree(n *gofs.Inode) {
	for _, ch := range n.Children() {
		forgetTree(ch)
	}
	n.ForgetPersistent()
}

// refuseChanges is embedded by directories whose entries users may not
// create, rename or link. Removal is handled by each directory.
type refuseChanges struct{}

var (
	_ gofs.NodeRenamer   = refuseChanges{}
	_ gofs.NodeMkdirer   = refuseChanges{}
	_ gofs.NodeMknoder   = refuseChanges{}
	_ gofs.NodeLinker    = refuseChanges{}
	_ gofs.NodeSetattrer = refuseChanges{}
)

// Rename refuses: names are fixed or chosen by their creator.
func (refuseChanges) Rename(context.Context, string, gofs.InodeEmbedder, string, uint32) syscall.Errno {
	return syscall.EPERM
}

// Mkdir refuses: no directory can be made here.
func (refuseChanges) Mkdir(context.Context, string, uint32, *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	return nil, syscall.EPERM
}

// Mknod refuses: no device or fifo can be made here.
func (refuseChanges) Mknod(context.Context, string, uint32, uint32, *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	return nil, syscall.EPERM
}

// Link refuses hard links.
func (refuseChanges) Link(context.Context, gofs.InodeEmbedder, string, *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	return nil, syscall.EPERM
}

// Setattr refuses chmod, chown and truncate of a directory.
func (refuseChanges) Setattr(context.Context, gofs.FileHandle, *fuse.SetAttrIn, *fuse.AttrOut) syscall.Errno {
	return syscall.EPERM
}

// rootNode is the mount's root: `status` and one directory per target.
type rootNode struct {
	gofs.Inode
	refuseChanges
	tracer Tracer
	perms  *perms
	born   time.Time

	mu      sync.Mutex
	status  *gofs.Inode
	targets map[string]*gofs.Inode
	// busy holds the names being added or removed: the tracer call runs
	// without mu (it parses ELF files and removes probes), so the name is
	// reserved under mu first and published or released after.
	busy map[string]bool
}

var (
	_ gofs.NodeOnAdder   = (*rootNode)(nil)
	_ gofs.NodeGetattrer = (*rootNode)(nil)
	_ gofs.NodeLookuper  = (*rootNode)(nil)
	_ gofs.NodeReaddirer = (*rootNode)(nil)
	_ gofs.NodeSymlinker = (*rootNode)(nil)
	_ gofs.NodeCreater   = (*rootNode)(nil)
	_ gofs.NodeUnlinker  = (*rootNode)(nil)
	_ gofs.NodeRmdirer   = (*rootNode)(nil)
	_ gofs.NodeSetattrer = (*rootNode)(nil)
	_ gofs.NodeRenamer   = (*rootNode)(nil)
)

const rootStatus = "status"

// OnAdd builds the tree present at mount time.
func (r *rootNode) OnAdd(ctx context.Context) {
	r.born = time.Now()
	r.targets = make(map[string]*gofs.Inode)
	r.busy = make(map[string]bool)
	tracer := r.tracer
	r.status = r.NewPersistentInode(ctx, newStatusNode(r.perms, r.born, tracer), gofs.StableAttr{Mode: syscall.S_IFREG})
	r.AddChild(rootStatus, r.status, true)
	for _, t := range tracer.Targets() {
		dir := newTargetDir(ctx, &r.Inode, t, r.perms, r.born)
		r.targets[t.Name()] = dir
		r.AddChild(t.Name(), dir, true)
	}
}

// Getattr reports a directory.
func (r *rootNode) Getattr(_ context.Context, _ gofs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	r.perms.setAttr(&out.Attr, syscall.S_IFDIR|0o755, 0, r.born)
	out.SetTimeout(staticTimeout)
	return 0
}

// Lookup resolves `status` and target names. Targets are looked up here
// rather than in the inode tree because `ln -s` first leaves a symlink
// node under the name (see Symlink).
func (r *rootNode) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	r.mu.Lock()
	ch := r.targets[name]
	r.mu.Unlock()
	if name == rootStatus {
		ch = r.status
	}
	if ch == nil {
		return nil, syscall.ENOENT
	}
	return ch, entryOut(ctx, ch, out)
}

// Readdir lists `status` and the targets, sorted.
func (r *rootNode) Readdir(context.Context) (gofs.DirStream, syscall.Errno) {
	r.mu.Lock()
	names := make([]string, 0, len(r.targets))
	for n := range r.targets {
		names = append(names, n)
	}
	r.mu.Unlock()
	sort.Strings(names)
	entries := make([]fuse.DirEntry, 0, len(names)+1)
	entries = append(entries, fuse.DirEntry{Name: rootStatus, Mode: syscall.S_IFREG})
	for _, n := range names {
		entries = append(entries, fuse.DirEntry{Name: n, Mode: syscall.S_IFDIR})
	}
	return gofs.NewListDirStream(entries), 0
}

// Symlink adds a target: `ln -s PATH MNT/NAME`. The target appears as a
// directory, but the kernel insists that the reply to a symlink request
// describes a symlink (else ln fails with EIO). So the reply is a transient
// symlink node with entry timeout 0: the next path walk looks the name up
// again and gets the directory. The name is reserved while the tracer
// opens the binary, without the lock, so that lookups and `stat` answer
// meanwhile and a second `ln -s` of the name gets EEXIST.
func (r *rootNode) Symlink(ctx context.Context, target, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	if errno := r.perms.control(ctx, "add target", syscall.EPERM); errno != 0 {
		return nil, errno
	}
	r.mu.Lock()
	if name == rootStatus || r.targets[name] != nil || r.busy[name] {
		r.mu.Unlock()
		return nil, syscall.EEXIST
	}
	r.busy[name] = true
	r.mu.Unlock()
	t, err := r.tracer.AddTarget(name, target)
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.busy, name)
	if errno := toErrno("add target "+name, err); errno != 0 {
		return nil, errno
	}
	r.targets[name] = newTargetDir(ctx, &r.Inode, t, r.perms, time.Now())
	link := r.NewInode(ctx, &linkNode{perms: r.perms, path: target, born: time.Now()}, gofs.StableAttr{Mode: syscall.S_IFLNK})
	return link, entryOut(ctx, link, out)
}

// Create refuses: only `ln -s` adds entries to the root.
func (r *rootNode) Create(context.Context, string, uint32, uint32, *fuse.EntryOut) (*gofs.Inode, gofs.FileHandle, uint32, syscall.Errno) {
	return nil, nil, 0, syscall.EPERM
}

// Unlink refuses `status`; targets are directories, removed by rmdir.
func (r *rootNode) Unlink(ctx context.Context, name string) syscall.Errno {
	if errno := r.perms.control(ctx, "unlink", syscall.EPERM); errno != 0 {
		return errno
	}
	if name == rootStatus {
		return syscall.EPERM
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.targets[name] != nil {
		return syscall.EISDIR
	}
	return syscall.ENOENT
}

// Rmdir removes a target: `rmdir MNT/NAME`.
func (r *rootNode) Rmdir(ctx context.Context, name string) syscall.Errno {
	if errno := r.perms.control(ctx, "remove target", syscall.EPERM); errno != 0 {
		return errno
	}
	if name == rootStatus {
		return syscall.ENOTDIR
	}
	r.mu.Lock()
	dir := r.targets[name]
	if dir == nil || r.busy[name] {
		r.mu.Unlock()
		if dir != nil {
			return syscall.EBUSY // a removal of it is under way
		}
		return syscall.ENOENT
	}
	// The directory stays visible while its probes go.
	r.busy[name] = true
	r.mu.Unlock()
	err := r.tracer.RemoveTarget(name)
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.busy, name)
	if errno := toErrno("remove target "+name, err); errno != 0 {
		return errno
	}
	delete(r.targets, name)
	forgetTree(dir)
	return 0
}

// targetNode is one target's directory; its entries are fixed.
type targetNode struct {
	gofs.Inode
	refuseChanges
	perms *perms
	born  time.Time
}

var (
	_ gofs.NodeGetattrer = (*targetNode)(nil)
	_ gofs.NodeUnlinker  = (*targetNode)(nil)
	_ gofs.NodeRmdirer   = (*targetNode)(nil)
	_ gofs.NodeCreater   = (*targetNode)(nil)
	_ gofs.NodeSymlinker = (*targetNode)(nil)
)

// newTargetDir builds the persistent subtree of target t (DESIGN §2);
// each node gets only the part of t it uses.
func newTargetDir(ctx context.Context, parent *gofs.Inode, t Target, p *perms, born time.Time) *gofs.Inode {
	dir := parent.NewPersistentInode(ctx, &targetNode{perms: p, born: born}, gofs.StableAttr{Mode: syscall.S_IFDIR})
	add := func(name string, node gofs.InodeEmbedder, mode uint32) {
		dir.AddChild(name, dir.NewPersistentInode(ctx, node, gofs.StableAttr{Mode: mode}), true)
	}
	add("exe", &linkNode{perms: p, path: t.Path(), born: born}, syscall.S_IFLNK)
	add("probes", &probesDir{probes: t, perms: p, born: born}, syscall.S_IFDIR)
	add("records", newRecordsNode(p, born, t), syscall.S_IFREG)
	add("branches", newBranchesNode(p, born, t), syscall.S_IFREG)
	add("status", newStatusNode(p, born, t), syscall.S_IFREG)
	add("symbols", &genNode{perms: p, born: born, content: t.Symbols}, syscall.S_IFREG)
	return dir
}

// Getattr reports a directory.
func (d *targetNode) Getattr(_ context.Context, _ gofs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	d.perms.setAttr(&out.Attr, syscall.S_IFDIR|0o755, 0, d.born)
	out.SetTimeout(staticTimeout)
	return 0
}

// fixedErrno is the answer to removing name from a directory of fixed
// entries.
func (d *targetNode) fixedErrno(name string) syscall.Errno {
	if d.GetChild(name) == nil {
		return syscall.ENOENT
	}
	return syscall.EPERM
}

// Unlink refuses: the entries of a target directory are fixed.
func (d *targetNode) Unlink(_ context.Context, name string) syscall.Errno {
	return d.fixedErrno(name)
}

// Rmdir refuses: the entries of a target directory are fixed.
func (d *targetNode) Rmdir(_ context.Context, name string) syscall.Errno {
	return d.fixedErrno(name)
}

// Create refuses: the entries of a target directory are fixed.
func (d *targetNode) Create(context.Context, string, uint32, uint32, *fuse.EntryOut) (*gofs.Inode, gofs.FileHandle, uint32, syscall.Errno) {
	return nil, nil, 0, syscall.EPERM
}

// Symlink refuses: the entries of a target directory are fixed. `ln -s
// PATH MNT/NAME` onto an existing target NAME lands here, as a link named
// after PATH's last element inside NAME: that target exists (EEXIST).
func (d *targetNode) Symlink(_ context.Context, target, name string, _ *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	if d.GetChild(name) != nil || path.Base(target) == name {
		return nil, syscall.EEXIST
	}
	return nil, syscall.EPERM
}

// linkNode is a symlink: `exe`, or the transient reply to `ln -s`.
type linkNode struct {
	gofs.Inode
	perms *perms
	path  string
	born  time.Time
}

var (
	_ gofs.NodeReadlinker = (*linkNode)(nil)
	_ gofs.NodeGetattrer  = (*linkNode)(nil)
)

// Readlink returns the link's target.
func (l *linkNode) Readlink(context.Context) ([]byte, syscall.Errno) {
	return []byte(l.path), 0
}

// Getattr reports a symlink; its attributes never change.
func (l *linkNode) Getattr(_ context.Context, _ gofs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	l.perms.setAttr(&out.Attr, syscall.S_IFLNK|0o777, int64(len(l.path)), l.born)
	out.SetTimeout(staticTimeout)
	return 0
}
