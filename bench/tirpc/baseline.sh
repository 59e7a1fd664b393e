#!/usr/bin/env bash
# The libtirpc-over-TCP baseline by hand (docs/BENCHMARKS.md): builds the
# peer, starts the server on a free loopback port, runs the standard
# workloads and prints one JSON line each, with the server's CPU seconds
# (from /proc/<pid>/stat, 10 ms ticks) and, for bulk runs, client and server
# CPU seconds per GB (10^9 bytes) added.
#
#   bench/tirpc/baseline.sh                  the standard set
#   RUN_SECONDS=10 LAT_ITERATIONS=50000 bench/tirpc/baseline.sh
#   bench/tirpc/baseline.sh read --size 1m --depth 4 --seconds 5   one run
set -euo pipefail
cd "$(dirname "$0")/../.."

RUN_SECONDS=${RUN_SECONDS:-5}
LAT_ITERATIONS=${LAT_ITERATIONS:-20000}

cargo build --release --quiet -p bench >&2
dir=$(ls -td target/release/build/bench-*/out/tirpc 2>/dev/null | head -n 1)
if [ -z "$dir" ] || [ ! -x "$dir/bench_prog_server" ]; then
  echo "baseline.sh: the libtirpc peer was not built (see the cargo warning above)" >&2
  exit 1
fi

coproc SERVER { exec "$dir/bench_prog_server" 0; }
server_pid=$SERVER_PID
trap 'kill -TERM "$server_pid" 2>/dev/null; wait "$server_pid" 2>/dev/null || true' EXIT
read -r word port <&"${SERVER[0]}"
[ "$word" = ready ] || { echo "baseline.sh: server said: $word $port" >&2; exit 1; }

tick=$(getconf CLK_TCK)
# utime + stime of the server, in seconds (fields 14 and 15 of stat; the
# command name may hold spaces, so count after the last ')').
server_cpu() {
  awk -v t="$tick" '{ sub(/.*\) /, ""); printf "%.2f", ($12 + $13) / t }' "/proc/$server_pid/stat"
}

run() {
  local before after out srv
  before=$(server_cpu)
  out=$("$dir/bench_prog_client" --port "$port" "$@")
  after=$(server_cpu)
  srv=$(awk -v a="$after" -v b="$before" 'BEGIN { printf "%.2f", a - b }')
  awk -v j="$out" -v s="$srv" 'BEGIN {
    extra = ",\"server_cpu_s\":" s
    if (match(j, /"bytes":[0-9]+/)) {
      bytes = substr(j, RSTART + 8, RLENGTH - 8)
      match(j, /"client_cpu_s":[0-9.]+/)
      c = substr(j, RSTART + 15, RLENGTH - 15)
      if (bytes > 0)
        extra = extra sprintf(",\"client_cpu_s_per_gb\":%.3f,\"server_cpu_s_per_gb\":%.3f",
                              c / (bytes / 1e9), s / (bytes / 1e9))
    }
    sub(/}$/, extra "}", j)
    print j
  }'
}

if [ $# -gt 0 ]; then
  run "$@"
  exit 0
fi

run lat --proc null --iterations "$LAT_ITERATIONS"
run lat --proc echo --size 4k --iterations "$LAT_ITERATIONS"
run rate --depth 1 --seconds "$RUN_SECONDS"
run rate --depth 4 --seconds "$RUN_SECONDS"
run read --size 256k --depth 1 --seconds "$RUN_SECONDS"
run read --size 256k --depth 8 --seconds "$RUN_SECONDS"
run write --size 256k --depth 1 --seconds "$RUN_SECONDS"
run write --size 256k --depth 8 --seconds "$RUN_SECONDS"
