#!/usr/bin/env bash
# Sessions moved between two vcuda-server processes on one GPU machine (server/session_transfer.cpp): the GPU
# suite and the framework suite run through a server A that moves every session, once, to server B
# MOVE_AFTER_MS after it opened (clients on the Unix socket to B's socket, TCP clients to B's port), each
# compared with its native run as those suites do; then the pause of a move for sessions holding a ballast of
# device memory (suspend_resume, which pauses between its phases), over the Unix socket, memory handed over
# and copied; and graph_suspend's CUDA graphs moved with --suspend-graphs (graphs part).
#
# Usage: tests/gpu/move_suite.sh BUILD_DIR
#   MOVE_OUT        outputs (default $OUT/move, else /tmp/move); the suites' own folders under it
#   MOVE_PARTS      what to run (default "suite frameworks pauses graphs")
#   MOVE_AFTER_MS   suite: 300; frameworks: MOVE_AFTER_MS_FRAMEWORKS (default 1500)
#   MOVE_SIZES_SHARE, MOVE_SIZES_COPY, MOVE_SIZES_PRECOPY  ballast sizes moved with the memory handed over
#                   (default "1024 10240 51200"), copied while paused (--move-memory copy; default "1024 10240")
#                   and pre-copied (--move-memory precopy; default "1024 10240")
#   MOVE_MODES      pause modes (default "share copy precopy")
#   FRAMEWORKS_ONLY as for run_frameworks.sh (default: torch_plain newuser_torch torch_autocast cupy jax triton)
#   MOVE_SERVER_ARGS more arguments for both servers of the suite and framework parts (e.g. "--isolation
#                   process": each session's worker moves it, and the target's worker takes it)
#   MOVE_SOURCE_ENV, MOVE_TARGET_ENV  environment words for the moving server (and the suite's native runs)
#                   and for the target, e.g. "CUDA_VISIBLE_DEVICES=0" and "CUDA_VISIBLE_DEVICES=1": every
#                   session then moves between two physical GPUs (its memory copied, never handed over)
# Prints each suite's table, then `move pauses` (size, pause, receive+rebuild) last.
set -u
build=$(cd "${1:?usage: tests/gpu/move_suite.sh BUILD_DIR}" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
out=${MOVE_OUT:-${OUT:-/tmp}/move}
mkdir -p "$out"
parts=${MOVE_PARTS:-suite frameworks pauses graphs}
pids=()
# shellcheck disable=SC2317  # called by the EXIT trap
cleanup() { for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done; wait 2>/dev/null; }
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_socket() { for _ in $(seq 200); do [ -S "$1" ] && return 0; sleep 0.05; done; echo "no server at $1"; return 1; }

# Server B, the target: a Unix socket and a TCP port, its own address window.
start_target() {  # NAME -> sets b_unix, b_tcp
  b_unix="unix:$out/$1.sock"
  b_tcp="127.0.0.1:$(free_port)"
  rm -f "$out/$1.sock"
  # shellcheck disable=SC2086  # MOVE_SERVER_ARGS, MOVE_TARGET_ENV: words on purpose
  env ${MOVE_TARGET_ENV:-} "$build/bin/vcuda-server" --listen "$b_unix" --listen "$b_tcp" --address-window 2 --log-level info ${MOVE_SERVER_ARGS:-} \
    2> "$out/$1.log" &
  pids+=($!)
  wait_socket "$out/$1.sock"
}
status=0
rows=()

if [[ " $parts " == *" suite "* ]]; then
  start_target target-suite
  # shellcheck disable=SC2086  # MOVE_SOURCE_ENV: words on purpose
  OUT="$out" SUITE_SERVER_ARGS="${MOVE_SERVER_ARGS:-} --address-window 1 --test-move-to $b_unix --test-move-to $b_tcp --test-move-after ${MOVE_AFTER_MS:-300}" \
    env ${MOVE_SOURCE_ENV:-} "$here/run_suite.sh" "$build" > "$out/suite.txt" 2>&1 || status=1
  moved=$(cat "$out"/suite/server-*.log 2>/dev/null | grep -c " moved to ")
  refused=$(cat "$out"/suite/server-*.log 2>/dev/null | grep " not moved: " | sed 's/.*not moved: //' | sort | uniq -c)
  rows+=("suite: $(grep '^SUITE' "$out/suite.txt" | tail -1); $moved sessions moved")
  [ -n "$refused" ] && rows+=("suite, not moved: $refused")
fi

if [[ " $parts " == *" frameworks "* ]]; then
  start_target target-frameworks
  # shellcheck disable=SC2086  # MOVE_SOURCE_ENV: words on purpose
  OUT="$out" FRAMEWORKS_TCP=1 FRAMEWORKS_ONLY="${FRAMEWORKS_ONLY:-torch_plain newuser_torch torch_autocast cupy jax triton}" \
    FRAMEWORKS_SERVER_ARGS="${MOVE_SERVER_ARGS:-} --address-window 1 --test-move-to $b_unix --test-move-to $b_tcp --test-move-after ${MOVE_AFTER_MS_FRAMEWORKS:-1500}" \
    env ${MOVE_SOURCE_ENV:-} "$here/frameworks/run_frameworks.sh" "$build" > "$out/frameworks.txt" 2>&1 || status=1
  moved=$(grep -c " moved to " "$out/frameworks/server.log" 2>/dev/null)
  refused=$(grep " not moved: " "$out/frameworks/server.log" 2>/dev/null | sed 's/.*not moved: //' | sort | uniq -c)
  rows+=("frameworks: $(tail -3 "$out/frameworks.txt" | tr '\n' ' '); $moved sessions moved")
  [ -n "$refused" ] && rows+=("frameworks, not moved: $refused")
fi

if [[ " $parts " == *" pauses "* ]]; then
  # share: the physical memory is handed over (both servers on this GPU); copy: --move-memory copy (stop-and-
  # copy); precopy: --move-memory precopy (copied while the program idles, then what changed). The program idles
  # 4 s plus 2 ms per MiB between its phases, so that a pre-copy at ~1 GB/s ends before it calls again.
  for mode in ${MOVE_MODES:-share copy precopy}; do
    sizes=${MOVE_SIZES_SHARE:-1024 10240 51200}
    [ "$mode" = copy ] && sizes=${MOVE_SIZES_COPY:-1024 10240}
    [ "$mode" = precopy ] && sizes=${MOVE_SIZES_PRECOPY:-1024 10240}
    for mib in $sizes; do
      idle=4000; [ "$mode" = precopy ] && idle=$((4000 + 2 * mib))
      start_target "target-$mode-$mib"
      a="$out/source-$mode-$mib.sock"
      rm -f "$a"
      # shellcheck disable=SC2086  # MOVE_SOURCE_ENV: words on purpose
      env ${MOVE_SOURCE_ENV:-} "$build/bin/vcuda-server" --listen "unix:$a" --address-window 1 --test-move-to "$b_unix" --test-move-after 1500 \
        --move-memory "$mode" --log-level info 2> "$out/source-$mode-$mib.log" &
      pids+=($!)
      wait_socket "$a"
      LD_LIBRARY_PATH="$build/lib/vcuda" VCUDA_SERVER="unix:$a" timeout 300 \
        "$build/tests/programs/suspend_resume" "$idle" "$mib" > "$out/pause-$mode-$mib.out" 2>&1
      rc=$?
      pause=$(grep -o "paused [0-9]* ms" "$out/source-$mode-$mib.log" | head -1)
      took=$(grep -o "received and rebuilt in [0-9]* ms" "$out/target-$mode-$mib.log" | head -1)
      pre=$(grep -o "pre-copied to .* in [0-9]* ms while it ran" "$out/source-$mode-$mib.log" | grep -o "in [0-9]* ms" | head -1)
      [ -n "$pre" ] && took="$took; pre-copy while running took ${pre#in }"
      pass=$(grep -c '^PASS' "$out/pause-$mode-$mib.out")
      [ "$rc" -eq 0 ] && [ "$pass" -eq 1 ] && [ -n "$pause" ] || status=1
      rows+=("move ($mode) of $mib MiB ballast: exit $rc, PASS $pass, ${pause:-not moved}, ${took:-?} ($(grep -o 'moved to .*, paused' "$out/source-$mode-$mib.log" | sed 's/.*: //; s/, paused//' | head -1))")
      kill -9 "${pids[-1]}" "${pids[-2]}" 2>/dev/null
      wait "${pids[-1]}" "${pids[-2]}" 2>/dev/null
      unset 'pids[-1]'; unset 'pids[-1]'  # the last two: after the first, the other is last
    done
  done
fi

if [[ " $parts " == *" graphs "* ]]; then
  # graph_suspend holds a graph, a child graph and two executable graphs when it pauses; server A (with
  # --suspend-graphs) moves it then, once the program's file says its graphs are made, to B (it keeps the graphs
  # that come with a session) over the Unix socket and over TCP. It must print what it
  # printed natively.
  # shellcheck source=tests/normalize_output.sh
  source "$here/../normalize_output.sh"
  "$build/tests/programs/graph_suspend" 1000 "$out/graphs-native-made" > "$out/graphs-native.out" 2>&1
  for via in unix tcp; do
    start_target "target-graphs-$via"
    to=$b_unix; [ "$via" = tcp ] && to=$b_tcp
    a="$out/source-graphs-$via.sock"
    made="$out/graphs-made-$via"
    rm -f "$a" "$made"
    # shellcheck disable=SC2086  # MOVE_SOURCE_ENV: words on purpose
    env ${MOVE_SOURCE_ENV:-} "$build/bin/vcuda-server" --listen "unix:$a" --address-window 1 --suspend-graphs \
      --test-move-to "$to" --test-move-after 100 --test-move-when "$made" --log-level info 2> "$out/source-graphs-$via.log" &
    pids+=($!)
    wait_socket "$a"
    LD_LIBRARY_PATH="$build/lib/vcuda" VCUDA_SERVER="unix:$a" timeout 120 \
      "$build/tests/programs/graph_suspend" 1000 "$made" > "$out/graphs-$via.out" 2>&1
    rc=$?
    same=identical
    diff <(normalize "$out/graphs-native.out") <(normalize "$out/graphs-$via.out") > "$out/graphs-$via.diff" || same=DIFFERENT
    moved=$(grep -o "moved to .* CUDA graphs" "$out/source-graphs-$via.log" | head -1)
    [ "$rc" -eq 0 ] && [ "$same" = identical ] && [ -n "$moved" ] || status=1
    rows+=("graphs over $via: exit $rc, $same to native; ${moved:-not moved: $(grep -o 'not moved.*' "$out/source-graphs-$via.log" | head -1)}")
    kill -9 "${pids[-1]}" "${pids[-2]}" 2>/dev/null
    wait "${pids[-1]}" "${pids[-2]}" 2>/dev/null
    unset 'pids[-1]'; unset 'pids[-1]'
  done
fi

tail -60 "$out/suite.txt" 2>/dev/null
tail -30 "$out/frameworks.txt" 2>/dev/null
echo "== move pauses and summary"
printf '%s\n' "${rows[@]}"
exit $status
