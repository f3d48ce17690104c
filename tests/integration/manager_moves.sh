#!/usr/bin/env bash
# CI integration test of the manager's moves on the software driver: one vcuda-mgmt with --rebalance, two
# vcuda-servers attached to it, each giving its GPU an identity of its own (--gpu-identity), server A reporting
# a simulated 90% utilization (--test-report-utilization), so that placement puts leases on B and the
# rebalancing policy sees A hot. A third, standalone server runs the program unmoved for the reference output.
#   (a) `vcuda migrate LEASE --to GPU` moves a running program (suspend_resume, pausing between its phases)
#       from B to A: it passes with the output of an unmoved run; `vcuda events` shows the request and the
#       outcome, `vcuda sessions` the session on A;
#   (b) `vcuda drain SERVER` moves a running lease from B to A, and the program passes;
#   (c) a program placed on A (B cordoned meanwhile) is moved to B by --rebalance (A at 90%, B at 0%);
#   (d) a tenant may not migrate, not even its own lease;
#   (e) `vcuda migrate` to a GPU of another index: a server C with two GPUs joins; a program on B's GPU 0
#       moves to C's GPU 1 and passes, its device index kept (C's log says where it runs);
#   (f) `vcuda migrate` to another GPU of the same server: a program on C's GPU 1 moves to C's GPU 0 (the
#       session stays, suspended and rebuilt there; with MOVES_ISOLATION its worker does it) and passes.
# Leases live 2 s (--lease-ttl), so their clients renew them several times after they moved.
# MOVES_ISOLATION=1: servers A and B run each session in a worker process (--isolation process).
# Usage: manager_moves.sh BUILD_DIR
set -u
build=$(cd "$1" && pwd)
tmp=$(mktemp -d /tmp/vcuda-moves-XXXXXX)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done; wait 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT
fail() {
  echo "FAIL: $*"
  echo "--- vcuda events"; "$build/bin/vcuda" events --manager "unix:$tmp/m.sock" --credential "$tmp/admin.cred"
  for f in "$tmp"/*.log "$tmp"/*.out; do echo "--- $f"; grep -v '\[debug\]' "$f" | tail -25; done
  exit 1
}
wait_socket() { for _ in $(seq 100); do [ -S "$1" ] && return 0; sleep 0.05; done; fail "no socket $1"; }
# wait_for SECONDS CMD...: until CMD succeeds
wait_for() { local n=$(($1 * 10)); shift; for _ in $(seq "$n"); do "$@" && return 0; sleep 0.1; done; return 1; }
# shellcheck source=tests/normalize_output.sh
source "$(dirname "${BASH_SOURCE[0]}")/../normalize_output.sh"
driver="$build/lib/libvcuda-softdriver.so"
program="$build/tests/programs/suspend_resume"

head -c 32 /dev/urandom | base64 > "$tmp/secret"; chmod 600 "$tmp/secret"
"$build/bin/vcuda-mgmt" --listen "unix:$tmp/m.sock" --db "$tmp/m.db" --secret-file "$tmp/secret" \
  --heartbeat-timeout 1s --lease-ttl 2s --rebalance --rebalance-interval 500ms --rebalance-after 2 --rebalance-threshold 40 \
  --rebalance-cooldown 5m --log-level debug 2> "$tmp/mgmt.log" & pids+=($!)
wait_socket "$tmp/m.sock"
start_server() {  # NAME WINDOW [ARGS...]
  local name=$1 window=$2; shift 2
  "$build/bin/vcuda-server" --listen "unix:$tmp/$name.sock" --driver "$driver" --address-window "$window" \
    --log-level info "$@" 2> "$tmp/server-$name.log" & pids+=($!)
  wait_socket "$tmp/$name.sock"
}
managed=(--manager "unix:$tmp/m.sock" --secret-file "$tmp/secret")
[ -n "${MOVES_ISOLATION:-}" ] && managed+=(--isolation process)
start_server a 1 --advertise "unix:$tmp/a.sock" --gpu-identity a --test-report-utilization 90 "${managed[@]}"
start_server b 2 --advertise "unix:$tmp/b.sock" --gpu-identity b "${managed[@]}"
start_server ref 3
"$build/bin/vcuda" tokens create --tenant admin --operator --secret-file "$tmp/secret" -o "$tmp/admin.cred" \
  --manager "unix:$tmp/m.sock" > /dev/null || fail "vcuda tokens create with the secret file"
vcuda() { "$build/bin/vcuda" "$@" --manager "unix:$tmp/m.sock" --credential "$tmp/admin.cred"; }
vcuda tokens create --tenant alice -o "$tmp/alice.cred" > /dev/null || fail "vcuda tokens create --tenant alice"
# json EXPR: evaluates EXPR on the JSON read from stdin (as `j`)
json() { python3 -c "import json,sys; j=json.load(sys.stdin); print($1)"; }
two_gpus() { [ "$(vcuda gpus --json | json 'sum(1 for g in j["gpus"] if "utilization" in g)')" = 2 ]; }
wait_for 10 two_gpus || fail "the two servers' GPUs never showed up with their load"
server_of() { vcuda servers --json | json "[s['server_id'] for s in j['servers'] if 'unix:$tmp/$1.sock' in s['endpoints']][0]"; }
srv_a=$(server_of a) srv_b=$(server_of b)
gpu_of() { vcuda gpus --json | json "[g['uuid'] for g in j['gpus'] if g['server_id'] == '$1'][0]"; }
gpu_a=$(gpu_of "$srv_a") gpu_b=$(gpu_of "$srv_b")
[ -n "$gpu_a" ] && [ -n "$gpu_b" ] && [ "$gpu_a" != "$gpu_b" ] || fail "the servers' GPUs have no distinct identities"
echo "server A $srv_a GPU $gpu_a (90% simulated); server B $srv_b GPU $gpu_b"

# The reference: the program unmoved, on the standalone server.
LD_LIBRARY_PATH="$build/lib/vcuda" VCUDA_SERVER="unix:$tmp/ref.sock" "$program" 100 > "$tmp/ref.out" 2>&1 ||
  fail "the program failed unmoved: $(cat "$tmp/ref.out")"

run_program() {  # run_program PAUSE_MS OUTFILE: suspend_resume through a lease of alice's, in the background
  VCUDA_CREDENTIAL=$(cat "$tmp/alice.cred") "$build/bin/vcuda" run --manager "unix:$tmp/m.sock" --memory 256M -- \
    "$program" "$1" > "$2" 2>&1 &
  prog=$!
}
# lease_on GPU: the lease whose device is on GPU
lease_on() { vcuda leases --json | json "([l['lease_id'] for l in j['leases'] if l['devices'][0]['uuid'] == '$1'] + [''])[0]"; }
# session_on LEASE GPU: the manager lists the lease's session on that GPU, running
session_on() {
  [ "$(vcuda sessions --json | json "sum(1 for s in j['sessions'] if s['lease_id'] == '$1' and s['gpu_uuid'] == '$2')")" = 1 ]
}
moved() { vcuda events --json | json "[e['kind'] for e in j['events'] if e['lease_id'] == '$1']" | grep -q "'moved'"; }
check_program() {  # check_program OUTFILE WHAT
  wait $prog || fail "$2: the program failed: $(cat "$1")"
  grep -q "^PASS suspend_resume" "$1" || fail "$2: no PASS"
  diff <(normalize "$tmp/ref.out") <(normalize "$1") > "$tmp/diff.txt" ||
    { cat "$tmp/diff.txt"; fail "$2: the program printed something else than unmoved"; }
}

# (a) + (d): an operator's migrate; a tenant's is refused. Each program pauses 5 s: its session must still run
# when the manager next hears from the target (with 2.5 s, under ctest -j2 on a 2-core machine, the program had
# ended 0.5 s after its move, before the target's next heartbeat).
run_program 5000 "$tmp/a.out"
wait_for 10 grep -qs "phase 1 done" "$tmp/a.out" || fail "(a) the program did not start"
lease=$(lease_on "$gpu_b")
[ -n "$lease" ] || fail "(a) the lease is not on B (placement should avoid A at 90%)"
wait_for 5 session_on "$lease" "$gpu_b" || fail "(a) B never reported the session"
out=$("$build/bin/vcuda" migrate "$lease" --to "$gpu_a" --manager "unix:$tmp/m.sock" --credential "$tmp/alice.cred" 2>&1) &&
  fail "(d) tenant alice migrated her lease"
echo "$out" | grep -q "needs an operator credential" || fail "(d) alice was not told why: $out"
vcuda migrate "$lease" --to "$gpu_a" || fail "(a) vcuda migrate $lease --to $gpu_a"
wait_for 10 moved "$lease" || fail "(a) vcuda events shows no move of $lease"
wait_for 5 session_on "$lease" "$gpu_a" || fail "(a) vcuda sessions does not show the session on A"
vcuda sessions
grep -q "PASS" "$tmp/a.out" && fail "(a) the program had ended before it was moved"
check_program "$tmp/a.out" "(a) migrate"
grep -q "moved to unix:$tmp/a.sock" "$tmp/server-b.log" || fail "(a) server B did not move the session to A"
grep -q "moved here" "$tmp/server-a.log" || fail "(a) server A did not take it"
vcuda events | grep "$lease"

# (b) drain: B's lease moves to A
run_program 5000 "$tmp/b.out"
wait_for 10 grep -qs "phase 1 done" "$tmp/b.out" || fail "(b) the program did not start"
lease=$(lease_on "$gpu_b")
[ -n "$lease" ] || fail "(b) the lease is not on B"
wait_for 5 session_on "$lease" "$gpu_b" || fail "(b) B never reported the session"
vcuda drain "$srv_b" | tee "$tmp/drain.txt" || fail "(b) vcuda drain $srv_b"
grep -q "1 of 1 lease(s) moving" "$tmp/drain.txt" || fail "(b) the drain did not move the lease"
wait_for 10 moved "$lease" || fail "(b) vcuda events shows no move of $lease"
check_program "$tmp/b.out" "(b) drain"
vcuda events | grep "$lease" | grep -q "drain of $srv_b" || fail "(b) the events do not say the drain moved it"
vcuda uncordon "$srv_b" > /dev/null || fail "(b) vcuda uncordon $srv_b"

# (c) rebalance: a program on A (B cordoned while it starts) moves to B
vcuda cordon "$srv_b" > /dev/null || fail "(c) vcuda cordon $srv_b"
run_program 5000 "$tmp/c.out"
wait_for 10 grep -qs "phase 1 done" "$tmp/c.out" || fail "(c) the program did not start"
lease=$(lease_on "$gpu_a")
[ -n "$lease" ] || fail "(c) the lease is not on A"
vcuda uncordon "$srv_b" > /dev/null || fail "(c) vcuda uncordon $srv_b"
wait_for 10 moved "$lease" || fail "(c) the rebalancing did not move $lease"
check_program "$tmp/c.out" "(c) rebalance"
vcuda events | grep "$lease"
vcuda events --json | json "[e['detail'] for e in j['events'] if e['kind'] == 'rebalance' and e['lease_id'] == '$lease']" |
  grep -q "moving lease $lease" || fail "(c) no rebalance event says why $lease moved"
# migrate_mid_run CASE FROM TO LINE: a program that starts on GPU FROM (the caller cordoned the others) is moved
# by `vcuda migrate` to GPU TO (uncordoned first) and passes; server C's log says LINE.
migrate_mid_run() {
  local what=$1 from=$2 to=$3 line=$4
  run_program 8000 "$tmp/$what.out"  # these moves copy the memory (2 s under load), after a refused handover
  wait_for 10 grep -qs "phase 1 done" "$tmp/$what.out" || fail "($what) the program did not start"
  lease=$(lease_on "$from")
  [ -n "$lease" ] || fail "($what) the lease is not on $from"
  wait_for 5 session_on "$lease" "$from" || fail "($what) its server never reported the session on $from"
  vcuda uncordon "$to" > /dev/null || fail "($what) vcuda uncordon $to"
  vcuda migrate "$lease" --to "$to" || fail "($what) vcuda migrate $lease --to $to"
  wait_for 10 moved "$lease" || fail "($what) vcuda events shows no move of $lease"
  wait_for 5 session_on "$lease" "$to" || fail "($what) vcuda sessions does not show the session on $to"
  check_program "$tmp/$what.out" "($what) migrate"
  grep -q "$line" "$tmp"/server-c*.log || fail "($what) server C's log does not say: $line"
}

# (e) another index: C serves two GPUs; the program on B moves to C's GPU 1 (A and C's GPUs cordoned while it
# starts).
VCUDA_SOFT_DEVICES=2 start_server c 4 --advertise "unix:$tmp/c.sock" --gpu-identity c "${managed[@]}"
four_gpus() { [ "$(vcuda gpus --json | json 'len(j["gpus"])')" = 4 ]; }
wait_for 10 four_gpus || fail "(e) server C's two GPUs never showed up"
srv_c=$(server_of c)
gpu_c() { vcuda gpus --json | json "[g['uuid'] for g in j['gpus'] if g['server_id'] == '$srv_c' and g['index'] == $1][0]"; }
gpu_c0=$(gpu_c 0) gpu_c1=$(gpu_c 1)
[ "$gpu_c0" != "$gpu_c1" ] || fail "(e) C's GPUs have one identity"
for t in "$srv_a" "$gpu_c0" "$gpu_c1"; do vcuda cordon "$t" > /dev/null || fail "(e) vcuda cordon $t"; done
migrate_mid_run e "$gpu_b" "$gpu_c1" "its device 0 runs on this server's GPU 1"

# (f) another GPU of the same server: a program on C's GPU 1 (B and C's GPU 0 cordoned while it starts) moves
# to C's GPU 0.
vcuda cordon "$srv_b" > /dev/null || fail "(f) vcuda cordon $srv_b"
migrate_mid_run f "$gpu_c1" "$gpu_c0" "device 1 moved from GPU 1 to GPU 0 of this server"

# Every lease was renewed to its end, also after its move (none expired; their programs released them).
grep "expired (not renewed)" "$tmp/mgmt.log" && fail "a lease expired: its client stopped renewing it"
echo "PASS manager_moves"
