package fs

import (
	"context"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"
	"github.com/sirupsen/logrus"
)

// perms is the permission model of a mount (DESIGN §2, "Who may do what"):
// the owners and modes every node reports, which the kernel checks
// (default_permissions), and the check of the caller that every changing
// request makes again, because mode bits alone let in a caller that has
// CAP_DAC_OVERRIDE but no right to trace.
type perms struct {
	uid, gid uint32
	// private is the mode of the files that show the trace or the probes:
	// the owner's, and with readers the group's too.
	private uint32
	// privateDir is the mode of probes/: its names go with the specs.
	privateDir uint32
	mayTrace   func(pid uint32) (bool, error)
}

func newPerms(o Options) *perms {
	p := &perms{uid: o.UID, gid: o.GID, private: 0o600, privateDir: 0o700, mayTrace: o.MayTrace}
	if o.GroupReads {
		p.private, p.privateDir = 0o640, 0o750
	}
	return p
}

// setAttr fills the attributes every node reports.
func (p *perms) setAttr(out *fuse.Attr, mode uint32, size int64, mtime time.Time) {
	out.Mode = mode
	out.Size = uint64(size)
	out.Nlink = 1
	if mode&syscall.S_IFMT == syscall.S_IFDIR {
		out.Nlink = 2
	}
	out.Uid, out.Gid = p.uid, p.gid
	out.SetTimes(&mtime, &mtime, &mtime)
}

// sameAttr tells whether in changes no owner, group or mode of a
// private node (a probe file): a chmod or chown to what the node has is
// no change.
func (p *perms) sameAttr(in *fuse.SetAttrIn) bool {
	if mode, ok := in.GetMode(); ok && mode&07777 != p.private {
		return false
	}
	if uid, ok := in.GetUID(); ok && uid != p.uid {
		return false
	}
	gid, ok := in.GetGID()
	return !ok || gid == p.gid
}

// control returns 0 if the caller of the request in ctx may change the
// mount (install or remove probes, add or remove targets, truncate the
// trace): the mounting user, or a process with CAP_SYS_ADMIN or
// CAP_PERFMON in its effective set. Anyone else gets denied, the errno
// that op answers for a lack of permission.
func (p *perms) control(ctx context.Context, op string, denied syscall.Errno) syscall.Errno {
	c, ok := fuse.FromContext(ctx)
	if !ok {
		// Not a FUSE request: nobody to vouch for.
		return denied
	}
	if c.Uid == p.uid {
		return 0
	}
	log := logrus.WithFields(logrus.Fields{"op": op, "uid": c.Uid, "pid": c.Pid})
	if p.mayTrace != nil {
		ok, err := p.mayTrace(c.Pid)
		if err == nil && ok {
			return 0
		}
		if err != nil {
			log = log.WithError(err)
		}
	}
	log.Debug("ptfs: refused a caller that may not trace")
	return denied
}
