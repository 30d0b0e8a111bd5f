#!/usr/bin/env bash
# demo: build a small program, mount ptfs on it, install a probe, run the
# program, print the records and the status, unmount. Needs root.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
mnt="$work/mnt"
mkdir -p "$mnt"
ptfs="$top/bin/ptfs"
gcc -O2 -no-pie -o "$work/t" "$top/testdata/target.c"

"$ptfs" mount "$mnt" "$work/t" &
pid=$!
cleanup() {
	kill -TERM "$pid" 2>/dev/null || true
	wait "$pid" 2>/dev/null || true
	rm -rf "$work"
}
trap cleanup EXIT
for _ in $(seq 100); do [ -e "$mnt/status" ] && break; sleep 0.05; done

set -x
cat "$mnt/status"
ls "$mnt/t"
grep -w target "$mnt/t/symbols"
echo 'target a=%di b=%si' > "$mnt/t/probes/e"
cat "$mnt/t/probes/e"
"$work/t" 5
sleep 0.3
cat "$mnt/t/records"
echo 'target %nosuch' > "$mnt/t/probes/bad" || true
cat "$mnt/t/probes/bad"
grep summary "$mnt/t/status"
