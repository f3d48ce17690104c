#!/usr/bin/env bash
# CI test of sessions moved between two vcuda-server processes (server/session_transfer.cpp) on the software
# driver: server A moves every session to server B (--test-move-to) shortly after it opened; each program must
# pass and print what it prints when nothing moves (lines with timings left out), and for the programs that
# are sure to be moved (they pause, or run long) both logs must say so. Over a Unix socket (device memory
# handed over: both servers are on the same software GPU), over a Unix socket with --move-memory copy, and
# over TCP (pre-copied: sent while the program runs, then what changed); over a Unix socket to a server on
# another (software) GPU, which refuses the memory handed over, so that it is copied instead (the programs sure
# to be moved only); and over TCP paced by files, not time (tcpdirty): precopy_dirty writes both of its pieces,
# then the move pre-copies them, then the program changes one piece, then the move pauses: the pause must
# send that one and only that one. unixiso and
# tcpiso: both servers run each session in a worker process (--isolation process): the worker moves it, and
# the target's worker takes it (the programs sure to be moved only). Server A carries CUDA graphs
# (--suspend-graphs): graph_suspend holds a graph, a child graph and executable graphs when it moves.
#   MOVE_PROGRAMS="a b" to choose programs;
#   MOVE_TRANSPORTS="unix unixcopy unixothergpu tcp tcpdirty unixiso tcpiso back isopair copylimit".
# Usage: move_session.sh BUILD_DIR
set -u
build=$(cd "$1" && pwd)
tmp=$(mktemp -d /tmp/vcuda-move-XXXXXX)
pids=()
cleanup() { stop_servers; rm -rf "$tmp"; }
trap cleanup EXIT
fail() { echo "FAIL: $*"; for f in "$tmp"/*.log; do echo "--- $f"; tail -25 "$f"; done; exit 1; }
programs_dir="$build/tests/programs"
driver="$build/lib/libvcuda-softdriver.so"
# name:args:sure:only — args comma-separated; "sure": the program is idle or busy long enough that it is moved
# before it ends; "only": the one transport it runs over (mapped host memory needs a Unix socket).
programs=${MOVE_PROGRAMS:-"suspend_resume:300:sure suspend_resume:0: symbols:300:sure streams_events:: async_copies:: vector_add::
  host_functions:: pinned_memory:: mapped_memory:::unix device_copies:: late_thread_runtime:: func_attributes:: error_cases::
  precopy_dirty:--gates,GATES:sure:tcpdirty vmm:400:sure nonblocking_copies:20,look,300:sure:tcp
  graph_suspend:300:sure mem_pools:300:sure managed_globals:4,120:sure"}
# Ports free now, distinct: all are bound at once (separate picks can return one port twice).
free_ports() { python3 -c 'import socket, sys
ss = [socket.socket() for _ in range(int(sys.argv[1]))]
for s in ss: s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in ss))' "$1"; }
# Starts a server in the background; true once its own log says it serves ADDR, false when it exited first (a
# TCP port another process took meanwhile), so that the caller picks other ports. A connection test would not
# do: a port taken by another server answers too.
start_server() {  # NAME ADDR WINDOW [ARGS...]; $gpu_id: the software GPU's identity (VCUDA_SOFT_HOST_ID)
  local name=$1 addr=$2 window=$3; shift 3
  local log="$tmp/server-$name.log" before pid
  before=$(wc -l 2>/dev/null < "$log" || echo 0)
  VCUDA_SOFT_HOST_ID=${gpu_id:-0} "$build/bin/vcuda-server" --listen "$addr" --driver "$driver" --address-window "$window" --log-level info "$@" \
    2>> "$log" &
  pid=$!
  pids+=($pid)
  for _ in $(seq 400); do
    tail -n "+$((before + 1))" "$log" | grep -q -F "on $addr (" && return 0
    kill -0 "$pid" 2>/dev/null || { echo "server $name did not start on $addr:"; tail -n "+$((before + 1))" "$log"; return 1; }
    sleep 0.05
  done
  fail "server $name: no 'serving' line for $addr in 20 s"
}
stop_servers() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done; wait 2>/dev/null; pids=(); }
# shellcheck source=tests/normalize_output.sh
source "$(dirname "${BASH_SOURCE[0]}")/../normalize_output.sh"

passed=0
transports=${MOVE_TRANSPORTS:-unix unixcopy unixothergpu tcp tcpdirty unixiso tcpiso back isopair copylimit}
loop_transports=${transports/isopair/}
loop_transports=${loop_transports/copylimit/}
for transport in ${loop_transports/back/}; do
  copy=(); [ "$transport" = unixcopy ] && copy=(--move-memory copy)
  # tcpdirty: the move starts once precopy_dirty wrote its first pattern and pauses once it wrote its second.
  [ "$transport" = tcpdirty ] &&
    copy=(--test-move-when "$tmp/gates-a/a-written" --test-precopy-hold-until "$tmp/gates-a/b-written")
  iso=(); [ "${transport%iso}" != "$transport" ] && iso=(--isolation process)
  after=100; [ "$transport" = tcpdirty ] && after=0
  started=0
  for attempt in 1 2 3; do
    if [ "${transport#tcp}" = "$transport" ]; then
      ref="unix:$tmp/ref.sock"; a="unix:$tmp/a.sock"; b="unix:$tmp/b.sock"
    else
      read -r p_ref p_a p_b <<< "$(free_ports 3)"
      ref="127.0.0.1:$p_ref"; a="127.0.0.1:$p_a"; b="127.0.0.1:$p_b"
    fi
    : > "$tmp/server-a.log"; : > "$tmp/server-b.log"
    b_gpu=0; [ "$transport" = unixothergpu ] && b_gpu=1
    start_server ref "$ref" 3 && gpu_id=$b_gpu start_server b "$b" 2 ${iso[@]+"${iso[@]}"} &&
      start_server a "$a" 1 --test-move-to "$b" --test-move-after $after --suspend-graphs "${copy[@]}" ${iso[@]+"${iso[@]}"} &&
      { started=1; break; }
    echo "$transport: the servers did not start (attempt $attempt): new ports"
    stop_servers
  done
  [ $started = 1 ] || fail "$transport: the servers did not start in 3 attempts"
  for p in $programs; do
    IFS=: read -r name args sure only <<< "$p"
    args=${args//,/ }
    [ -n "$only" ] && [ "$only" != "${transport%copy}" ] && continue
    [ -z "$only" ] && [ "$transport" = tcpdirty ] && continue
    case $transport in unixothergpu | *iso) [ "$sure" != sure ] && continue ;; esac
    mark=$(wc -l < "$tmp/server-a.log")  # what server A logs of this program follows
    for where in ref a; do
      addr=$ref; [ $where = a ] && addr=$a
      # GATES: precopy_dirty's pacing files. On ref nothing moves: it goes on at once. On a, it goes on once A
      # says the pre-copy is done.
      gates="$tmp/gates-$where" watcher=
      rm -rf "$gates"; mkdir -p "$gates"
      if [ "$where" = ref ]; then
        touch "$gates/precopied"
      elif [[ "$args" == *GATES* ]]; then
        ( for _ in $(seq 1200); do
            grep -q "pre-copied to $b" "$tmp/server-a.log" && { touch "$gates/precopied"; exit 0; }
            sleep 0.05
          done ) &
        watcher=$!
      fi
      # shellcheck disable=SC2086  # args: the program's arguments, word-split on purpose
      LD_LIBRARY_PATH="$build/lib/vcuda" VCUDA_SERVER="$addr" timeout 120 "$programs_dir/$name" ${args//GATES/$gates} \
        > "$tmp/$where.out" 2>&1
      rc=$?
      [ -n "$watcher" ] && { kill "$watcher" 2>/dev/null; wait "$watcher" 2>/dev/null; }
      grep -q "^PASS" "$tmp/$where.out" && [ $rc -eq 0 ] ||
        { cat "$tmp/$where.out"; fail "$name $args over $transport ($where) exited $rc without PASS"; }
    done
    if ! diff <(normalize "$tmp/ref.out") <(normalize "$tmp/a.out") > "$tmp/diff.txt"; then
      cat "$tmp/diff.txt"; fail "$name $args over $transport printed something else when moved"
    fi
    tail -n "+$((mark + 1))" "$tmp/server-a.log" > "$tmp/program-a.log"
    if [ "$sure" = sure ]; then
      grep -q "session [0-9]* moved to $b" "$tmp/program-a.log" || fail "$name over $transport: server A did not move it"
      grep -q "moved here" "$tmp/server-b.log" || fail "$name over $transport: server B did not take it"
      # Memory is handed over only over a Unix socket without --move-memory copy, and then always (a session
      # moved before it held any memory, as suspend_resume 0 may be, has nothing to hand over).
      handed=$(grep -c "session [0-9]* moved to $b: .* handed over on the same GPU" "$tmp/program-a.log")
      if [ "$transport" = unix ] || [ "$transport" = unixiso ]; then
        [ "$handed" -eq "$(grep "session [0-9]* moved to $b" "$tmp/program-a.log" | grep -c -v ": 0 MiB of GPU state, paused")" ] ||
          fail "$name over $transport: a move copied device memory rather than hand it over"
      else
        [ "$handed" -eq 0 ] || fail "$name over $transport: device memory was handed over, not copied"
      fi
      # Over TCP, memory is pre-copied; in tcpdirty only the piece precopy_dirty changed is sent when paused.
      if [ "${transport#tcp}" != "$transport" ]; then
        line=$(grep "session [0-9]* moved to $b" "$tmp/program-a.log" | tail -1)
        [[ "$line" =~ \(([0-9]+)\ MiB\ pre-copied\ while\ it\ ran,\ ([0-9]+)\ MiB\ of\ it\ unchanged ]] ||
          fail "$name over $transport: the move was not pre-copied: $line"
        if [ "$transport" = tcpdirty ]; then
          pre=${BASH_REMATCH[1]} same=${BASH_REMATCH[2]}
          { [ "$same" -ge 64 ] && [ "$same" -le $((pre - 64)) ]; } ||
            fail "$name over $transport: $pre MiB pre-copied, $same MiB unchanged: the changed piece was not found"
        fi
      fi
      # (A session with no device memory, as managed_globals, whose variables are the module's, has none to
      # refuse.)
      if [ "$transport" = unixothergpu ] &&
        grep "session [0-9]* moved to $b" "$tmp/program-a.log" | grep -q -v ": 0 MiB of GPU state, paused"; then
        grep -q "on GPU 0 as the physical memory of another GPU.*its memory is copied instead" "$tmp/program-a.log" ||
          fail "$name over $transport: the target did not refuse memory of another GPU, or it was not copied then"
      fi
    fi
    # A session may end before its move comes; a target that refuses one is a failure.
    if grep "not moved" "$tmp/server-a.log" | grep -q -E "could not take|refused|failed"; then
      grep "not moved" "$tmp/server-a.log" | tail -3
      fail "$name over $transport: a move was refused"
    fi
    passed=$((passed + 1))
  done
  moves=$(grep -c "session [0-9]* moved to $b" "$tmp/server-a.log")
  echo "$transport: $moves sessions moved from A to B"
  [ "$moves" -ge 1 ] || fail "no session moved over $transport"
  stop_servers
done
# back: a session moved from A to B and then back to A (B moves it on too): A kept its addresses for it. The
# same for graph_suspend's graphs (A moves it once they are made): B, with --no-suspend-graphs, keeps the graphs
# that came with the session, and moves them back.
if [[ " $transports " == *" back "* ]]; then
  ref="unix:$tmp/ref.sock"; a="unix:$tmp/a.sock"; b="unix:$tmp/b.sock"
  : > "$tmp/server-a.log"; : > "$tmp/server-b.log"
  start_server ref "$ref" 3 && start_server b "$b" 2 --test-move-to "$a" --test-move-after 100 --no-suspend-graphs &&
    start_server a "$a" 1 --test-move-to "$b" --test-move-after 100 --suspend-graphs \
      --test-move-when "$tmp/graphs-made" || fail "back: the servers did not start"
  for run in "graph_suspend 1000 $tmp/graphs-made" "suspend_resume 2000"; do
    # shellcheck disable=SC2086  # run: the program and its argument, word-split on purpose
    LD_LIBRARY_PATH="$build/lib/vcuda" VCUDA_SERVER="$ref" timeout 120 "$programs_dir/"${run/graphs-made/ref-made} > "$tmp/ref.out" 2>&1
    before_a=$(grep -c "session [0-9]* moved to $b" "$tmp/server-a.log")
    before_b=$(grep -c "session [0-9]* moved to $a" "$tmp/server-b.log")
    # shellcheck disable=SC2086
    LD_LIBRARY_PATH="$build/lib/vcuda" VCUDA_SERVER="$a" timeout 120 "$programs_dir/"$run > "$tmp/back.out" 2>&1 ||
      { cat "$tmp/back.out"; fail "back: $run failed"; }
    diff <(normalize "$tmp/ref.out") <(normalize "$tmp/back.out") > "$tmp/diff.txt" ||
      { cat "$tmp/diff.txt"; fail "back: $run printed something else when moved"; }
    [ "$(grep -c "session [0-9]* moved to $b" "$tmp/server-a.log")" -gt "$before_a" ] || fail "back: A did not move $run to B"
    [ "$(grep -c "session [0-9]* moved to $a" "$tmp/server-b.log")" -gt "$before_b" ] || fail "back: B did not move $run back to A"
    if [ "${run%% *}" = graph_suspend ]; then
      grep -q "session [0-9]* moved to $b: .* with 3 CUDA graphs" "$tmp/server-a.log" || fail "back: A moved no graphs"
      grep -q "session [0-9]* moved to $a: .* with 3 CUDA graphs" "$tmp/server-b.log" || fail "back: B moved no graphs back"
    fi
    echo "back: $run moved from A to B and back to A"
    passed=$((passed + 1))
  done
  stop_servers
fi
# isopair: two sessions of one --isolation process server, running at once (so in two worker processes), both
# moved to one thread-mode server: their addresses come from the one window their parent keeps, so they do not
# collide there.
if [[ " $transports " == *" isopair "* ]]; then
  ref="unix:$tmp/ref.sock"; a="unix:$tmp/a.sock"; b="unix:$tmp/b.sock"
  : > "$tmp/server-a.log"; : > "$tmp/server-b.log"
  start_server ref "$ref" 3 && start_server b "$b" 2 &&
    start_server a "$a" 1 --isolation process --test-move-to "$b" --test-move-after 100 || fail "isopair: the servers did not start"
  LD_LIBRARY_PATH="$build/lib/vcuda" VCUDA_SERVER="$ref" timeout 120 "$programs_dir/suspend_resume" 600 > "$tmp/ref.out" 2>&1
  run_pids=()
  for k in 1 2; do
    LD_LIBRARY_PATH="$build/lib/vcuda" VCUDA_SERVER="$a" timeout 120 "$programs_dir/suspend_resume" 600 > "$tmp/pair$k.out" 2>&1 &
    run_pids+=($!)
  done
  for k in 1 2; do
    wait "${run_pids[$((k - 1))]}" || { cat "$tmp/pair$k.out"; fail "isopair: program $k failed"; }
    diff <(normalize "$tmp/ref.out") <(normalize "$tmp/pair$k.out") > "$tmp/diff.txt" ||
      { cat "$tmp/diff.txt"; fail "isopair: program $k printed something else when moved"; }
  done
  [ "$(grep -c "session [0-9]* moved to $b" "$tmp/server-a.log")" -eq 2 ] || fail "isopair: not both sessions moved"
  [ "$(grep -c "moved here" "$tmp/server-b.log")" -eq 2 ] || fail "isopair: server B did not take both"
  echo "isopair: 2 sessions of two worker processes moved to one server"
  passed=$((passed + 2))
  stop_servers
fi
# copylimit: a move that would copy more than --move-copy-limit while paused (here vmm's own VMM allocations
# over TCP, which are not pre-copied) is refused with the reason; the program runs on where it is.
if [[ " $transports " == *" copylimit "* ]]; then
  ref="unix:$tmp/ref.sock"; a="127.0.0.1:$(free_ports 1)"; b="127.0.0.1:$(free_ports 1)"
  : > "$tmp/server-a.log"; : > "$tmp/server-b.log"
  start_server ref "$ref" 3 && start_server b "$b" 2 &&
    start_server a "$a" 1 --test-move-to "$b" --test-move-after 100 --move-copy-limit 1MiB ||
    fail "copylimit: the servers did not start"
  LD_LIBRARY_PATH="$build/lib/vcuda" VCUDA_SERVER="$ref" timeout 120 "$programs_dir/vmm" 400 > "$tmp/ref.out" 2>&1
  LD_LIBRARY_PATH="$build/lib/vcuda" VCUDA_SERVER="$a" timeout 120 "$programs_dir/vmm" 400 > "$tmp/limit.out" 2>&1 ||
    { cat "$tmp/limit.out"; fail "copylimit: vmm failed"; }
  diff <(normalize "$tmp/ref.out") <(normalize "$tmp/limit.out") > "$tmp/diff.txt" ||
    { cat "$tmp/diff.txt"; fail "copylimit: vmm printed something else"; }
  grep -q "not moved to $b: it would copy [0-9]* MiB while paused (its own VMM allocations, not pre-copied), more than --move-copy-limit 1 MiB" \
    "$tmp/server-a.log" || fail "copylimit: the move was not refused with the reason"
  ! grep -q "moved here" "$tmp/server-b.log" || fail "copylimit: server B took the session"
  echo "copylimit: a move past --move-copy-limit refused, the program ran on"
  passed=$((passed + 1))
  stop_servers
fi
echo "PASS move_session: $passed program runs identical when moved between two servers"
