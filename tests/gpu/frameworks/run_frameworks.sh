#!/usr/bin/env bash
# The framework suite: on a machine with a GPU and PyTorch, Triton, CuPy and JAX installed, run each probe of this
# folder natively and through vcuda (over the Unix socket; also over TCP with FRAMEWORKS_TCP=1) and compare what
# they print, `info:` lines left out.
#
# Usage: tests/gpu/frameworks/run_frameworks.sh BUILD_DIR
#   BUILD_DIR holds bin/vcuda-server, bin/vcuda and lib/vcuda/; lib/vcuda/private_table_id, when there, is
#   exported to vcuda runs as VCUDA_PRIVATE_TABLE_ID (torch_step_time reads vcuda's call counters with it).
# Environment:
#   OUT                 outputs in $OUT/frameworks (default /tmp/frameworks): ROW.MODE.{out,err,client.log,diff},
#                       server.log, summary.txt
#   FRAMEWORKS_ONLY     the rows to run, e.g. "torch_plain jax" (default: all but the two-GPU rows
#                       multigpu_ddp and multigpu_copies, torch_multi_gpu.py)
#   FRAMEWORKS_TCP=1    also run every row over TCP
#   FRAMEWORKS_TIMEOUT  seconds per run (default 240); FRAMEWORKS_TIMEOUT_<row> for one row
#   PYTHON              the interpreter (default python3)
#   FRAMEWORKS_SERVER_ARGS  extra vcuda-server arguments (e.g. `--test-suspend-every 200`)
# Exit status: 0 when every row passed and printed the same natively and through vcuda, and the server never
# died; else 1.
set -u

if [ $# -lt 1 ] || [ "$1" = "-h" ] || [ "$1" = "--help" ]; then
    sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
fi
BUILD="$(cd "$1" && pwd)" || { echo "run_frameworks: no such build directory: $1" >&2; exit 2; }
HERE="$(cd "$(dirname "$0")" && pwd)"
OUTDIR="${OUT:+$OUT/frameworks}"
OUTDIR="${OUTDIR:-/tmp/frameworks}"
mkdir -p "$OUTDIR" || { echo "run_frameworks: cannot create $OUTDIR" >&2; exit 2; }
PY="$(command -v "${PYTHON:-python3}")" || { echo "run_frameworks: no ${PYTHON:-python3}" >&2; exit 2; }
SERVER_BIN="$BUILD/bin/vcuda-server"
VCUDA_BIN="$BUILD/bin/vcuda"
SOCK=/tmp/vcuda-frameworks.sock
UNIX_ADDR="unix:$SOCK"
SERVER_LOG="$OUTDIR/server.log"
for f in "$SERVER_BIN" "$VCUDA_BIN"; do
    [ -x "$f" ] || { echo "run_frameworks: $f is missing or not executable" >&2; exit 2; }
done

ALL_ROWS=(torch_plain torch_expandable torch_graph torch_autocast torch_queries torch_step_time triton cupy jax
          newuser_torch newuser_compile newuser_jax)
# Rows that need two GPUs: run only when named in FRAMEWORKS_ONLY.
TWO_GPU_ROWS=(multigpu_ddp multigpu_copies)
row_probe() {  # the probe and its arguments
    case "$1" in
        multigpu_*) echo "torch_multi_gpu.py ${1#multigpu_}" ;;
        torch_*) echo "torch_train.py ${1#torch_}" ;;
        newuser_*) echo "newuser_probe.py ${1#newuser_}" ;;
        *) echo "${1}_probe.py" ;;
    esac
}
row_timeout() { local v="FRAMEWORKS_TIMEOUT_$1"; echo "${!v:-${FRAMEWORKS_TIMEOUT:-240}}"; }

ROWS=()
for r in ${FRAMEWORKS_ONLY:-${ALL_ROWS[*]}}; do
    [[ " ${ALL_ROWS[*]} ${TWO_GPU_ROWS[*]} " == *" $r "* ]] ||
        { echo "run_frameworks: unknown row $r (rows: ${ALL_ROWS[*]}; two GPUs: ${TWO_GPU_ROWS[*]})" >&2; exit 2; }
    ROWS+=("$r")
done
VMODES=(unix)
[ "${FRAMEWORKS_TCP:-0}" = 1 ] && VMODES+=(tcp)

# The private table's id names vcuda's counters slot; only vcuda runs get it.
TABLE_ENV=()
if [ -f "$BUILD/lib/vcuda/private_table_id" ]; then
    TABLE_ENV=("VCUDA_PRIVATE_TABLE_ID=$(tr -d ' \t\r\n' <"$BUILD/lib/vcuda/private_table_id")")
fi

start=$(date +%s)
say() { echo "[frameworks +$(( $(date +%s) - start ))s] $*"; }

# ------------------------------------------------------------------------------------------ the server
port_listening() {  # something listens on TCP port $1 (read from /proc, no connection made)
    local hex
    hex="$(printf '%04X' "$1")"
    awk -v h=":$hex" 'NR > 1 && $4 == "0A" && substr($2, length($2) - 4) == h { found = 1 } END { exit !found }' \
        /proc/net/tcp /proc/net/tcp6 2>/dev/null
}
free_port() { "$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

server_pid=""
TCP_ADDR=""
server_alive() {  # running, and not a zombie (kill -0 succeeds on one until it is reaped)
    [ -n "$server_pid" ] && kill -0 "$server_pid" 2>/dev/null &&
        [ "$(sed 's/.*) //' "/proc/$server_pid/stat" 2>/dev/null | cut -c1)" != Z ]
}

stop_server() {
    [ -n "$server_pid" ] || return 0
    if kill -0 "$server_pid" 2>/dev/null; then
        kill -TERM "$server_pid" 2>/dev/null
        for _ in $(seq 1 50); do
            kill -0 "$server_pid" 2>/dev/null || break
            sleep 0.1
        done
        kill -0 "$server_pid" 2>/dev/null && kill -KILL "$server_pid" 2>/dev/null
    fi
    wait "$server_pid" 2>/dev/null
    server_pid=""
}

start_server() {  # TCP on 127.0.0.1:PORT and the Unix socket, the log appended to server.log
    stop_server
    local attempt port
    for attempt in 1 2 3; do
        port="$(free_port)"
        TCP_ADDR="127.0.0.1:$port"
        rm -f "$SOCK"
        echo "=== $(date '+%F %T') vcuda-server --listen $TCP_ADDR --listen $UNIX_ADDR ${FRAMEWORKS_SERVER_ARGS:-}" >>"$SERVER_LOG"
        # shellcheck disable=SC2086  # FRAMEWORKS_SERVER_ARGS: words
        "$SERVER_BIN" --listen "$TCP_ADDR" --listen "$UNIX_ADDR" --log-level info ${FRAMEWORKS_SERVER_ARGS:-} \
            >>"$SERVER_LOG" 2>&1 &
        server_pid=$!
        for _ in $(seq 1 200); do
            server_alive || { wait "$server_pid" 2>/dev/null; server_pid=""; break; }
            if [ -S "$SOCK" ] && port_listening "$port"; then
                say "server up on $TCP_ADDR and $UNIX_ADDR (pid $server_pid)"
                return 0
            fi
            sleep 0.1
        done
        say "server did not come up (attempt $attempt); see $SERVER_LOG"
        stop_server
    done
    return 1
}

cleanup() {
    stop_server
    rm -f "$SOCK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ------------------------------------------------------------------------------------------ one run
notes=()
server_deaths=0
status=""
run_mode() {  # run_mode ROW MODE: native, unix or tcp; sets $status to PASS, FAIL(rc), TIMEOUT or NO-SERVER
    local row="$1" mode="$2" base="$OUTDIR/$1.$2" limit rc
    local -a probe
    read -r -a probe <<<"$(row_probe "$row")"
    probe[0]="$HERE/${probe[0]}"
    limit="$(row_timeout "$row")"
    rm -f "$base.out" "$base.err" "$base.client.log" "$base.diff"
    if [ "$mode" = native ]; then
        timeout -k 10 "$limit" env -u VCUDA_SERVER -u VCUDA_PRIVATE_TABLE_ID "$PY" "${probe[@]}" >"$base.out" 2>"$base.err"
        rc=$?
    else
        if ! server_alive; then
            notes+=("the server was gone before $row ($mode); restarted")
            start_server || { status="NO-SERVER"; : >"$base.out"; return; }
        fi
        local addr="$UNIX_ADDR"
        [ "$mode" = tcp ] && addr="$TCP_ADDR"
        timeout -k 10 "$limit" env VCUDA_LOG_FILE="$base.client.log" ${TABLE_ENV[@]+"${TABLE_ENV[@]}"} \
            "$VCUDA_BIN" run --server "$addr" -- "$PY" "${probe[@]}" >"$base.out" 2>"$base.err"
        rc=$?
        sleep 0.2  # a server that crashed as the probe ended may not have exited yet
        if ! server_alive; then  # a probe that kills the server is a failure of its own: note it, go on
            say "the server died under $row ($mode); restarting it"
            notes+=("the server died under $row ($mode); restarted (see server.log)")
            server_deaths=$((server_deaths + 1))
            start_server
        fi
    fi
    if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
        status="TIMEOUT"
    elif [ "$rc" = 0 ] && grep -q "^PASS " "$base.out"; then
        status="PASS"
    else
        status="FAIL($rc)"
    fi
}

# ------------------------------------------------------------------------------------------ the rows
say "GPU: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1)"
say "python: $PY; $("$PY" -c '
import importlib.metadata as m
out = []
for d in ("torch", "triton", "cupy-cuda13x", "cupy-cuda12x", "jax", "jaxlib"):
    try: out.append(d + " " + m.version(d))
    except Exception: pass
print(", ".join(out))' 2>/dev/null)"
say "build: $BUILD; outputs: $OUTDIR; private table id: ${TABLE_ENV[0]:-none}"
if ! start_server; then
    tail -20 "$SERVER_LOG"
    echo "FRAMEWORKS: 0/${#ROWS[@]} identical (vcuda-server did not start)"
    exit 1
fi

declare -A st same
for row in "${ROWS[@]}"; do
    say "$row: native"
    run_mode "$row" native
    st[$row.native]="$status"
    ok=1
    grep -v '^info:' "$OUTDIR/$row.native.out" >"$OUTDIR/$row.native.cmp"
    for m in "${VMODES[@]}"; do
        say "$row: vcuda ($m)"
        run_mode "$row" "$m"
        st[$row.$m]="$status"
        b="$OUTDIR/$row"
        grep -v '^info:' "$b.$m.out" >"$b.$m.cmp"
        if diff -u "$b.native.cmp" "$b.$m.cmp" >"$b.$m.diff"; then
            rm -f "$b.$m.diff"
        else
            ok=0
        fi
        [ "$status" = PASS ] || ok=0
    done
    [ "${st[$row.native]}" = PASS ] || ok=0
    if [ "$ok" = 1 ]; then
        same[$row]=yes
    elif ls "$OUTDIR/$row".*.diff >/dev/null 2>&1; then
        same[$row]="no (see $row.*.diff)"
    else
        same[$row]="no (same output, not PASS)"
    fi
    line="$row: native ${st[$row.native]}"
    for m in "${VMODES[@]}"; do line="$line, $m ${st[$row.$m]}"; done
    say "$line; same output: ${same[$row]}"
done
stop_server

# ------------------------------------------------------------------------------------------ the summary
info_value() {  # info_value ROW MODE KEY: the value of `info: KEY=VALUE` in that run's stdout
    sed -n "s/^info: $3=\([^ ]*\).*/\1/p" "$OUTDIR/$1.$2.out" 2>/dev/null | tail -1
}
identical=0  # counted here: the block below runs in a subshell (it is piped into tee)
for r in "${ROWS[@]}"; do
    [ "${same[$r]}" = yes ] && identical=$((identical + 1))
done
{
    echo
    head="$(printf '%-18s | %-10s' probe native)"
    for m in "${VMODES[@]}"; do head="$head | $(printf '%-10s' "vcuda-$m")"; done
    echo "$head | same-output"
    echo "$head | same-output" | tr -c '|\n' '-'
    for r in "${ROWS[@]}"; do
        line="$(printf '%-18s | %-10s' "$r" "${st[$r.native]}")"
        for m in "${VMODES[@]}"; do line="$line | $(printf '%-10s' "${st[$r.$m]}")"; done
        echo "$line | ${same[$r]}"
    done
    if [ -n "${st[torch_step_time.native]:-}" ]; then
        n="$(info_value torch_step_time native step_ms)"
        for m in "${VMODES[@]}"; do
            v="$(info_value torch_step_time "$m" step_ms)"
            ratio="$(awk -v a="$n" -v b="$v" 'BEGIN { if (a + 0 > 0 && b + 0 > 0) printf "%.2fx", b / a; else print "?" }')"
            rt="$(info_value torch_step_time "$m" sync_round_trips_per_step)"
            echo "torch step_time ($m): native ${n:-?} ms, vcuda ${v:-?} ms, ratio $ratio;" \
                "sync round trips per step: ${rt:-?}"
        done
    fi
    echo
    for note in ${notes[@]+"${notes[@]}"}; do echo "note: $note"; done
    for r in "${ROWS[@]}"; do
        for m in native "${VMODES[@]}"; do
            b="$OUTDIR/$r.$m"
            if [ "${st[$r.$m]}" != PASS ]; then
                echo "--- $r ($m): ${st[$r.$m]}; last 15 lines of $r.$m.err:"
                tail -15 "$b.err" 2>/dev/null | sed 's/^/    /'
                if [ -s "$b.client.log" ]; then
                    echo "    last 5 lines of $r.$m.client.log:"
                    tail -5 "$b.client.log" | sed 's/^/    /'
                fi
            fi
            if [ -f "$b.diff" ]; then
                echo "--- $r: first differences ($m vs native; - native, + vcuda):"
                grep -E '^[-+]([^-+]|$)' "$b.diff" | head -8 | sed 's/^/    /'
            fi
        done
    done
    echo "wall time: $(( $(date +%s) - start )) s; outputs in $OUTDIR"
    echo "FRAMEWORKS: $identical/${#ROWS[@]} identical"
} | tee "$OUTDIR/summary.txt"

[ "$identical" = "${#ROWS[@]}" ] && [ "$server_deaths" = 0 ]
