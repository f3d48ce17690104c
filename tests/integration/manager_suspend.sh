#!/usr/bin/env bash
# CI integration test of suspend and resume through the manager, on the software driver: one vcuda-mgmt with
# idle reclaim (--idle-suspend-after 2s), one vcuda-server attached to it, clients that lease a GPU.
#   1. idle reclaim: a program that pauses 5 s between two phases is suspended while idle (the manager asks,
#      the server saves its state and gives the GPU back), resumed by its next call, and passes;
#      `vcuda events` says what happened and why; `vcuda sessions` showed it suspended meanwhile;
#   2. an operator suspends a running lease with `vcuda suspend LEASE` and resumes it with `vcuda resume
#      LEASE` while the program still pauses: the server resumes it before its next call; another tenant may
#      not suspend it.
# Usage: manager_suspend.sh BUILD_DIR [SERVER_ARG...] (e.g. --isolation process: the sessions live in worker
# processes, which the server asks to suspend and resume, and which report their state to it)
set -u
build=$(cd "$1" && pwd)
shift
server_args=("$@")
tmp=$(mktemp -d /tmp/vcuda-susp-XXXXXX)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done; wait 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT
fail() { echo "FAIL: $*"; for f in "$tmp"/*.log "$tmp"/*.out; do echo "--- $f"; tail -25 "$f"; done; exit 1; }
wait_socket() { for i in $(seq 100); do [ -S "$1" ] && return 0; sleep 0.05; done; fail "no socket $1"; }
# wait_for SECONDS CMD...: until CMD succeeds
wait_for() { local n=$(( $1 * 10 )); shift; for i in $(seq "$n"); do "$@" && return 0; sleep 0.1; done; return 1; }

head -c 32 /dev/urandom | base64 > "$tmp/secret"; chmod 600 "$tmp/secret"
"$build/bin/vcuda-mgmt" --listen "unix:$tmp/m.sock" --db "$tmp/m.db" --secret-file "$tmp/secret" \
  --heartbeat-timeout 1s --idle-suspend-after 2s --log-level debug 2> "$tmp/mgmt.log" & pids+=($!)
wait_socket "$tmp/m.sock"
"$build/bin/vcuda-server" --listen "unix:$tmp/a.sock" --advertise "unix:$tmp/a.sock" \
  --driver "$build/lib/libvcuda-softdriver.so" --manager "unix:$tmp/m.sock" --secret-file "$tmp/secret" \
  --log-level debug ${server_args[@]+"${server_args[@]}"} 2> "$tmp/server.log" & pids+=($!)
wait_socket "$tmp/a.sock"
"$build/bin/vcuda" tokens create --tenant admin --operator --secret-file "$tmp/secret" -o "$tmp/admin.cred" \
  --manager "unix:$tmp/m.sock" || fail "vcuda tokens create with the secret file"
vcuda() { "$build/bin/vcuda" "$@" --manager "unix:$tmp/m.sock" --credential "$tmp/admin.cred"; }
vcuda tokens create --tenant alice -o "$tmp/alice.cred" || fail "vcuda tokens create --tenant alice"
vcuda tokens create --tenant bob -o "$tmp/bob.cred" || fail "vcuda tokens create --tenant bob"
wait_for 10 sh -c "'$build/bin/vcuda' gpus --manager unix:$tmp/m.sock --credential $tmp/admin.cred --json | grep -q uuid" ||
  fail "the server's GPU never showed up"
run_program() {  # run_program PAUSE_MS OUTFILE: suspend_resume through a lease, in the background
  VCUDA_CREDENTIAL=$(cat "$tmp/alice.cred") "$build/bin/vcuda" run --manager "unix:$tmp/m.sock" --memory 256M -- \
    "$build/tests/programs/suspend_resume" "$1" > "$2" 2>&1 &
  prog=$!
}
lease_id() { vcuda leases --json | grep -o '"lease_id": *"[^"]*"' | head -1 | sed 's/.*"\(lease-[^"]*\)"/\1/'; }
# suspended_now [LEASE]: a session (of LEASE) is reported suspended
suspended_now() { vcuda sessions --json | tr -d '\n ' | grep -o '{[^{}]*}' | grep "${1:-}" | grep -q '"suspended":true'; }

# 1. idle reclaim
run_program 5000 "$tmp/idle.out"
wait_for 10 grep -qs "phase 1 done" "$tmp/idle.out" || fail "the program did not start"
wait_for 8 suspended_now || fail "vcuda sessions never showed the idle session suspended"
vcuda sessions
wait $prog || fail "the program failed after an idle reclaim: $(cat "$tmp/idle.out")"
grep -q "PASS suspend_resume" "$tmp/idle.out" || fail "no PASS after the idle reclaim"
grep -q "session [0-9]* suspended: " "$tmp/server.log" || fail "the server did not suspend the idle session"
grep -q "session [0-9]* resumed: " "$tmp/server.log" || fail "the server did not resume the session at its next call"
vcuda events
vcuda events | grep -q "idle-reclaim" || fail "vcuda events does not show the idle reclaim"
vcuda events | grep -q "suspended: " || fail "vcuda events does not show what the server did"

# 2. an operator's suspend and resume of a running lease (the program pauses 6 s; idle reclaim would come at 2 s,
# so the operator acts first, at once)
resumes_before=$(grep -c "session [0-9]* resumed: " "$tmp/server.log")
run_program 6000 "$tmp/op.out"
wait_for 10 grep -qs "phase 1 done" "$tmp/op.out" || fail "the second program did not start"
lease=$(lease_id)
[ -n "$lease" ] || fail "no lease for the second program"
out=$("$build/bin/vcuda" suspend "$lease" --manager "unix:$tmp/m.sock" --credential "$tmp/bob.cred" 2>&1) &&
  fail "tenant bob suspended alice's lease"
echo "$out" | grep -q "belongs to tenant alice" || fail "bob was not told why: $out"
vcuda suspend "$lease" || fail "vcuda suspend $lease"
wait_for 5 suspended_now "$lease" || fail "the lease's session was not suspended after vcuda suspend"
vcuda resume "$lease" || fail "vcuda resume $lease"
wait_for 5 sh -c "[ \$(grep -c 'session [0-9]* resumed: ' '$tmp/server.log') -gt $resumes_before ]" ||
  fail "the server did not resume the session after vcuda resume"
grep -q "phase 1 done" "$tmp/op.out" && ! grep -q "PASS" "$tmp/op.out" ||
  fail "the program had already finished when it was resumed: the resume was not the operator's"
wait $prog || fail "the program failed after an operator's suspend and resume: $(cat "$tmp/op.out")"
grep -q "PASS suspend_resume" "$tmp/op.out" || fail "no PASS after the operator's suspend and resume"
vcuda events | grep -q "suspend asked by" || fail "vcuda events does not show the operator's suspend"

# 3. an operator releases a running lease: its session ends; a worker this server stopped for that is logged as
#    such, not as a crash
run_program 6000 "$tmp/rel.out"
wait_for 10 grep -qs "phase 1 done" "$tmp/rel.out" || fail "the third program did not start"
lease=$(lease_id)
[ -n "$lease" ] || fail "no lease for the third program"
vcuda release "$lease" || fail "vcuda release $lease"
wait $prog && fail "the program went on after its lease was released"
wait_for 5 grep -q "its lease $lease was released or expired" "$tmp/server.log" ||
  fail "the server did not end the released lease's session"
if [[ " ${server_args[*]-} " == *" process"* ]]; then
  wait_for 5 grep -q "was killed by signal 15 (SIGTERM), as this server asked (its lease $lease" \
    "$tmp/server.log" || fail "the stopped worker's end was not logged as asked for"
  ! grep -q "SIGTERM): that session" "$tmp/server.log" || fail "a worker stopped on purpose was logged as a crash"
fi
echo "PASS manager_suspend ${server_args[*]-}"
