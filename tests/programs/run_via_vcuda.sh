#!/usr/bin/env bash
# Runs one CUDA test program through vcuda on the software test driver (CI: no GPU needed):
# starts BUILD/bin/vcuda-server on a Unix socket or a free TCP port with BUILD/lib/libvcuda-softdriver.so,
# runs the program with the client library in front (LD_LIBRARY_PATH=BUILD/lib/vcuda, VCUDA_SERVER=ADDR),
# and passes when the program exits 0 with a `PASS` line and the server is still alive afterwards.
# On failure it prints the program's output and the server's log.
#
# Usage: run_via_vcuda.sh --build-dir DIR [--transport unix|tcp|tls|mtls] [--env NAME=VALUE]... [--server-arg=ARG]...
#                         [--timeout SECONDS] [--driver PATH] [--expect-exit N] [--expect-output REGEX]
#                         [--expect-session-end] [--expect-server-log REGEX] [--forbid-server-log REGEX]
#                         -- PROGRAM [ARGS...]
#   --transport      unix (default) or tcp (127.0.0.1 and a free port); tls: TCP with TLS (certificates made
#                    for the run by BUILD/tests/tls/vcuda_test_certs, the program given VCUDA_TLS_CA); mtls: TLS
#                    with client certificates (server --tls-client-ca, program VCUDA_TLS_CERT/VCUDA_TLS_KEY)
#   --env            set for the program only (repeatable), e.g. --env CUDA_MODULE_LOADING=EAGER
#   --server-arg     one extra server argument (repeatable), e.g. --server-arg=--memory-quota --server-arg=1GiB
#   --timeout        kill the program after this many seconds (default 120)
#   --driver         the driver library the server loads (default BUILD/lib/libvcuda-softdriver.so)
#   --expect-exit    the program must exit with N (a refusal it reports), not pass; the server must live on
#   --expect-output  the program's output (stdout and stderr) must also match this extended regex
#   --expect-server-log  the server's log must match this extended regex (e.g. that a suspend happened;
#                    repeatable: each must match)
#   --forbid-output  the program's output must have nothing matching this extended regex
#   --forbid-server-log  the server's log must have nothing matching this extended regex (repeatable)
#   --expect-session-end  within 5 s of the program's exit (CI machines are loaded) the server must log that its
#                    session ended, and its thread and descriptor counts must be back where they were before
set -u

build_dir=""
transport="unix"
timeout_s=120
driver=""
prog_env=()
server_args=()
expect_exit=""
expect_output=""
expect_server_logs=()
forbid_output=""
forbid_server_logs=()
expect_session_end=0


die() {
    echo "run_via_vcuda: $*" >&2
    exit 2
}

while [ $# -gt 0 ]; do
    case "$1" in
        --build-dir) [ $# -ge 2 ] || die "--build-dir needs a value"; build_dir="$2"; shift 2 ;;
        --build-dir=*) build_dir="${1#*=}"; shift ;;
        --transport) [ $# -ge 2 ] || die "--transport needs a value"; transport="$2"; shift 2 ;;
        --transport=*) transport="${1#*=}"; shift ;;
        --env) [ $# -ge 2 ] || die "--env needs NAME=VALUE"; prog_env+=("$2"); shift 2 ;;
        --env=*) prog_env+=("${1#*=}"); shift ;;
        --server-arg) [ $# -ge 2 ] || die "--server-arg needs a value"; server_args+=("$2"); shift 2 ;;
        --server-arg=*) server_args+=("${1#*=}"); shift ;;
        --timeout) [ $# -ge 2 ] || die "--timeout needs a value"; timeout_s="$2"; shift 2 ;;
        --timeout=*) timeout_s="${1#*=}"; shift ;;
        --driver) [ $# -ge 2 ] || die "--driver needs a value"; driver="$2"; shift 2 ;;
        --driver=*) driver="${1#*=}"; shift ;;
        --expect-exit) [ $# -ge 2 ] || die "--expect-exit needs a value"; expect_exit="$2"; shift 2 ;;
        --expect-output) [ $# -ge 2 ] || die "--expect-output needs a value"; expect_output="$2"; shift 2 ;;
        --expect-session-end) expect_session_end=1; shift ;;
        --expect-server-log) [ $# -ge 2 ] || die "--expect-server-log needs a value"; expect_server_logs+=("$2"); shift 2 ;;
        --forbid-output) [ $# -ge 2 ] || die "--forbid-output needs a value"; forbid_output="$2"; shift 2 ;;
        --forbid-server-log) [ $# -ge 2 ] || die "--forbid-server-log needs a value"; forbid_server_logs+=("$2"); shift 2 ;;
        --) shift; break ;;
        -h|--help) sed -n '2,23p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) die "unknown option '$1' (see --help)" ;;
    esac
done
[ $# -ge 1 ] || die "no program given (… -- PROGRAM [ARGS...])"
[ -n "$build_dir" ] || die "--build-dir is required"
case "$transport" in unix|tcp|tls|mtls) ;; *) die "--transport must be unix, tcp, tls or mtls, not '$transport'" ;; esac

program="$1"
shift
name="$(basename "$program")"
server_bin="$build_dir/bin/vcuda-server"
client_dir="$build_dir/lib/vcuda"
[ -n "$driver" ] || driver="$build_dir/lib/libvcuda-softdriver.so"

[ -x "$program" ] || die "program $program is missing or not executable (build the target vcuda_test_programs)"
[ -x "$server_bin" ] || die "$server_bin is missing (build the target vcuda-server)"
[ -f "$driver" ] || die "the software driver $driver is missing (build the software test driver)"
[ -f "$client_dir/libcuda.so.1" ] || die "$client_dir/libcuda.so.1 is missing (build the client library)"

tmp="$(mktemp -d "${TMPDIR:-/tmp}/vcuda-run.XXXXXX")" || die "mktemp failed"
server_log="$tmp/server.log"
prog_out="$tmp/program.out"
server_pid=""

stop_server() {
    [ -n "$server_pid" ] || return 0
    if kill -0 "$server_pid" 2>/dev/null; then
        kill -TERM "$server_pid" 2>/dev/null
        for _ in $(seq 1 50); do
            kill -0 "$server_pid" 2>/dev/null || break
            sleep 0.1
        done
        if kill -0 "$server_pid" 2>/dev/null; then
            echo "run_via_vcuda: the server did not stop within 5 s of SIGTERM; killing it" >&2
            kill -KILL "$server_pid" 2>/dev/null
        fi
    fi
    wait "$server_pid" 2>/dev/null
    server_pid=""
}

cleanup() {
    stop_server
    rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

show_logs() {
    echo "----- program output ($name) -----"
    cat "$prog_out" 2>/dev/null
    echo "----- server log -----"
    cat "$server_log" 2>/dev/null
    echo "----------------------"
}

# A TCP port nobody listens on now (a small race with other processes remains: the start is retried).
free_port() {
    if command -v python3 >/dev/null 2>&1; then
        python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
        return
    fi
    local p
    for _ in $(seq 1 50); do
        p=$((20000 + RANDOM % 40000))
        if ! port_listening "$p"; then
            echo "$p"
            return
        fi
    done
    echo 0
}

# True when something listens on 127.0.0.1/0.0.0.0 (or ::) TCP port $1: read from /proc, no connection made.
port_listening() {
    local hex
    hex="$(printf '%04X' "$1")"
    awk -v h=":$hex" 'NR > 1 && $4 == "0A" && substr($2, length($2) - 4) == h { found = 1 } END { exit !found }' \
        /proc/net/tcp /proc/net/tcp6 2>/dev/null
}

# Starts the server; true once it accepts connections, false if it exited or did not get ready in 15 s.
start_server() {
    local listen="$1"
    : >"$server_log"
    local level=(--log-level warn)
    [ "$expect_session_end" = 1 ] && level=(--log-level info)  # session ends are logged at info
    case " ${server_args[*]-} " in *" --log-level"*) level=() ;; esac  # the caller's level wins
    "$server_bin" --listen "$listen" --driver "$driver" ${level[@]+"${level[@]}"} ${server_args[@]+"${server_args[@]}"} \
        >>"$server_log" 2>&1 &
    server_pid=$!
    for _ in $(seq 1 150); do
        if ! kill -0 "$server_pid" 2>/dev/null; then
            wait "$server_pid" 2>/dev/null
            echo "run_via_vcuda: the server exited during start-up (exit $?)" >>"$server_log"
            server_pid=""
            return 1
        fi
        # Session-end checks count the server's threads once it has started them all: it logs "serving" then.
        if [ "$expect_session_end" != 1 ] || grep -q "serving .* GPU(s) on" "$server_log"; then
            case "$listen" in
                unix:*) [ -S "${listen#unix:}" ] && return 0 ;;
                *) port_listening "${listen##*:}" && return 0 ;;
            esac
        fi
        sleep 0.1
    done
    echo "run_via_vcuda: the server was not listening on $listen after 15 s" >>"$server_log"
    stop_server
    return 1
}

# TLS: throw-away certificates for this run; the server serves TLS only, the program trusts its CA.
if [ "$transport" = tls ] || [ "$transport" = mtls ]; then
    certs_tool="$build_dir/tests/tls/vcuda_test_certs"
    [ -x "$certs_tool" ] || die "$certs_tool is missing (build the target vcuda_test_certs_tool)"
    "$certs_tool" "$tmp/tls" || die "vcuda_test_certs failed"
    server_args+=(--tls-cert "$tmp/tls/server.pem" --tls-key "$tmp/tls/server.key")
    prog_env=(VCUDA_TLS_CA="$tmp/tls/ca.pem" ${prog_env[@]+"${prog_env[@]}"})
    if [ "$transport" = mtls ]; then
        server_args+=(--tls-client-ca "$tmp/tls/ca.pem")
        prog_env=(VCUDA_TLS_CERT="$tmp/tls/client.pem" VCUDA_TLS_KEY="$tmp/tls/client.key" "${prog_env[@]}")
    fi
fi

started=0
if [ "$transport" = unix ]; then
    addr="unix:$tmp/s.sock"
    start_server "$addr" && started=1
else
    for attempt in 1 2 3; do
        port="$(free_port)"
        [ "$port" != 0 ] || break
        addr="127.0.0.1:$port"
        if start_server "$addr"; then
            started=1
            break
        fi
        echo "run_via_vcuda: server start on $addr failed (attempt $attempt)" >&2
    done
fi
if [ "$started" != 1 ]; then
    echo "FAIL $name: vcuda-server did not start ($transport)"
    show_logs
    exit 1
fi

# What the server holds with no session: what it must come back to once the program's session ends.
server_threads() { ls "/proc/$server_pid/task" 2>/dev/null | wc -l; }
server_fds() { ls "/proc/$server_pid/fd" 2>/dev/null | wc -l; }
server_thread_names() { for t in "/proc/$server_pid/task"/*; do echo -n "$(cat "$t/comm" 2>/dev/null)($(cat "$t/wchan" 2>/dev/null)) "; done; }
base_threads=$(server_threads)
base_fds=$(server_fds)

# The program, with the client library in front of any libcuda.so.1, killed after the timeout.
ld_path="$client_dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
start_ns=$(date +%s%N)
# vcuda's call counters are readable through its private table (tests/programs/common.cuh: vcuda_round_trips).
table_id="$(tr -d ' \t\r\n' <"$client_dir/private_table_id" 2>/dev/null)"
timeout -k 5 "$timeout_s" env VCUDA_SERVER="$addr" LD_LIBRARY_PATH="$ld_path" VCUDA_PRIVATE_TABLE_ID="$table_id" ${prog_env[@]+"${prog_env[@]}"} \
    "$program" "$@" >"$prog_out" 2>&1
rc=$?
elapsed_ms=$(( ($(date +%s%N) - start_ns) / 1000000 ))

server_alive=1
kill -0 "$server_pid" 2>/dev/null || server_alive=0

why=""
if [ -n "$expect_exit" ]; then
    if [ "$rc" != "$expect_exit" ]; then why="exit code $rc, expected $expect_exit"
    elif [ "$server_alive" != 1 ]; then why="the server died"
    fi
elif [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
    why="timed out after ${timeout_s} s"
elif [ "$rc" != 0 ]; then
    why="exit code $rc"
    [ "$rc" -gt 128 ] && why="$why (signal $((rc - 128)))"
elif ! grep -q "^PASS " "$prog_out"; then
    why="exit 0 but no PASS line"
elif [ "$server_alive" != 1 ]; then
    why="the program passed but the server died"
elif [ -n "$expect_output" ] && ! grep -Eq -- "$expect_output" "$prog_out"; then
    why="its output has nothing matching '$expect_output'"
elif [ -n "$forbid_output" ] && grep -Eq -- "$forbid_output" "$prog_out"; then
    why="its output has '$(grep -Em1 -- "$forbid_output" "$prog_out")'"
elif found=$(for x in ${forbid_server_logs[@]+"${forbid_server_logs[@]}"}; do grep -Em1 -- "$x" "$server_log" && break; done) &&
    [ -n "$found" ]; then
    why="the server's log has '$found'"
elif missing=$(for x in "${expect_server_logs[@]}"; do grep -Eq -- "$x" "$server_log" || { echo "$x"; break; }; done) && [ -n "$missing" ]; then
    why="the server's log has nothing matching '$missing'"
fi

if [ -z "$why" ] && [ "$expect_session_end" = 1 ]; then
    ended=0
    for _ in $(seq 1 50); do  # 5 s
        if grep -q "session [0-9]* ended" "$server_log" && [ "$(server_threads)" -le "$base_threads" ] &&
           [ "$(server_fds)" -le "$base_fds" ]; then
            ended=1
            break
        fi
        sleep 0.1
    done
    if [ "$ended" != 1 ]; then
        why="5 s after the program's exit the server still holds its session (threads $(server_threads), were $base_threads: $(server_thread_names); descriptors $(server_fds), were $base_fds; a 'session N ended' line: $(grep -c "session [0-9]* ended" "$server_log"); processes under the server: $(pgrep -P "$server_pid" | tr '\n' ' '))"
    fi
fi

desc="$name via vcuda ($transport${prog_env[*]:+, ${prog_env[*]}}${server_args[*]:+, server ${server_args[*]}})"
if [ -n "$why" ]; then
    echo "FAIL $desc: $why, after ${elapsed_ms} ms"
    show_logs
    exit 1
fi
stop_server
cat "$prog_out"
echo "ok: $desc in ${elapsed_ms} ms"
exit 0
