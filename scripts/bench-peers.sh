#!/usr/bin/env bash
# bench-peers: one probe workload through ptfs and its peers, in one run.
# testdata/nop5.c calls hot(i, i+1) N times (1,000,000 by default); each
# tracer puts one probe on hot's first instruction (a 5-byte NOP) and
# writes one text line per hit with the argument:
#   ptfs      classic mode, `hot a=%di`, its records file read by tail -f
#   bpftrace  uprobe:BIN:hot { printf("%lu\n", arg0) }
#   perf      perf probe `hot a=%di`, perf record -a, then perf script
# For each it prints the traced program's wall time per hit, the tracer's
# CPU per hit (the CPU of its processes: the ptfs mount and its reader;
# bpftrace; perf record and perf script), the lines produced and the
# losses: what the tool reported lost (ptfs: records, bpftrace: events,
# perf: LOST records, each a run of samples), and the hits with no line.
# A tool that is missing or refuses is skipped with the reason. Needs root.
# Usage: scripts/bench-peers.sh [N]     (make bench-peers N=...)
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
n=${1:-1000000}
case $n in '' | *[!0-9]*) echo "bench-peers: N must be a number: $n" >&2; exit 2 ;; esac
[ "$(id -u)" = 0 ] || { echo "bench-peers: needs root (uprobes, FUSE)" >&2; exit 2; }
command -v gcc >/dev/null || { echo "bench-peers: needs gcc" >&2; exit 2; }
work=$(mktemp -d)
# Each tracer's own names: nothing of anyone else's is touched.
group=ptfspeers$$
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
	for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
	if [ -n "${perf:-}" ]; then "$perf" probe -q -d "$group:*" >/dev/null 2>&1 || true; fi
	mountpoint -q "$work/mnt" 2>/dev/null && umount "$work/mnt"
	rm -rf "$work"
}
trap cleanup EXIT
bin=$work/nop5
gcc -O2 -no-pie -o "$bin" "$top/testdata/nop5.c" -lpthread
tck=$(getconf CLK_TCK)

# cpu_ns PID: the CPU time in ns that process PID (all its threads) used.
cpu_ns() {
	local f
	f=($(sed 's/^.*) //' "/proc/$1/stat"))
	# After the command and state: utime and stime are fields 12 and 13.
	echo $(((f[11] + f[12]) * 1000000000 / tck))
}
now_ns() { date +%s%N; }
# children_ns: set ns to the CPU in ns of this shell's waited-for
# children (times). Not in $(...): a subshell's times start at zero.
children_ns() {
	local u s
	times >"$work/times"
	read -r u s < <(sed -n 2p "$work/times")
	ns=$(($(tosec "$u") + $(tosec "$s")))
}
# tosec 1m2.345s -> ns
tosec() {
	local m=${1%%m*} s=${1#*m}
	s=${s%s}
	echo $((m * 60000000000 + 10#${s%.*} * 1000000000 + 10#${s#*.} * 1000000))
}
# settle FILE N: wait until FILE has N lines or stops growing for 3 s.
settle() {
	local last=-1 same=0 cur
	while :; do
		cur=$(wc -l <"$1")
		[ "$cur" -ge "$2" ] && break
		if [ "$cur" = "$last" ]; then
			same=$((same + 1))
			[ "$same" -ge 30 ] && break
		else
			same=0
		fi
		last=$cur
		sleep 0.1
	done
}
# run_prog: run the traced program, print its wall time in ns.
run_prog() {
	local t0 t1
	t0=$(now_ns)
	"$bin" "$n" >/dev/null
	t1=$(now_ns)
	echo $((t1 - t0))
}
rows=()
# row TOOL PROG_NS TRACER_NS LINES LOST
row() {
	rows+=("$(printf '%-9s %14s %14s %10s %8s %8s' "$1" \
		"$(awk -v t="$2" -v n="$n" 'BEGIN{printf "%.0f", t/n}')" \
		"$(awk -v t="$3" -v n="$n" 'BEGIN{printf "%.0f", t/n}')" \
		"$4" "$5" "$((n - $4))")")
}
skip() { rows+=("$(printf '%-9s skipped: %s' "$1" "$2")"); }

base=$(run_prog)
rows+=("$(printf '%-9s %14s %14s %10s %8s %8s' none "$(awk -v t="$base" -v n="$n" 'BEGIN{printf "%.0f", t/n}')" - - - -)")

# ptfs, classic mode.
bench_ptfs() {
	local ptfs=$top/bin/ptfs mnt=$work/mnt pid tail c0 c1 t lost
	(cd "$top" && make -s build) || { skip ptfs "make build failed"; return; }
	mkdir -p "$mnt"
	"$ptfs" mount --mode classic --max-stream=2000000000 --max-stream-hard=2000000000 "$mnt" "t=$bin" 2>"$work/ptfs.log" &
	pid=$!
	pids+=("$pid")
	for _ in $(seq 200); do [ -e "$mnt/t/records" ] && break; sleep 0.05; done
	[ -e "$mnt/t/records" ] || { skip ptfs "mount failed: $(tail -1 "$work/ptfs.log")"; return; }
	echo 'hot a=%di' >"$mnt/t/probes/e" || { skip ptfs "probe refused: $(grep error "$mnt/t/probes/e")"; return; }
	# What a hit costs at this site (the probe file's classic line).
	site=$(grep '^# classic:' "$mnt/t/probes/e" || true)
	tail -n +1 -f "$mnt/t/records" >"$work/ptfs.out" &
	tail=$!
	pids+=("$tail")
	c0=$(($(cpu_ns "$pid") + $(cpu_ns "$tail")))
	t=$(run_prog)
	settle "$work/ptfs.out" "$n"
	c1=$(($(cpu_ns "$pid") + $(cpu_ns "$tail")))
	lost=$(sed -n 's/^lost: \([0-9]*\).*/\1/p' "$mnt/t/status" | head -1 || true)
	row ptfs "$t" $((c1 - c0)) "$(wc -l <"$work/ptfs.out")" "${lost:-?}"
	kill "$tail"
	wait "$tail" 2>/dev/null || true
	umount "$mnt"
	wait "$pid" || true
}

bench_bpftrace() {
	local pid c0 c1 t lost
	command -v bpftrace >/dev/null || { skip bpftrace "not installed (apt-get install bpftrace)"; return; }
	bpftrace -e "uprobe:$bin:hot { printf(\"%lu\\n\", arg0); }" >"$work/bt.out" 2>"$work/bt.err" &
	pid=$!
	pids+=("$pid")
	for _ in $(seq 300); do grep -q Attaching "$work/bt.out" && break; kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
	grep -q Attaching "$work/bt.out" || { skip bpftrace "did not attach: $(head -c 200 "$work/bt.err")"; return; }
	sleep 0.5
	c0=$(cpu_ns "$pid")
	t=$(run_prog)
	settle "$work/bt.out" $((n + 1))
	c1=$(cpu_ns "$pid")
	kill -INT "$pid"
	wait "$pid" || true
	lost=$({ grep -ho 'Lost [0-9]* events' "$work/bt.out" "$work/bt.err" || true; } | awk '{s += $2} END {print s + 0}')
	row bpftrace "$t" $((c1 - c0)) "$(grep -c '^[0-9]' "$work/bt.out" || true)" "$lost"
}

bench_perf() {
	local pid c0 c1 s0 s1 t lost
	perf=$(command -v perf || true)
	[ -n "$perf" ] || { skip perf "not installed (apt-get install linux-perf)"; return; }
	if ! "$perf" probe -q -x "$bin" -a "$group:hot=hot a=%di" >"$work/perf.probe" 2>&1; then
		skip perf "perf probe refused: $(head -c 200 "$work/perf.probe")"
		return
	fi
	"$perf" record -q -a -e "$group:hot" -o "$work/perf.data" >"$work/perf.rec" 2>&1 &
	pid=$!
	pids+=("$pid")
	sleep 1
	kill -0 "$pid" 2>/dev/null || { skip perf "perf record failed: $(head -c 200 "$work/perf.rec")"; return; }
	c0=$(cpu_ns "$pid")
	t=$(run_prog)
	sleep 1
	c1=$(cpu_ns "$pid")
	kill -INT "$pid"
	wait "$pid" || true
	children_ns
	s0=$ns
	"$perf" script -i "$work/perf.data" >"$work/perf.out" 2>"$work/perf.err" || true
	children_ns
	s1=$ns
	lost=$("$perf" report -i "$work/perf.data" --stats 2>/dev/null | awk '/^ *LOST events:/ {s += $3} END {print s + 0}')
	row perf "$t" $((c1 - c0 + s1 - s0)) "$(grep -c 'a=' "$work/perf.out" || true)" "$lost"
}

bench_ptfs
bench_bpftrace
bench_perf
echo "bench-peers: $n hits of one probe on a 5-byte NOP site, one line per hit; $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) CPUs ($(sed -n 's/^model name[^:]*: //p' /proc/cpuinfo | head -1)), kernel $(uname -r), load $(cut -d' ' -f1-3 /proc/loadavg)"
printf '%-9s %14s %14s %10s %8s %8s\n' tool prog-ns/hit tracer-ns/hit lines lost missing
printf '%s\n' "${rows[@]}"
[ -z "${site:-}" ] || echo "ptfs probe file: $site"
