#!/usr/bin/env bash
# The GPU suite: on a machine with a GPU (driver installed; no toolkit or cmake needed), run every test program
# of tests/programs natively and through vcuda — over TCP and over the Unix socket, client and server on this
# machine — and compare what they print (lines starting with `info:` left out). Then three checks of the
# server: (a) the memory quota, (b) a client killed with SIGKILL in the middle of copying gives its GPU memory
# back within 2 s, (c) two concurrent sessions each running vector_add 20 times.
#
# Usage: tests/gpu/run_suite.sh BUILD_DIR
#   BUILD_DIR holds bin/vcuda-server, bin/vcuda, lib/vcuda/ and tests/programs/ (a build tree copied here).
#   Outputs go to $OUT/suite/ when OUT is set, else /tmp/suite: for each program and mode
#   NAME.MODE.out (stdout, compared), NAME.MODE.err (stderr), NAME.MODE.client.log (vcuda's client log),
#   NAME.MODE.diff (against native), server-*.log, summary.txt.
# Prints a table `program | native | tcp | unix | same-output` and ends with `SUITE: N/M identical`.
# SUITE_SERVER_ARGS: extra arguments for the server the programs run through (e.g. `--test-suspend-every 50`;
#   a `--log-level` there replaces the suite's `info`).
# SUITE_TLS=1: the server's TCP address speaks TLS (throw-away certificates made by
#   BUILD/tests/tls/vcuda_test_certs), every client trusts their CA (VCUDA_TLS_CA); the tcp column is then TLS.
# Exit status: 0 when every row is identical and the quota, kill and concurrency checks pass, else 1.
set -u

if [ $# -lt 1 ] || [ "$1" = "-h" ] || [ "$1" = "--help" ]; then
    sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
fi
BUILD="$(cd "$1" && pwd)" || { echo "run_suite: no such build directory: $1" >&2; exit 2; }
OUTDIR="${OUT:+$OUT/suite}"
OUTDIR="${OUTDIR:-/tmp/suite}"
mkdir -p "$OUTDIR" || { echo "run_suite: cannot create $OUTDIR" >&2; exit 2; }
TLS_ARGS=()
TCP_LABEL=tcp
if [ "${SUITE_TLS:-0}" = 1 ]; then
    certs="$BUILD/tests/tls/vcuda_test_certs"
    [ -x "$certs" ] || { echo "run_suite: SUITE_TLS=1 needs $certs" >&2; exit 2; }
    "$certs" "$OUTDIR/certs" >/dev/null || { echo "run_suite: $certs could not make certificates" >&2; exit 2; }
    TLS_ARGS=(--tls-cert "$OUTDIR/certs/server.pem" --tls-key "$OUTDIR/certs/server.key")
    export VCUDA_TLS_CA="$OUTDIR/certs/ca.pem"
    TCP_LABEL=tcp+tls
fi

PROGS="$BUILD/tests/programs"
SERVER_BIN="$BUILD/bin/vcuda-server"
VCUDA_BIN="$BUILD/bin/vcuda"
CLIENT_DIR="$BUILD/lib/vcuda"
TABLE_ID="$(tr -d ' \t\r\n' <"$CLIENT_DIR/private_table_id" 2>/dev/null)"  # vcuda's call counters (common.cuh)
SOCK=/tmp/vcuda-suite.sock
TIMEOUT=60          # per program run
KILL_LIMIT_MS=2000  # acceptance: memory back within 2 s of SIGKILL
KILL_SLACK_MIB=64

# The compared programs, in the order of the table. quota_probe and copy_forever belong to checks (a), (b).
PROGRAMS=(vector_add vector_add_shared kernels_templates streams_events async_copies pinned_memory memset_widths
          driver_memset copies_2d_3d device_copies big_alloc many_allocs device_props error_cases multi_thread
          driver_api symbols func_attributes graphs_capture graphs_explicit vmm host_functions mem_pools stream_memops
          late_thread late_thread_runtime tensor_maps cooperative_launch host_register
          device_printf arrays_textures managed_memory managed_streams suspend_resume graph_host_func
          stream_attributes linear_textures peer_copies shareable_handles precopy_dirty
          graph_host_copies graph_memory_nodes graph_conditional_nodes pool_ipc graph_node_updates mipmapped_arrays
          memcpy_batch graph_suspend launch_events nonblocking_copies user_objects
          callback_workers managed_globals green_contexts)
# The application's own memory registered mapped needs the server on the client's host: over TCP it must
# report the documented refusal (exit 3, cudaErrorNotSupported) and pass over the Unix socket. (Memory
# allocated mapped, mapped_memory, passes over both: over TCP it is managed memory of the session.)
TCP_REFUSED=(host_register)
PROGRAMS+=(mapped_memory)
# NVIDIA libraries (cuBLAS, cuDNN, NCCL, cuSPARSE), found where PyTorch's pip packages put them (tests/gpu/find_libs.sh).
LIB_PROGRAMS=(cublas_gemm cudnn_conv nccl_allreduce cusparse_ilu)

suite_start=$(date +%s)
say() { echo "[suite +$(( $(date +%s) - suite_start ))s] $*"; }
now_ms() { echo $(( $(date +%s%N) / 1000000 )); }

for f in "$SERVER_BIN" "$VCUDA_BIN"; do
    [ -x "$f" ] || { echo "run_suite: $f is missing or not executable" >&2; exit 2; }
done
[ -f "$CLIENT_DIR/libcuda.so.1" ] || { echo "run_suite: $CLIENT_DIR/libcuda.so.1 is missing" >&2; exit 2; }
missing=()
for p in "${PROGRAMS[@]}" quota_probe copy_forever; do
    [ -x "$PROGS/$p" ] || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] || say "warning: programs missing from $PROGS: ${missing[*]}"

# ------------------------------------------------------------------------------------------ GPU and server
gpu_mem_used() {  # MiB used on all GPUs together, as NVML reports it
    nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits 2>/dev/null | awk '{ s += $1 } END { print s + 0 }'
}

port_listening() {  # something listens on TCP port $1 (read from /proc, no connection made)
    local hex
    hex="$(printf '%04X' "$1")"
    awk -v h=":$hex" 'NR > 1 && $4 == "0A" && substr($2, length($2) - 4) == h { found = 1 } END { exit !found }' \
        /proc/net/tcp /proc/net/tcp6 2>/dev/null
}

free_port() {
    if command -v python3 >/dev/null 2>&1; then
        python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
        return
    fi
    local p
    for p in 47300 47301 47302 47303 47304 47305 47306 47307; do
        port_listening "$p" || { echo "$p"; return; }
    done
    echo 47399
}

server_pid=""
server_log=""
server_count=0
PORT=""
TCP_ADDR=""
UNIX_ADDR="unix:$SOCK"

stop_server() {
    [ -n "$server_pid" ] || return 0
    if kill -0 "$server_pid" 2>/dev/null; then
        kill -TERM "$server_pid" 2>/dev/null
        for _ in $(seq 1 50); do
            kill -0 "$server_pid" 2>/dev/null || break
            sleep 0.1
        done
        kill -0 "$server_pid" 2>/dev/null && { say "server did not stop on SIGTERM within 5 s: SIGKILL"; kill -KILL "$server_pid" 2>/dev/null; }
    fi
    wait "$server_pid" 2>/dev/null
    server_pid=""
}

# start_server LABEL [EXTRA ARGS...]: the real driver, TCP on 127.0.0.1:PORT and the Unix socket.
start_server() {
    local label="$1"
    shift
    stop_server
    server_count=$((server_count + 1))
    server_log="$OUTDIR/server-$server_count-$label.log"
    local attempt
    for attempt in 1 2 3; do
        PORT="$(free_port)"
        TCP_ADDR="127.0.0.1:$PORT"
        rm -f "$SOCK"
        local level=(--log-level info)
        case " $* " in *" --log-level"*) level=() ;; esac  # the caller's level (SUITE_SERVER_ARGS) wins
        "$SERVER_BIN" --listen "$TCP_ADDR" --listen "$UNIX_ADDR" "${level[@]}" ${TLS_ARGS[@]+"${TLS_ARGS[@]}"} "$@" \
            >>"$server_log" 2>&1 &
        server_pid=$!
        for _ in $(seq 1 200); do
            if ! kill -0 "$server_pid" 2>/dev/null; then
                wait "$server_pid" 2>/dev/null
                server_pid=""
                break
            fi
            if [ -S "$SOCK" ] && port_listening "$PORT"; then
                say "server ($label) up on $TCP_ADDR and $UNIX_ADDR${*:+ with $*}; log $(basename "$server_log")"
                return 0
            fi
            sleep 0.1
        done
        say "server ($label) did not come up (attempt $attempt); log: $server_log"
        stop_server
    done
    return 1
}

ensure_server() {  # restart the plain server if it died under a program
    [ -n "$server_pid" ] && kill -0 "$server_pid" 2>/dev/null && return 0
    say "the server is gone (see $server_log); restarting it"
    notes+=("server died before/while running $1; restarted")
    # shellcheck disable=SC2086  # SUITE_SERVER_ARGS: words
    start_server plain ${SUITE_SERVER_ARGS:-}
}

cleanup() {
    stop_server
    rm -f "$SOCK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ------------------------------------------------------------------------------------------ one run
# run_mode ROW MODE PROGRAM [ENV...]: runs natively or through vcuda; sets $status (PASS, FAIL(rc), TIMEOUT, MISSING).
status=""
run_mode() {  # run_mode ROW MODE "PROGRAM [ARGS...]" [ENV...]
    local row="$1" mode="$2" prog args
    read -r prog args <<<"$3"
    shift 3
    local -a argv=()
    [ -n "$args" ] && read -r -a argv <<<"$args"
    local base="$OUTDIR/$row.$mode"
    if [ ! -x "$PROGS/$prog" ]; then
        status="MISSING"
        : >"$base.out"
        return
    fi
    local rc
    case "$mode" in
        native)
            timeout -k 5 "$TIMEOUT" env -u VCUDA_SERVER "$@" "$PROGS/$prog" ${argv[@]+"${argv[@]}"} >"$base.out" 2>"$base.err"
            rc=$? ;;
        tcp | unix)
            local addr="$TCP_ADDR"
            [ "$mode" = unix ] && addr="$UNIX_ADDR"
            timeout -k 5 "$TIMEOUT" env VCUDA_LOG_FILE="$base.client.log" VCUDA_PRIVATE_TABLE_ID="$TABLE_ID" "$@" \
                "$VCUDA_BIN" run --server "$addr" -- "$PROGS/$prog" ${argv[@]+"${argv[@]}"} >"$base.out" 2>"$base.err"
            rc=$? ;;
    esac
    if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
        status="TIMEOUT"
    elif [ "$rc" = 0 ] && grep -q "^PASS " "$base.out"; then
        status="PASS"
    else
        status="FAIL($rc)"
    fi
}

# ------------------------------------------------------------------------------------------ the matrix
say "GPU: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1)"
say "build: $BUILD; outputs: $OUTDIR"
notes=()
# shellcheck disable=SC2086  # SUITE_SERVER_ARGS: words
if ! start_server plain ${SUITE_SERVER_ARGS:-}; then
    tail -20 "$server_log"
    echo "SUITE: 0/${#PROGRAMS[@]} identical (vcuda-server did not start; see $server_log)"
    exit 1
fi

rows=()
declare -A st_native st_tcp st_unix same
run_row() {  # run_row ROW "PROGRAM [ARGS...]" [ENV...]
    local row="$1" prog="$2"
    shift 2
    rows+=("$row")
    run_mode "$row" native "$prog" "$@"
    st_native[$row]="$status"
    ensure_server "$row"
    run_mode "$row" tcp "$prog" "$@"
    st_tcp[$row]="$status"
    ensure_server "$row"
    run_mode "$row" unix "$prog" "$@"
    st_unix[$row]="$status"
    local b="$OUTDIR/$row" m ok=1
    grep -v '^info:' "$b.native.out" >"$b.native.cmp"
    local refused=0
    [[ " ${TCP_REFUSED[*]} " == *" $row "* ]] && refused=1
    for m in tcp unix; do
        grep -v '^info:' "$b.$m.out" >"$b.$m.cmp"
        [ "$m" = tcp ] && [ "$refused" = 1 ] && continue  # its output is the refusal, checked below
        if diff -u "$b.native.cmp" "$b.$m.cmp" >"$b.$m.diff"; then
            rm -f "$b.$m.diff"
        else
            ok=0
        fi
    done
    if [ "$refused" = 1 ] && [ "$ok" = 1 ] && [ "${st_native[$row]}" = PASS ] && [ "${st_tcp[$row]}" = "FAIL(3)" ] &&
        [ "${st_unix[$row]}" = PASS ]; then
        same[$row]="yes (TCP: refused as documented)"
    elif [ "$ok" = 1 ] && [ "${st_native[$row]}" = PASS ] && [ "${st_tcp[$row]}" = PASS ] && [ "${st_unix[$row]}" = PASS ]; then
        same[$row]="yes"
    elif [ "$ok" = 1 ]; then
        same[$row]="no (same output, not PASS)"
    else
        same[$row]="no (see $row.*.diff)"
    fi
    say "$row: native ${st_native[$row]}, tcp ${st_tcp[$row]}, unix ${st_unix[$row]}, same output: ${same[$row]}"
}

for p in "${PROGRAMS[@]}"; do
    run_row "$p" "$p"
done
# Kernels given host pointers of pinned memory allocated without the mapped flag, and of memory registered
# without it: through vcuda, where the GPU cannot reach those pages, the kernels run on device copies.
run_row "mapped_memory.pinned" "mapped_memory pinned"
run_row "host_register.unmapped_launch" "host_register unmapped-launch"
run_row "vector_add.eager" vector_add CUDA_MODULE_LOADING=EAGER
# shellcheck source=tests/gpu/find_libs.sh
source "$(dirname "$0")/find_libs.sh" >/dev/null 2>&1
for p in "${LIB_PROGRAMS[@]}"; do
    run_row "$p" "$p" LD_LIBRARY_PATH="${VCUDA_GPU_LIB_PATH:-}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
done

# ------------------------------------------------------------------------------------------ (c) concurrency
say "(c) two concurrent sessions, vector_add 20 times each (one over TCP, one over the Unix socket)"
ensure_server concurrency
conc_loop() {  # conc_loop ADDR TAG: prints the number of passes
    local addr="$1" tag="$2" i n=0
    for i in $(seq 1 20); do
        if timeout -k 5 "$TIMEOUT" env VCUDA_LOG_FILE="$OUTDIR/concurrent.$tag.client.log" \
            "$VCUDA_BIN" run --server "$addr" -- "$PROGS/vector_add" >"$OUTDIR/concurrent.$tag.$i.out" 2>&1 &&
            grep -q "^PASS " "$OUTDIR/concurrent.$tag.$i.out"; then
            n=$((n + 1))
            rm -f "$OUTDIR/concurrent.$tag.$i.out"
        fi
    done
    echo "$n" >"$OUTDIR/concurrent.$tag.count"
}
conc_start=$(now_ms)
conc_loop "$TCP_ADDR" tcp &
c1=$!
conc_loop "$UNIX_ADDR" unix &
c2=$!
wait "$c1" "$c2"
conc_ms=$(( $(now_ms) - conc_start ))
conc_pass=$(( $(cat "$OUTDIR/concurrent.tcp.count" 2>/dev/null || echo 0) + $(cat "$OUTDIR/concurrent.unix.count" 2>/dev/null || echo 0) ))
conc_result="FAIL"
[ "$conc_pass" = 40 ] && conc_result="ok"
say "(c) concurrency: $conc_pass/40 passed in ${conc_ms} ms: $conc_result"

# ------------------------------------------------------------------------------------------ (b) kill
say "(b) SIGKILL of a client in the middle of copies: copy_forever (4 GiB on the device) over TCP"
ensure_server kill
kill_result="FAIL"
kill_detail=""
if [ -x "$PROGS/copy_forever" ] && command -v nvidia-smi >/dev/null 2>&1; then
    baseline=$(gpu_mem_used)
    kill_out="$OUTDIR/kill.copy_forever.out"
    # Started directly (not through `vcuda run`) so that $! is the program itself.
    VCUDA_SERVER="$TCP_ADDR" LD_LIBRARY_PATH="$CLIENT_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
        VCUDA_LOG_FILE="$OUTDIR/kill.copy_forever.client.log" "$PROGS/copy_forever" 120 >"$kill_out" 2>&1 &
    kpid=$!
    ready=0
    for _ in $(seq 1 300); do
        grep -q "^ready" "$kill_out" 2>/dev/null && { ready=1; break; }
        kill -0 "$kpid" 2>/dev/null || break
        sleep 0.1
    done
    if [ "$ready" = 1 ]; then
        sleep 3
        used_at_kill=$(gpu_mem_used)
        kill -KILL "$kpid" 2>/dev/null
        t0=$(now_ms)
        wait "$kpid" 2>/dev/null
        back_ms=-1
        used=$used_at_kill
        while [ $(( $(now_ms) - t0 )) -lt 15000 ]; do
            used=$(gpu_mem_used)
            if [ "$used" -le $((baseline + KILL_SLACK_MIB)) ]; then
                back_ms=$(( $(now_ms) - t0 ))
                break
            fi
            sleep 0.1
        done
        sleep 0.5  # let the server write its line
        end_line=$(grep -E "session [0-9]+ ended" "$server_log" | tail -1)
        kill_detail="baseline ${baseline} MiB, ${used_at_kill} MiB at the kill, back to ${used} MiB"
        if [ "$back_ms" -ge 0 ]; then
            kill_detail="$kill_detail after ${back_ms} ms"
        else
            kill_detail="$kill_detail: NOT back to baseline within 15 s"
        fi
        if [ "$used_at_kill" -lt $((baseline + 3000)) ]; then
            kill_detail="$kill_detail (the 4 GiB never showed up in nvidia-smi: is the server on this GPU?)"
        elif [ "$back_ms" -ge 0 ] && [ "$back_ms" -le "$KILL_LIMIT_MS" ]; then
            kill_result="ok"
        fi
        say "(b) $kill_detail"
        say "(b) server: ${end_line:-no session-end line in $(basename "$server_log")}"
        kill -0 "$server_pid" 2>/dev/null || { kill_result="FAIL"; say "(b) the server died"; }
    else
        kill -KILL "$kpid" 2>/dev/null
        wait "$kpid" 2>/dev/null
        kill_detail="copy_forever never printed ready: $(tail -3 "$kill_out" | tr '\n' ' ')"
        say "(b) $kill_detail"
    fi
else
    kill_detail="copy_forever or nvidia-smi missing"
    say "(b) skipped: $kill_detail"
fi
say "(b) kill: $kill_result"

# ------------------------------------------------------------------------------------------ (a) quota
say "(a) quota: server restarted with --memory-quota 1GiB; quota_probe allocates 256 MiB blocks"
quota_result="FAIL"
quota_detail=""
if start_server quota --memory-quota 1GiB; then
    run_mode quota.quota_probe tcp quota_probe
    qp_status="$status"
    qp_out="$OUTDIR/quota.quota_probe.tcp.out"
    n_ok=$(sed -n 's/^256 MiB allocations that succeeded: \([0-9]*\)$/\1/p' "$qp_out" | head -1)
    q_err=$(sed -n 's/^the next one returned: \(.*\)$/\1/p' "$qp_out" | head -1)
    q_total=$(sed -n 's/^total memory reported: \(.*\)$/\1/p' "$qp_out" | head -1)
    run_mode quota.vector_add unix vector_add
    va_status="$status"
    alive=yes
    kill -0 "$server_pid" 2>/dev/null || alive=no
    quota_detail="quota_probe ${qp_status}: ${n_ok:-?} blocks of 256 MiB, then ${q_err:-?}; total reported ${q_total:-?}; vector_add afterwards ${va_status}; server alive: ${alive}"
    if [ "$qp_status" = PASS ] && [ "${q_err:-}" = cudaErrorMemoryAllocation ] && [ -n "${n_ok:-}" ] &&
        [ "$n_ok" -ge 3 ] && [ "$n_ok" -le 4 ] && [ "$va_status" = PASS ] && [ "$alive" = yes ]; then
        quota_result="ok"
    fi
else
    quota_detail="the server did not start with --memory-quota 1GiB (see $server_log)"
fi
say "(a) $quota_detail"
say "(a) quota: $quota_result"
stop_server

# ------------------------------------------------------------------------------------------ the table
identical=0
for r in "${rows[@]}"; do
    [[ "${same[$r]}" == yes* ]] && identical=$((identical + 1))
done
{
    echo
    printf '%-20s | %-9s | %-9s | %-9s | %s\n' program native "$TCP_LABEL" unix same-output
    printf '%-20s-+-%-9s-+-%-9s-+-%-9s-+-%s\n' -------------------- --------- --------- --------- -----------
    for r in "${rows[@]}"; do
        printf '%-20s | %-9s | %-9s | %-9s | %s\n' "$r" "${st_native[$r]}" "${st_tcp[$r]}" "${st_unix[$r]}" "${same[$r]}"
    done
    echo
    echo "(a) quota:       $quota_result — $quota_detail"
    echo "(b) kill:        $kill_result — $kill_detail"
    echo "(c) concurrency: $conc_result — $conc_pass/40 vector_add runs passed in two concurrent sessions (${conc_ms} ms)"
    for n in ${notes[@]+"${notes[@]}"}; do echo "note: $n"; done
    for r in "${rows[@]}"; do
        for m in tcp unix; do
            [ -f "$OUTDIR/$r.$m.diff" ] || continue
            echo "first differences of $r ($m vs native; - native, + vcuda):"
            grep -E '^[-+][^-+]' "$OUTDIR/$r.$m.diff" | head -6 | sed 's/^/    /'
        done
    done
    echo "wall time: $(( $(date +%s) - suite_start )) s; outputs in $OUTDIR"
    echo "SUITE: $identical/${#rows[@]} identical"
} | tee "$OUTDIR/summary.txt"

[ "$identical" = "${#rows[@]}" ] && [ "$quota_result" = ok ] && [ "$kill_result" = ok ] && [ "$conc_result" = ok ]
