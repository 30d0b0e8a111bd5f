module ptfs

go 1.26.0

require (
	github.com/hanwen/go-fuse/v2 v2.12.1
	github.com/ianlancetaylor/demangle v0.0.0-20260724033716-83e58baca724
	github.com/sirupsen/logrus v1.10.2
	golang.org/x/arch v0.33.0
	golang.org/x/sys v0.50.0
)
