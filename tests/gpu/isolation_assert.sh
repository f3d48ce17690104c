#!/usr/bin/env bash
# One tenant asserts, another works: runs a vcuda-server (--isolation MODE) on DRIVER, starts a tenant that runs
# vector_add in a loop, runs device_assert N times (each a new session whose kernel's assert fails), then one
# more vector_add as a new tenant, and counts the working tenant's failures.
# On a GPU, thread mode shows the failure of issue 17 point 9 (after the first assert every new context fails
# with CUDA_ERROR_ASSERT, 710); process mode must show 0 failures. On the software driver (the default
# DRIVER) a failed assert aborts the process that runs the kernel: the server itself in thread mode.
#
# Usage: isolation_assert.sh BUILD_DIR [thread|process] [N] [DRIVER]
#   e.g. tests/gpu/isolation_assert.sh build/dev process 100 /usr/lib/x86_64-linux-gnu/libcuda.so.1
set -u
build="${1:?usage: isolation_assert.sh BUILD_DIR [thread|process] [N] [DRIVER]}"
mode="${2:-process}"
n="${3:-100}"
driver="${4:-$build/lib/libvcuda-softdriver.so}"
progs="$build/tests/programs"
tmp="$(mktemp -d "${TMPDIR:-/tmp}/vcuda-assert.XXXXXX")"
sock="$tmp/s.sock"
export LD_LIBRARY_PATH="$build/lib/vcuda${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" VCUDA_SERVER="unix:$sock"

"$build/bin/vcuda-server" --listen "unix:$sock" --driver "$driver" --isolation "$mode" --log-level info \
    >"$tmp/server.log" 2>&1 &
server=$!
for _ in $(seq 1 100); do [ -S "$sock" ] && break; sleep 0.1; done
trap 'kill $server $tenant 2>/dev/null; wait 2>/dev/null; rm -rf "$tmp"' EXIT

# The working tenant: vector_add in a loop until told to stop; every run that fails is counted.
: >"$tmp/tenant.count"
(
    ok=0 bad=0
    while [ ! -e "$tmp/stop" ]; do
        if "$progs/vector_add" >"$tmp/tenant.last" 2>&1; then ok=$((ok + 1)); else
            bad=$((bad + 1))
            cp "$tmp/tenant.last" "$tmp/tenant.failed"
        fi
        echo "$ok $bad" >"$tmp/tenant.count"
    done
) &
tenant=$!

asserted=0 start_ns=$(date +%s%N)
for i in $(seq 1 "$n"); do
    if "$progs/device_assert" >"$tmp/assert.out" 2>&1; then asserted=$((asserted + 1)); fi
done
elapsed_ms=$(( ($(date +%s%N) - start_ns) / 1000000 ))
touch "$tmp/stop"
wait "$tenant" 2>/dev/null
read -r ok bad <"$tmp/tenant.count"
fresh=FAIL
"$progs/vector_add" >"$tmp/fresh.out" 2>&1 && fresh=ok
alive=no
kill -0 "$server" 2>/dev/null && alive=yes

echo "--isolation $mode, driver $driver"
echo "device_assert: $n runs in $elapsed_ms ms, $asserted reported the failed assert; last: $(tail -n 2 "$tmp/assert.out" | tr '\n' ' ')"
echo "working tenant: vector_add ran $((ok + bad)) times alongside: $ok passed, $bad failed"
[ -e "$tmp/tenant.failed" ] && echo "  a failed run: $(tail -n 3 "$tmp/tenant.failed" | tr '\n' ' ')"
echo "a new tenant afterwards: vector_add $fresh; server alive: $alive"
echo "server log: $(grep -c 'worker pid .* exited\|was killed' "$tmp/server.log") worker exits, $(grep -c 'error 710' "$tmp/server.log") 'error 710' lines"
[ "$bad" = 0 ] && [ "$fresh" = ok ] && [ "$alive" = yes ]
