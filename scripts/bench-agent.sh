#!/usr/bin/env bash
# Measures what `rbscope agent` costs, every figure from this one run:
# 20 Ruby processes, each 4 spinning threads x 50 frames (the target of
# bench-record.sh), profiled at 100 Hz
#   1. by one agent (one clock for all 20): its CPU as % of a core, its
#      CPU per process-tick due (µs) and per process-tick it took (on a
#      machine these 20 processes saturate, many ticks are late and
#      skipped), its RSS (and peak), its failed samples;
#   2. by 20 separate `rbscope record --nonblocking` processes: the same
#      (CPU and RSS summed);
#   3. by the agent at 20 Hz: its CPU;
# beside the targets' slowdown (their loop iterations per second of their
# own CPU time, summed over the 20, against the same targets unprofiled in
# the windows just before and after: what profiling does to them besides
# the CPU it takes, which is its own % of a core), and the floors of tools/readfloor: the paced floor of one
# process (wake up at 100 Hz, one batched read of its stacks), and the
# paced floor of all 20 on one clock (-pids: one wake-up, 20 reads), the
# least any user-space agent can cost.
# Profiles go to a sink that answers 200 to every push (a real Pyroscope
# would compete with the targets for the CPUs).
#
# Needs root, ruby, python3, curl. About 3 minutes. WINDOW=seconds per
# measurement (default 15). With BASELINE_REV=<git revision> the agent of
# that build is measured too at 100 Hz, right after this one's, on the same
# targets (a before/after row in one run). Output: a table on stdout.
source "$(dirname "$0")/lib/bench.sh"
window=${WINDOW:-15}
n=20
go build -o "$work/rbscope" ./cmd/rbscope
if [ -n "${BASELINE_REV:-}" ]; then
  build_baseline "$work/rbscope-before"
fi
go build -o "$work/readfloor" ./tools/readfloor

cat >"$work/target.rb" <<'EOF'
def deep(n, &blk); n > 0 ? deep(n - 1, &blk) : blk.call; end
$count = [0, 0, 0, 0]
def spin(i); c = $count; loop { c[i] += 1 }; end
out = ARGV[0]
Signal.trap("USR1") { File.write(out, "#{Process.clock_gettime(Process::CLOCK_MONOTONIC)} #{$count.sum}") }
File.write(out + ".ready", "")
3.times { |i| Thread.new { deep(47) { spin(i) } }.name = "t#{i}" }
deep(47) { spin(3) }
EOF
cat >"$work/sink.py" <<'EOF'
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(200); self.end_headers()
    def log_message(self, *a): pass
s = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
print(s.server_address[1], flush=True)
s.serve_forever()
EOF
python3 "$work/sink.py" >"$work/sink.port" &
pids+=($!)
for _ in $(seq 50); do [ -s "$work/sink.port" ] && break; sleep 0.1; done
url="http://127.0.0.1:$(cat "$work/sink.port")"

targets=()
for i in $(seq $n); do
  ruby "$work/target.rb" "$work/count.$i" &
  targets+=($!)
  pids+=($!)
done
for i in $(seq $n); do
  for _ in $(seq 300); do [ -e "$work/count.$i.ready" ] && break; sleep 0.1; done
  [ -e "$work/count.$i.ready" ] || { echo "target $i did not start" >&2; exit 1; }
done
csv=$(IFS=,; echo "${targets[*]}")

# cpu_ticks PID...: utime+stime of the processes, in clock ticks.
cpu_ticks() {
  local total=0 p
  for p in "$@"; do
    total=$((total + $(awk '{print $14 + $15}' "/proc/$p/stat")))
  done
  echo "$total"
}
# rss_kb FIELD PID...: a /proc/PID/status field (VmRSS, VmHWM) summed, kB.
rss_kb() {
  local f=$1 total=0 p; shift
  for p in "$@"; do
    total=$((total + $(awk -v f="$f:" '$1 == f {print $2}' "/proc/$p/status")))
  done
  echo "$total"
}
# counts: the targets' summed loop iterations now.
counts() {
  local i total=0
  for i in $(seq $n); do rm -f "$work/count.$i"; done
  for p in "${targets[@]}"; do kill -USR1 "$p"; done
  for i in $(seq $n); do
    for _ in $(seq 100); do [ -s "$work/count.$i" ] && break; sleep 0.02; done
    total=$((total + $(awk '{print $2}' "$work/count.$i")))
  done
  echo "$total"
}
hz=$(getconf CLK_TCK)
# window_rate: the targets' loop iterations per second of their own CPU
# time over one window. Per CPU second, not per wall second: on a machine
# shared with other work the wall-clock rate follows whatever else runs
# (it drifted by 30 % between unprofiled windows here), while the rate per
# CPU second moves only with what the profiler does to the targets
# themselves (the CPU it takes from them shows as its own % of a core).
window_rate() {
  local c0 c1 t0 t1
  t0=$(cpu_ticks "${targets[@]}"); c0=$(counts)
  sleep "$window"
  c1=$(counts); t1=$(cpu_ticks "${targets[@]}")
  echo $(((c1 - c0) * hz / (t1 - t0)))
}
metric() { curl -s "http://$1/metrics" | awk -v m="$2" '$1 == m {print $2}'; }

echo "rbscope agent benchmark: $n Ruby processes x 4 spinning threads x 50 frames, ${window}s windows, $(nproc) CPUs, load $(cut -d' ' -f1 /proc/loadavg)"
base1=$(window_rate)

run_agent() { # RATE PORT [BINARY]
  "${3:-$work/rbscope}" agent --upload "$url" --rate "$1" --metrics-addr "127.0.0.1:$2" --log-level warn \
    --include "$work/target.rb" 2>"$work/agent.$1.log" &
  agent=$!
  pids+=($agent)
  for _ in $(seq 100); do
    [ "$(metric "127.0.0.1:$2" rbscope_agent_processes_tracked 2>/dev/null)" = "$n" ] && break
    sleep 0.1
  done
  sleep 2
}

# 1. the agent at 100 Hz
run_agent 100 19466
a_c0=$(cpu_ticks $agent); a_t0=$(metric 127.0.0.1:19466 rbscope_agent_process_ticks_total)
a_e0=$(metric 127.0.0.1:19466 'rbscope_agent_sample_errors_total{kind="inconsistent"}')
a_s0=$(metric 127.0.0.1:19466 rbscope_agent_samples_total)
rate_agent=$(window_rate)
a_c1=$(cpu_ticks $agent); a_t1=$(metric 127.0.0.1:19466 rbscope_agent_process_ticks_total)
a_e1=$(metric 127.0.0.1:19466 'rbscope_agent_sample_errors_total{kind="inconsistent"}')
a_s1=$(metric 127.0.0.1:19466 rbscope_agent_samples_total)
a_rss=$(rss_kb VmRSS $agent); a_hwm=$(rss_kb VmHWM $agent)
kill -TERM $agent; wait $agent || true

# 1b. the baseline's agent at 100 Hz
z_c=0; z_t=1; rate_base=0
if [ -n "${BASELINE_REV:-}" ]; then
  run_agent 100 19468 "$work/rbscope-before"
  z_c0=$(cpu_ticks $agent); z_t0=$(metric 127.0.0.1:19468 rbscope_agent_process_ticks_total)
  rate_base=$(window_rate)
  z_c1=$(cpu_ticks $agent); z_t1=$(metric 127.0.0.1:19468 rbscope_agent_process_ticks_total)
  z_c=$((z_c1 - z_c0)); z_t=$((z_t1 - z_t0))
  kill -TERM $agent; wait $agent || true
fi

# 3. the agent at 20 Hz
run_agent 20 19467
b_c0=$(cpu_ticks $agent); sleep "$window"; b_c1=$(cpu_ticks $agent)
kill -TERM $agent; wait $agent || true

base_mid=$(window_rate)

# 2. 20 separate recordings
recs=()
for p in "${targets[@]}"; do
  "$work/rbscope" record --pid "$p" --nonblocking --duration $((window + 30))s --format collapsed \
    -o "$work/rec.$p.txt" --raw "$work/rec.$p.raw.gz" 2>/dev/null &
  recs+=($!)
  pids+=($!)
done
sleep 4
r_c0=$(cpu_ticks "${recs[@]}")
rate_rec=$(window_rate)
r_c1=$(cpu_ticks "${recs[@]}")
r_rss=$(rss_kb VmRSS "${recs[@]}"); r_hwm=$(rss_kb VmHWM "${recs[@]}")
kill -INT "${recs[@]}" 2>/dev/null || true
wait "${recs[@]}" 2>/dev/null || true

base2=$(window_rate)

# 4. the floors
floor1=$("$work/readfloor" "${targets[0]}" 2000)
floorn=$("$work/readfloor" -pids "$csv")

awk -v hz="$hz" -v w="$window" -v n="$n" \
  -v ac="$((a_c1 - a_c0))" -v at="$((a_t1 - a_t0))" -v ae="$((a_e1 - a_e0))" -v as="$((a_s1 - a_s0))" \
  -v arss="$a_rss" -v ahwm="$a_hwm" -v bc="$((b_c1 - b_c0))" \
  -v rc="$((r_c1 - r_c0))" -v rrss="$r_rss" -v rhwm="$r_hwm" \
  -v base1="$base1" -v basem="$base_mid" -v base2="$base2" -v ra="$rate_agent" -v rr="$rate_rec" \
  -v floor1="$floor1" -v floorn="$floorn" -v zc="$z_c" -v zt="$z_t" -v rz="$rate_base" -v zrev="${BASELINE_REV:-}" 'BEGIN {
  # Each slowdown against the unprofiled windows on either side of it.
  basea = (base1 + basem) / 2; baser = (basem + base2) / 2
  acpu = ac / hz; rcpu = rc / hz
  split(floor1, f1, /[ =]/); split(floorn, fn, /[ =]/)
  for (i = 1; i < length(f1); i += 2) F1[f1[i]] = f1[i+1]
  for (i = 1; i < length(fn); i += 2) FN[fn[i]] = fn[i+1]
  printf "%-40s %10s %12s %10s %10s %10s\n", "", "% of a core", "µs/due p-tick", "RSS MiB", "peak MiB", "slowdown/cpu-s"
  printf "%-40s %10.2f %12.1f %10.1f %10.1f %9.2f%%\n", "agent, 100 Hz (one process)", 100*acpu/w, 1e6*acpu/(w*100*n), arss/1024, ahwm/1024, 100*(1-ra/basea)
  if (zrev != "") {
    zcpu = zc / hz
    printf "%-40s %10.2f %12.1f %10s %10s %9.2f%%\n", "agent, 100 Hz, baseline " substr(zrev, 1, 12), 100*zcpu/w, 1e6*zcpu/(w*100*n), "", "", 100*(1-rz/basem)
  }
  printf "%-40s %10.2f %12.1f %10s %10s %10s\n", "agent, 20 Hz", 100*bc/hz/w, 1e6*bc/hz/(w*20*n), "", "", ""
  printf "%-40s %10.2f %12.1f %10.1f %10.1f %9.2f%%\n", "20 x record --nonblocking, 100 Hz", 100*rcpu/w, 1e6*rcpu/(w*100*n), rrss/1024, rhwm/1024, 100*(1-rr/baser)
  printf "%-40s %10.2f %12.1f\n", "paced floor, 1 process (readfloor)", 100*F1["paced_floor_ns"]*100/1e9, F1["paced_floor_ns"]/1e3
  printf "%-40s %10.2f %12.1f\n", "paced floor, 20 processes, one clock", 100*FN["cpu_ns_per_tick"]*100/1e9, FN["cpu_ns_per_tick"]/1e3/n
  if (zrev != "") printf "\nbaseline agent at 100 Hz: %d process-ticks in %ds, %.1f µs of CPU per process-tick taken; after/before per process-tick taken: %.2f\n", zt, w, 1e6*zc/hz/zt, (acpu/at)/(zc/hz/zt)
  printf "\nagent at 100 Hz: %d process-ticks in %ds (%.0f%% of the %d due: the rest were late on a busy machine), %.1f µs of CPU per process-tick taken, %d samples, %d failed process-ticks (inconsistent)\n", at, w, 100*at/(w*100*n), w*100*n, 1e6*acpu/at, as, ae
  printf "floor of one sample of one process: %s ns (one 8-byte read %s ns); targets unprofiled: %d, %d and %d iterations per CPU second (before, between, after: how much the machine drifts)\n", F1["floor_ns"], F1["one_read_ns"], base1, basem, base2
}'
