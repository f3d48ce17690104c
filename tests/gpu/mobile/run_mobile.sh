#!/usr/bin/env bash
# Mobile sessions on a GPU machine, driven by the manager as an operator would: one vcuda-mgmt, two vcuda-servers
# on the same GPU (distinct identities, --gpu-identity), programs under leases. Each workload runs natively
# once, then through vcuda once per action and transport, four at a time, and must print what it printed
# natively (`info:` lines and timings left out). The action comes while the workload pauses between its phases:
#   migrate  `vcuda migrate LEASE --to` the other server's GPU
#   suspend  `vcuda suspend LEASE`, until `vcuda sessions` shows it suspended, then `vcuda resume LEASE`
#   drain    `vcuda drain SERVER` of the server holding them all (the other cordoned while they start)
# Transports: unix (the servers advertise their Unix sockets: shared memory; a move hands the memory over) and
# tcp (they advertise TCP only; a move copies). Prints one row per workload, action and transport, with the
# move's pause, and a summary line last.
#
# Usage: tests/gpu/mobile/run_mobile.sh BUILD_DIR
#   MOBILE_OUT         outputs (default $OUT/mobile, else /tmp/mobile)
#   MOBILE_WORKLOADS   default "cnn transformer cupy jax" (workload.py's kinds; "sr": tests/programs/suspend_resume)
#   MOBILE_ACTIONS     default "migrate suspend drain"; MOBILE_TRANSPORTS default "unix tcp"
#   MOBILE_PAUSE       seconds each workload pauses at most (default 60): workload.py ends its pause when the
#                      action is done (MOBILE_GO_FILE), so that a quick workload is still paused when it comes
#   MOBILE_MEMORY      each lease's memory (default 16G); MOBILE_TIMEOUT seconds per run (default 300)
#   MOBILE_SERVER_LOG  the servers' --log-level (default info)
#   MOBILE_SERVER_ARGS more arguments for both servers (words), e.g. "--isolation process"
#   PYTHON             the interpreter (default python3)
#   MOBILE_GPUS        two GPU indices ("0 1"): server a serves the first only, b the second
#                      (CUDA_VISIBLE_DEVICES), so that every move goes between two physical GPUs
#   MOBILE_DRIVER      --driver for the servers, MOBILE_REFERENCE a vcuda-server address for the reference runs
#                      instead of native ones (to try the script on the software driver)
set -u
build=$(cd "${1:?usage: run_mobile.sh BUILD_DIR}" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
out=${MOBILE_OUT:-${OUT:-/tmp}/mobile}
rm -rf "$out"; mkdir -p "$out"
py=${PYTHON:-python3}
pause=${MOBILE_PAUSE:-60}
workloads=${MOBILE_WORKLOADS:-cnn transformer cupy jax}
driver=(); [ -n "${MOBILE_DRIVER:-}" ] && driver=(--driver "$MOBILE_DRIVER")
pids=()
# shellcheck disable=SC2317  # called by the EXIT trap
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done; wait 2>/dev/null; }
trap cleanup EXIT
# Ports free now, distinct: all are bound at once (separate picks can return one port twice).
free_ports() { python3 -c 'import socket, sys
ss = [socket.socket() for _ in range(int(sys.argv[1]))]
for s in ss: s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in ss))' "$1"; }
wait_socket() { for _ in $(seq 200); do [ -S "$1" ] && return 0; sleep 0.05; done; echo "no socket $1"; exit 1; }
wait_for() { local n=$(($1 * 10)); shift; for _ in $(seq "$n"); do "$@" && return 0; sleep 0.1; done; return 1; }
json() { python3 -c "import json,sys; j=json.load(sys.stdin); print($1)"; }
normalize() { grep -v -E '^info:|\[vcuda|ms\b|elapsed|0x[0-9a-f]+' "$1"; }
command_of() {  # KIND PAUSE_SECONDS
  if [ "$1" = sr ]; then echo "$build/tests/programs/suspend_resume $(($2 * 1000))"; else echo "$py $here/workload.py $1 $2"; fi
}

rows=()
status=0
reference=(); [ -n "${MOBILE_REFERENCE:-}" ] && reference=(env "LD_LIBRARY_PATH=$build/lib/vcuda" "VCUDA_SERVER=$MOBILE_REFERENCE")
for w in $workloads; do
  # shellcheck disable=SC2046  # the command, word-split on purpose
  timeout 300 "${reference[@]}" $(command_of "$w" 0) > "$out/native.$w.out" 2>&1 || { status=1; rows+=("$w native: FAIL (exit $?)"); }
done

for transport in ${MOBILE_TRANSPORTS:-unix tcp}; do
  t="$out/$transport"; mkdir -p "$t"
  head -c 32 /dev/urandom | base64 > "$t/secret"; chmod 600 "$t/secret"
  "$build/bin/vcuda-mgmt" --listen "unix:$t/m.sock" --db "$t/m.db" --secret-file "$t/secret" \
    --heartbeat-timeout 3s --log-level info 2> "$t/mgmt.log" & pids+=($!)
  wait_socket "$t/m.sock"
  read -r p_a p_b <<< "$(free_ports 2)"
  declare -A port=([a]=$p_a [b]=$p_b)
  for s in a b; do
    adv=("unix:$t/$s.sock" "127.0.0.1:${port[$s]}"); [ "$transport" = tcp ] && adv=("127.0.0.1:${port[$s]}")
    window=1; [ $s = b ] && window=2
    args=(); for a in "${adv[@]}"; do args+=(--advertise "$a"); done
    gpu_env=()
    if [ -n "${MOBILE_GPUS:-}" ]; then
      read -r -a gpu_pair <<< "$MOBILE_GPUS"
      gpu_env=(env "CUDA_VISIBLE_DEVICES=${gpu_pair[0]}"); [ $s = b ] && gpu_env=(env "CUDA_VISIBLE_DEVICES=${gpu_pair[1]}")
    fi
    # shellcheck disable=SC2086  # MOBILE_SERVER_ARGS: words on purpose
    "${gpu_env[@]}" "$build/bin/vcuda-server" "${driver[@]}" --listen "unix:$t/$s.sock" --listen "127.0.0.1:${port[$s]}" \
      "${args[@]}" --address-window "$window" --gpu-identity "$s" --manager "unix:$t/m.sock" \
      --secret-file "$t/secret" --log-level "${MOBILE_SERVER_LOG:-info}" ${MOBILE_SERVER_ARGS:-} 2> "$t/server-$s.log" & pids+=($!)
    wait_socket "$t/$s.sock"
  done
  "$build/bin/vcuda" tokens create --tenant admin --operator --secret-file "$t/secret" -o "$t/admin.cred" \
    --manager "unix:$t/m.sock" > /dev/null || { echo "tokens create failed"; exit 1; }
  vcuda() { "$build/bin/vcuda" "$@" --manager "unix:$t/m.sock" --credential "$t/admin.cred"; }
  vcuda tokens create --tenant alice -o "$t/alice.cred" > /dev/null
  two_gpus() { [ "$(vcuda gpus --json | json 'len(j["gpus"])')" = 2 ]; }
  wait_for 20 two_gpus || { echo "the servers' GPUs never showed up"; cat "$t"/*.log; exit 1; }
  server_of() { vcuda servers --json | json "[s['server_id'] for s in j['servers'] if 'unix:$t/$1.sock' in s['endpoints'] or '127.0.0.1:${port[$1]}' in s['endpoints']][0]"; }
  gpu_of() { vcuda gpus --json | json "[g['uuid'] for g in j['gpus'] if g['server_id'] == '$1'][0]"; }
  srv_a=$(server_of a) srv_b=$(server_of b)
  gpu_a=$(gpu_of "$srv_a") gpu_b=$(gpu_of "$srv_b")
  for action in ${MOBILE_ACTIONS:-migrate suspend drain}; do
    # All on A: B cordoned while they start.
    vcuda cordon "$srv_b" > /dev/null
    declare -A prog=()
    go="$t/$action.go"; rm -f "$go"
    for w in $workloads; do
      # shellcheck disable=SC2046
      MOBILE_GO_FILE=$go VCUDA_CREDENTIAL=$(cat "$t/alice.cred") timeout "${MOBILE_TIMEOUT:-300}" "$build/bin/vcuda" run --manager "unix:$t/m.sock" \
        --memory "${MOBILE_MEMORY:-16G}" -- $(command_of "$w" "$pause") > "$t/$action.$w.out" 2> "$t/$action.$w.err" &
      prog[$w]=$!
    done
    started() { for w in $workloads; do grep -qs "phase 1 done" "$t/$action.$w.out" || return 1; done; }
    wait_for 120 started || echo "$transport $action: not every workload reached its pause"
    vcuda uncordon "$srv_b" > /dev/null
    leases=$(vcuda leases --json | json "' '.join(l['lease_id'] for l in j['leases'])")
    # The manager lists each lease's session once its server's heartbeat told of it.
    listed() { [ "$(vcuda sessions --json | json 'len(j["sessions"])')" -ge "$(echo "$leases" | wc -w)" ]; }
    wait_for 10 listed
    # Each workload's lease, by the pid of its process (`vcuda run` runs the program in its own process).
    declare -A lease_of=()
    for w in $workloads; do
      pid=$(pgrep -P "${prog[$w]}" | head -1)
      lease_of[$w]=$(vcuda leases --json | json "([l['lease_id'] for l in j['leases'] if str(l['pid']) == '$pid'] + ['?'])[0]")
    done
    t0=$(date +%s.%N)
    case $action in
      migrate) for l in $leases; do vcuda migrate "$l" --to "$gpu_b" > /dev/null; done ;;
      suspend)
        for l in $leases; do vcuda suspend "$l" > /dev/null; done
        all_suspended() { [ "$(vcuda sessions --json | json 'sum(1 for s in j["sessions"] if s.get("suspended"))')" -ge "$(echo "$leases" | wc -w)" ]; }
        wait_for 15 all_suspended || echo "$transport suspend: not every session was shown suspended"
        vcuda sessions > "$t/$action.sessions.txt"
        for l in $leases; do vcuda resume "$l" > /dev/null; done ;;
      drain) vcuda drain "$srv_a" > "$t/drain.txt" ;;
    esac
    # A move happens at the server's next heartbeat: the workloads go on once each lease's is done or refused.
    settled() { [ "$(vcuda events --json | json "len({e['lease_id'] for e in j['events'] if e['kind'] in ('moved', 'not-moved')} & set('$leases'.split()))")" -ge "$(echo "$leases" | wc -w)" ]; }
    [ "$action" = suspend ] || wait_for 30 settled || echo "$transport $action: not every lease's move was done or refused within 30 s"
    touch "$go"  # the workloads go on
    for w in $workloads; do
      wait "${prog[$w]}"; rc=$?
      verdict="identical"
      if [ $rc -ne 0 ] || ! grep -q "^PASS" "$t/$action.$w.out"; then
        verdict="FAIL (exit $rc)"; status=1
      elif ! diff <(normalize "$out/native.$w.out") <(normalize "$t/$action.$w.out") > "$t/$action.$w.diff"; then
        verdict="DIFFERENT"; status=1
      fi
      # What the manager and the server did to this workload's session, from `vcuda events`.
      done_to=$(vcuda events --json | python3 -c "
import json, re, sys
ev = [e for e in json.load(sys.stdin)['events'] if e['lease_id'] == '${lease_of[$w]}']
said = []
for e in ev:
    d = e['detail']
    if e['kind'] == 'moved':
        said.append('moved, ' + (re.search(r'paused \d+ ms', d) or re.search(r'$', d)).group(0))
    elif e['kind'] == 'not-moved':
        said.append('NOT moved: ' + d.split('not moved: ')[-1][:90])
    elif re.search(r'(not )?suspended: |resumed: ', d):
        said.append(re.search(r'((not )?suspended|resumed): [^,;]*', d).group(0)[:80])
print('; '.join(dict.fromkeys(said)) or 'nothing done (ended first?)')")
      rows+=("$w | $action | $transport | $verdict | $done_to")
    done
    vcuda events > "$t/$action.events.txt"
    [ "$action" = drain ] && vcuda uncordon "$srv_a" > /dev/null
    # The next action starts from A again: what went to B comes back only by new leases.
    echo "$transport $action: $(grep -c 'moved to' "$t/server-a.log") moves from A so far; $(grep -c 'suspended: ' "$t/server-a.log") suspends; took $(python3 -c "import time; print(round(time.time() - $t0, 1))") s"
  done
  grep -h "moved to\|not moved\|suspended: \|not suspended" "$t"/server-*.log | sed 's/^\[[^]]*\] \[[^]]*\] \[[^]]*\] //' | cut -c1-220 > "$t/moves.txt"
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done; wait 2>/dev/null; pids=()
done

echo "== what the servers did"
for transport in ${MOBILE_TRANSPORTS:-unix tcp}; do echo "-- $transport"; cat "$out/$transport/moves.txt"; done
echo "== workload | action | transport | result | what was done to it"
printf '%s\n' "${rows[@]}"
echo "MOBILE: $(printf '%s\n' "${rows[@]}" | grep -c '| identical |')/${#rows[@]} identical"
exit $status
