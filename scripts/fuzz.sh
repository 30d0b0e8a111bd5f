#!/usr/bin/env bash
# Runs every fuzz target of the module for FUZZTIME each (make fuzz).
#
# A target fails on a finding: go test writes the input to the package's
# testdata/fuzz/TARGET/ and exits non-zero. Go 1.26's coordinator also
# exits non-zero, with a bare "context deadline exceeded" and no input
# written, when -fuzztime ends while a worker is mid-call (go.dev/issue/75804,
# fixed in Go 1.27): that run is reported as such, its seeds are replayed
# (go test -run TARGET, which a real finding would fail), and the sweep
# goes on. New inputs are minimized for at most FUZZMINIMIZETIME (5s, not
# go test's 60s): on a slow target (objfile's, about 100 runs a second) or
# a large input a minimization took the whole FUZZTIME with no run
# counted, and the deadline then fell inside it.
set -uo pipefail
GO="${GO:-go}"
FUZZTIME="${1:-20s}"
FUZZMINIMIZETIME="${FUZZMINIMIZETIME:-5s}"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
# A package that does not list (or build) stops the sweep: its targets
# would be skipped without a word.
pkgs=$("$GO" list ./...) || exit 1
for pkg in $pkgs; do
	dir=$("$GO" list -f '{{.Dir}}' "$pkg") || exit 1
	targets=$("$GO" test -list '^Fuzz' "$pkg") || { echo "-- $pkg: go test -list failed" >&2; exit 1; }
	for f in $(grep '^Fuzz' <<<"$targets"); do
		echo "== $pkg $f"
		corpus="$dir/testdata/fuzz/$f"
		before=$(ls "$corpus" 2>/dev/null | wc -l)
		if "$GO" test -run '^$' -fuzz "^$f\$" -fuzztime "$FUZZTIME" -fuzzminimizetime "$FUZZMINIMIZETIME" "$pkg" 2>&1 | tee "$log"; then
			continue
		fi
		after=$(ls "$corpus" 2>/dev/null | wc -l)
		if [ "$after" = "$before" ] && tail -n 5 "$log" | grep -q '^    context deadline exceeded$' &&
			"$GO" test -count=1 -run "^$f\$" "$pkg" >/dev/null; then
			echo "-- $f: the coordinator's end-of-time race (go.dev/issue/75804), no input written, seeds pass"
			continue
		fi
		echo "-- $f failed: see $corpus" >&2
		exit 1
	done
done
