#!/usr/bin/env bash
# Two GPUs of one host (a machine with at least two): each case natively and through vcuda, same output or not.
#   frameworks  tests/gpu/frameworks rows multigpu_ddp (DistributedDataParallel, two processes over NCCL) and
#               multigpu_copies (one process, copies between the GPUs), over the Unix socket and TCP, one
#               vcuda-server serving both GPUs
#   manager     `vcuda run --manager M --gpus 2`: the two_devices program, multigpu_copies and multigpu_ddp,
#               first with one server serving both GPUs, then with two servers serving one each
#               (CUDA_VISIBLE_DEVICES)
#   moves       tests/gpu/move_suite.sh with the moving server on GPU 0 and the target on GPU 1: the GPU suite
#               moved mid-run, then the pauses of 1 and 10 GiB moves, stop-and-copy and pre-copy
#   mobile      tests/gpu/mobile/run_mobile.sh with its servers on GPU 0 and GPU 1 (MOBILE_GPUS)
#   index       two servers each serving both GPUs; a leased program on GPU 0 of the first is moved by
#               `vcuda migrate` to GPU 1 of the other (a GPU of another index), compared with its native run
#   within      one server serving both GPUs; a leased program on its GPU 0 is moved by `vcuda migrate` to its
#               GPU 1 (the session stays on its server), compared with its native run
#
# Usage: tests/gpu/two_gpus.sh BUILD_DIR     (TWO_PARTS: which parts, default all, in the order above;
#   TWO_DRIVER: --driver for the managed servers, to try the manager and index parts on the software driver;
#   TWO_MEMORY: each lease's memory, default 16G; TWO_SERVER_ARGS: more arguments for the managed servers,
#   e.g. "--isolation process")
# Outputs under $OUT/two_gpus (default /tmp/two_gpus); a table last. Exit status 0 when every case is identical.
set -u
build=$(cd "${1:?usage: tests/gpu/two_gpus.sh BUILD_DIR}" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
out=${OUT:-/tmp}/two_gpus
rm -rf "$out"; mkdir -p "$out"
parts=${TWO_PARTS:-frameworks manager moves mobile index within}
pids=()
# shellcheck disable=SC2317  # called by the EXIT trap
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done; wait 2>/dev/null; }
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_socket() { for _ in $(seq 200); do [ -S "$1" ] && return 0; sleep 0.05; done; echo "no socket $1"; return 1; }
json() { python3 -c "import json,sys; j=json.load(sys.stdin); print($1)"; }
# What a program printed, without `info:` lines and vcuda's own log lines (warnings of calls it refuses by
# name, which the program survives: NCCL's probe of host-located cuMemCreate, for one).
printed() { grep -vE '^info:|^\[[0-9-]+ [0-9:.]+\] \[vcuda-' "$1"; }
same() { diff <(printed "$1") <(printed "$2") > "$3" && rm -f "$3"; }
drv=(); [ -n "${TWO_DRIVER:-}" ] && drv=(--driver "$TWO_DRIVER")
rows=()
status=0
row() { rows+=("$*"); }

if [ -z "${TWO_DRIVER:-}" ]; then
  gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
  echo "[two_gpus] $gpus GPU(s): $(nvidia-smi --query-gpu=name --format=csv,noheader | sort | uniq -c | tr -s ' ')"
  [ "$gpus" -ge 2 ] || { echo "[two_gpus] needs two GPUs"; exit 2; }
fi

if [[ " $parts " == *" frameworks "* ]]; then
  OUT="$out" FRAMEWORKS_TCP=1 FRAMEWORKS_ONLY="multigpu_copies multigpu_ddp" FRAMEWORKS_TIMEOUT=180 \
    "$here/frameworks/run_frameworks.sh" "$build" > "$out/frameworks.txt" 2>&1 || status=1
  while read -r line; do row "frameworks: $line"; done < <(grep '^multigpu_' "$out/frameworks.txt" | grep '|')
fi

# A manager and its servers: start_managed NAME SPEC... (a server per SPEC: "ENV=V ... [-- SERVER ARGS]"), then
# waits for WANT_GPUS (default 2) GPUs to be registered.
start_managed() {
  local dir="$out/$1"; shift
  mkdir -p "$dir"
  head -c 32 /dev/urandom | base64 > "$dir/secret"; chmod 600 "$dir/secret"
  mport=$(free_port)
  "$build/bin/vcuda-mgmt" --listen "127.0.0.1:$mport" --db "$dir/m.db" --secret-file "$dir/secret" \
    --heartbeat-timeout 3s --log-level info 2> "$dir/mgmt.log" & pids+=($!)
  sleep 0.5
  local k=0 spec x words envw extra after
  for spec in "$@"; do
    k=$((k + 1))
    read -r -a words <<< "$spec"
    envw=(); extra=(); after=0
    for x in "${words[@]}"; do
      if [ "$x" = -- ]; then after=1; elif [ $after = 0 ]; then envw+=("$x"); else extra+=("$x"); fi
    done
    # shellcheck disable=SC2086  # TWO_SERVER_ARGS: words on purpose
    env "${envw[@]}" "$build/bin/vcuda-server" "${drv[@]}" --listen "unix:$dir/s$k.sock" --listen "127.0.0.1:$(free_port)" \
      --advertise "unix:$dir/s$k.sock" --address-window "$k" --manager "127.0.0.1:$mport" \
      --secret-file "$dir/secret" --log-level info "${extra[@]}" ${TWO_SERVER_ARGS:-} 2> "$dir/server-$k.log" & pids+=($!)
    wait_socket "$dir/s$k.sock" || return 1
  done
  "$build/bin/vcuda" tokens create --tenant admin --operator --secret-file "$dir/secret" -o "$dir/admin.cred" \
    --manager "127.0.0.1:$mport" > /dev/null || return 1
  export VCUDA_CREDENTIAL_FILE="$dir/admin.cred"
  for _ in $(seq 50); do
    [ "$("$build/bin/vcuda" gpus --json --manager "127.0.0.1:$mport" 2>/dev/null | json 'len(j["gpus"])')" = "${WANT_GPUS:-2}" ] && return 0
    sleep 0.2
  done
  echo "the servers' GPUs never showed up"; return 1
}
stop_managed() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done; wait 2>/dev/null; pids=(); }

if [[ " $parts " == *" manager "* ]]; then
  timeout 120 "$build/tests/programs/two_devices" > "$out/two_devices.native.out" 2>&1
  timeout 180 python3 "$here/frameworks/torch_multi_gpu.py" copies > "$out/copies.native.out" 2>&1
  timeout 180 python3 "$here/frameworks/torch_multi_gpu.py" ddp > "$out/ddp.native.out" 2>&1
  for layout in one two; do
    if [ $layout = one ]; then start_managed "manager-one" ""; else start_managed "manager-two" CUDA_VISIBLE_DEVICES=0 CUDA_VISIBLE_DEVICES=1; fi || { row "manager ($layout server(s)): did not start"; status=1; stop_managed; continue; }
    vrun() { timeout 180 "$build/bin/vcuda" run --manager "127.0.0.1:$mport" --gpus 2 --memory "${TWO_MEMORY:-16G}" -- "$@"; }
    vrun "$build/tests/programs/two_devices" > "$out/two_devices.$layout.out" 2>&1; rc=$?
    if [ $rc = 0 ] && same "$out/two_devices.native.out" "$out/two_devices.$layout.out" "$out/two_devices.$layout.diff"; then r=identical; else r="differs (exit $rc)"; status=1; fi
    row "manager, $layout server(s), --gpus 2: two_devices $r"
    vrun python3 "$here/frameworks/torch_multi_gpu.py" copies > "$out/copies.$layout.out" 2>&1; rc=$?
    if [ $rc = 0 ] && same "$out/copies.native.out" "$out/copies.$layout.out" "$out/copies.$layout.diff"; then r=identical; else r="differs (exit $rc)"; status=1; fi
    row "manager, $layout server(s), --gpus 2: torch copies $r ($(grep -o 'peer access.*' "$out/copies.$layout.out" | head -1))"
    vrun python3 "$here/frameworks/torch_multi_gpu.py" ddp > "$out/ddp.$layout.out" 2>&1; rc=$?
    if [ $rc = 0 ] && same "$out/ddp.native.out" "$out/ddp.$layout.out" "$out/ddp.$layout.diff"; then r=identical; else r="differs (exit $rc)"; status=1; fi
    row "manager, $layout server(s), --gpus 2: DDP over NCCL $r"
    stop_managed
  done
fi

if [[ " $parts " == *" moves "* ]]; then
  OUT="$out" MOVE_SOURCE_ENV=CUDA_VISIBLE_DEVICES=0 MOVE_TARGET_ENV=CUDA_VISIBLE_DEVICES=1 \
    MOVE_PARTS="${TWO_MOVE_PARTS:-suite pauses}" MOVE_MODES="copy precopy" MOVE_SIZES_COPY="1024 10240" \
    MOVE_SIZES_PRECOPY="1024 10240" "$here/move_suite.sh" "$build" > "$out/moves.txt" 2>&1 || status=1
  while read -r line; do row "moves GPU 0 -> GPU 1: $line"; done < <(sed -n '/^== move pauses/,$p' "$out/moves.txt" | tail -n +2)
fi

if [[ " $parts " == *" mobile "* ]]; then
  OUT="$out" MOBILE_GPUS="0 1" MOBILE_WORKLOADS="${TWO_MOBILE_WORKLOADS:-cnn cupy}" MOBILE_ACTIONS="migrate drain" \
    MOBILE_PAUSE=6 "$here/mobile/run_mobile.sh" "$build" > "$out/mobile.txt" 2>&1 || status=1
  while read -r line; do row "manager moves GPU 0 <-> GPU 1: $line"; done < <(tail -n 20 "$out/mobile.txt" | grep -E 'migrate|drain|mobile')
fi

# A leased suspend_resume (1 GiB, idling 8 s between phases) against the manager start_managed made; 3 s in,
# UNCORDON is uncordoned and `vcuda migrate` sends the lease to TARGET. Sets lease, placed_on (its GPU before
# the move) and rc (the program's exit status); outputs under $out/NAME.*.
v() { "$build/bin/vcuda" "$@" --manager "127.0.0.1:$mport"; }
gpu_at() { v gpus --json | json "[g['uuid'] for g in j['gpus'] if g['server_id'] == '$1' and g['index'] == $2][0]"; }
migrate_running() {  # NAME UNCORDON TARGET
  timeout 300 "$build/bin/vcuda" run --manager "127.0.0.1:$mport" --memory "${TWO_MEMORY:-16G}" -- \
    "$build/tests/programs/suspend_resume" 8000 1024 > "$out/$1.vcuda.out" 2>&1 & app=$!
  sleep 3
  v uncordon "$2" > /dev/null
  lease=$(v leases --json | json "j['leases'][0]['lease_id']")
  placed_on=$(v leases --json | json "j['leases'][0]['devices'][0]['uuid']")
  v migrate "$lease" --to "$3" > "$out/$1.migrate.txt" 2>&1
  wait $app; rc=$?
  v events > "$out/$1.events.txt" 2>&1
}
if [[ " $parts " == *" index "* || " $parts " == *" within "* ]]; then
  timeout 300 "$build/tests/programs/suspend_resume" 8000 1024 > "$out/sr.native.out" 2>&1
fi

if [[ " $parts " == *" index "* ]]; then
  # Both servers see both GPUs (the second under distinct identities, --gpu-identity); the lease is placed on
  # GPU 0 of server 1 (everything else cordoned meanwhile), then moved to GPU 1 of server 2.
  if WANT_GPUS=4 start_managed "index" "" "-- --gpu-identity b"; then
    srv1=$(v servers --json | json "[s['server_id'] for s in j['servers'] if 'unix:$out/index/s1.sock' in s['endpoints']][0]")
    srv2=$(v servers --json | json "[s['server_id'] for s in j['servers'] if 'unix:$out/index/s2.sock' in s['endpoints']][0]")
    from=$(gpu_at "$srv1" 0) other=$(gpu_at "$srv1" 1) to=$(gpu_at "$srv2" 1)
    v cordon "$srv2" > /dev/null; v cordon "$other" > /dev/null
    migrate_running index "$srv2" "$to"
    moved=$(grep -o "moved to .*" "$out/index/server-1.log" | head -1)
    placed=$(grep -o "its device [0-9]* runs on this server's GPU [0-9]*" "$out/index/server-2.log" | head -1)
    if [ $rc = 0 ] && [ -n "$moved" ] && same "$out/sr.native.out" "$out/index.vcuda.out" "$out/index.diff"; then r=identical; else r="differs or not moved (exit $rc)"; status=1; fi
    [ "$placed_on" = "$from" ] || r="$r (placed on $placed_on, not server 1's GPU 0)"
    row "index: lease on server 1's GPU 0 migrated to server 2's GPU 1: $r; ${moved:-not moved: $(grep -o 'not moved: .*' "$out/index/server-1.log" | head -1)}; ${placed:-no placement line}"
    stop_managed
  else
    row "index: the manager or servers did not start"; status=1
  fi
fi

if [[ " $parts " == *" within "* ]]; then
  if start_managed "within" ""; then
    srv1=$(v servers --json | json "j['servers'][0]['server_id']")
    g0=$(gpu_at "$srv1" 0) g1=$(gpu_at "$srv1" 1)
    v cordon "$g1" > /dev/null
    migrate_running within "$g1" "$g1"
    moved=$(grep -o "device [0-9]* moved from GPU .*" "$out/within/server-1.log" | head -1)
    if [ $rc = 0 ] && [ -n "$moved" ] && same "$out/sr.native.out" "$out/within.vcuda.out" "$out/within.diff"; then r=identical; else r="differs or not moved (exit $rc)"; status=1; fi
    [ "$placed_on" = "$g0" ] || r="$r (placed on $placed_on, not GPU 0)"
    row "within: lease on GPU 0 migrated to GPU 1 of the same server: $r; ${moved:-not moved: $(grep -o 'not moved: .*' "$out/within/server-1.log" | head -1) $(cat "$out/within.migrate.txt")}"
    stop_managed
  else
    row "within: the manager or server did not start"; status=1
  fi
fi

echo "== two GPUs"
printf '%s\n' "${rows[@]}"
exit $status
