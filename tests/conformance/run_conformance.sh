#!/usr/bin/env bash
# External conformance suites: on the GPU machine, run each suite natively, then through vcuda over shared memory
# (a local vcuda-server on a Unix socket), then over TCP (the same server on 127.0.0.1:PORT), the three modes of
# one suite back to back, and print a table: per suite and mode, tests passed / failed / skipped / errors, and
# how many that pass natively do not pass through vcuda (listed per transport in regressions.MODE.txt).
#
# Usage: tests/conformance/run_conformance.sh BUILD_DIR SUITES_DIR [OUT_DIR]
#   BUILD_DIR   holds bin/vcuda-server, bin/vcuda and lib/vcuda/ (libcuda.so.1)
#   SUITES_DIR  the prepared suites (README.md here says how): samples/NAME/NAME (+ its data files, optional
#               `args`: one run per line), cupy/ (tests/ of CuPy), jax/ (tests/ of JAX), torch/test/ (PyTorch's
#               test files, optional), pylib/PKG/ (pure-Python test dependencies, used only when not installed)
#   OUT_DIR     outputs (default $CONFORMANCE_OUT, else $OUT/conformance, else /tmp/conformance):
#               SUITE.MODE.{log,results,xml,meta,outcomes,regressions}, regressions.MODE.txt, server.log,
#               summary.txt; torch also SUITE.MODE.{serial.log,serial.xml,isolated.log} and torch.root/ (its
#               pytest root: SUITES_DIR/torch/ mirrored by links, plus torch_wheel_tests.py)
# Environment:
#   CONFORMANCE_SUITES     suites to run (default "samples torch cupy jax")
#   CONFORMANCE_MODES      default "native shm tcp" (native always runs first: it is the reference)
#   CONFORMANCE_BUDGET     seconds for everything (default 480): each run's limit is its suite's share of what
#                          is left (weights: CONFORMANCE_WEIGHT_<suite>, default samples 1.5, torch 1.2, cupy 1.2,
#                          jax 0.8; CONFORMANCE_WEIGHT_<mode>: native 0.8, shm 1, tcp 1.2), capped by
#                          CONFORMANCE_TIMEOUT_<suite> when set
#   CONFORMANCE_MAX_TESTS_<suite>  pytest suites: run this many tests, picked by a hash of their ids (the same
#                          ones in every mode); 0 = all. Defaults: torch 400, cupy 2000, jax 300
#                          When the native run of a pytest suite is cut by its limit, the modes through vcuda
#                          run only the tests it reached (SUITE.native.reached): the others could not be compared
#   CONFORMANCE_PATHS_<suite>      pytest suites: the test paths (relative to the suite's folder; torch: to its
#                          run root, default torch_wheel_tests.py test/test_cuda.py test/test_cuda_sanitizer.py, the
#                          files under test/ when carried; their serialTest() tests run in a pass without xdist)
#   CONFORMANCE_ISOLATED_torch     torch files whose tests run one pytest process each (default, when carried:
#                          test/test_cuda_nvml_based_avail.py test/test_cuda_trace.py test/test_cuda_primary_ctx.py)
#   CONFORMANCE_K_<suite>          pytest suites: a -k expression
#   CONFORMANCE_M_<suite>          pytest suites: a -m expression (default for cupy: "not slow and not multi_gpu")
#   CONFORMANCE_WORKERS    pytest-xdist workers (default 4; 0 = no xdist)
#   CONFORMANCE_TEST_TIMEOUT  pytest-timeout per test, seconds (default 30; torch 60);
#                          CONFORMANCE_TEST_TIMEOUT_<suite> for one suite
#   CONFORMANCE_SAMPLES    sample names to run (default: every folder of SUITES_DIR/samples)
#   CONFORMANCE_SAMPLE_TIMEOUT  seconds per sample run (default 30); CONFORMANCE_SAMPLES_JOBS parallel (default 8)
#   CONFORMANCE_EXCEPTIONS the exceptions list (default tests/conformance/exceptions.txt)
#   CONFORMANCE_SERVER_ARGS  vcuda-server arguments beside its listeners (default `--isolation process`: each
#                          session in its own worker process, as every table in the README was measured; set
#                          it, even empty, to run sessions as threads, or e.g. `--driver BUILD/lib/libvcuda-softdriver.so`)
#   CONFORMANCE_DRY=1      print what would run (no GPU, no server needed) and stop
#   PYTHON                 the interpreter (default python3)
# Exit status: 0 when every test that passed natively passed through vcuda (the exceptions list aside) and the
# server never died; 1 otherwise; 2 for a usage error.
set -u

if [ $# -lt 2 ] || [ "$1" = "-h" ] || [ "$1" = "--help" ]; then
    awk 'NR > 1 && /^set -u/ { exit } NR > 1' "$0" | sed 's/^# \{0,1\}//'
    exit 2
fi
DRY="${CONFORMANCE_DRY:-0}"
HERE="$(cd "$(dirname "$0")" && pwd)"
if [ "$DRY" = 1 ] && [ ! -d "$1" ]; then BUILD="$1"; else
    BUILD="$(cd "$1" && pwd)" || { echo "run_conformance: no such build directory: $1" >&2; exit 2; }
fi
SUITES_DIR="$(cd "$2" && pwd)" || { echo "run_conformance: no such suites directory: $2" >&2; exit 2; }
OUTDIR="${3:-${CONFORMANCE_OUT:-${OUT:+$OUT/conformance}}}"
OUTDIR="${OUTDIR:-/tmp/conformance}"
mkdir -p "$OUTDIR" || { echo "run_conformance: cannot create $OUTDIR" >&2; exit 2; }
OUTDIR="$(cd "$OUTDIR" && pwd)"
PY="$(command -v "${PYTHON:-python3}")" || { echo "run_conformance: no ${PYTHON:-python3}" >&2; exit 2; }
SERVER_BIN="$BUILD/bin/vcuda-server"
VCUDA_BIN="$BUILD/bin/vcuda"
SOCK="/tmp/vcuda-conformance.$$.sock"
UNIX_ADDR="unix:$SOCK"
SERVER_LOG="$OUTDIR/server.log"
EXCEPTIONS="${CONFORMANCE_EXCEPTIONS:-$HERE/exceptions.txt}"
if [ "$DRY" != 1 ]; then
    for f in "$SERVER_BIN" "$VCUDA_BIN" "$BUILD/lib/vcuda/libcuda.so.1"; do
        [ -e "$f" ] || { echo "run_conformance: $f is missing" >&2; exit 2; }
    done
fi

read -r -a SUITES <<<"${CONFORMANCE_SUITES:-samples torch cupy jax}"
read -r -a REQ_MODES <<<"${CONFORMANCE_MODES:-native shm tcp}"
MODES=(native)
for m in "${REQ_MODES[@]}"; do
    case "$m" in
        native) ;;
        shm | tcp) MODES+=("$m") ;;
        *) echo "run_conformance: unknown mode $m (native, shm, tcp)" >&2; exit 2 ;;
    esac
done
for s in "${SUITES[@]}"; do
    case "$s" in samples | torch | cupy | jax) ;; *) echo "run_conformance: unknown suite $s" >&2; exit 2 ;; esac
done

BUDGET="${CONFORMANCE_BUDGET:-480}"
WORKERS="${CONFORMANCE_WORKERS:-4}"
TEST_TIMEOUT="${CONFORMANCE_TEST_TIMEOUT:-30}"
start=$(date +%s)
say() { echo "[conformance +$(( $(date +%s) - start ))s] $*"; }
getv() { local v="$1"; echo "${!v:-$2}"; }  # getv NAME DEFAULT

suite_weight() {
    case "$1" in samples) getv CONFORMANCE_WEIGHT_samples 1.5 ;; torch) getv CONFORMANCE_WEIGHT_torch 1.2 ;;
        cupy) getv CONFORMANCE_WEIGHT_cupy 1.2 ;; jax) getv CONFORMANCE_WEIGHT_jax 0.8 ;; esac
}
mode_weight() {  # runs through vcuda are given more time than the native one
    case "$1" in native) getv CONFORMANCE_WEIGHT_native 0.8 ;; shm) getv CONFORMANCE_WEIGHT_shm 1 ;;
        tcp) getv CONFORMANCE_WEIGHT_tcp 1.2 ;; esac
}
run_weight() { awk -v a="$(suite_weight "$1")" -v b="$(mode_weight "$2")" 'BEGIN { print a * b }'; }
# run_limit SUITE MODE: seconds for the next run: this run's share of what is left of the budget
runs_left_weight=0
for s in "${SUITES[@]}"; do
    for m in "${MODES[@]}"; do
        runs_left_weight=$(awk -v a="$runs_left_weight" -v w="$(run_weight "$s" "$m")" 'BEGIN { print a + w }')
    done
done
run_limit() {
    local w left cap lim
    w="$(run_weight "$1" "$2")"
    left=$(( BUDGET - ($(date +%s) - start) ))
    lim=$(awk -v l="$left" -v w="$w" -v t="$runs_left_weight" 'BEGIN { x = (t > 0) ? l * w / t : l; if (x < 10) x = 10; printf "%d", x }')
    cap="$(getv "CONFORMANCE_TIMEOUT_$1" "")"
    [ -n "$cap" ] && [ "$cap" -lt "$lim" ] && lim="$cap"
    echo "$lim"
}
spent_run() {  # the run of SUITE in MODE is over: its weight leaves the pool
    runs_left_weight=$(awk -v a="$runs_left_weight" -v w="$(run_weight "$1" "$2")" 'BEGIN { x = a - w; print (x < 0) ? 0 : x }')
}

# ------------------------------------------------------------------------------------------ Python paths
# The runner's plugin, and the carried pure-Python packages (pylib/PKG/PKG) that the interpreter lacks.
PYPATH="$HERE"
if [ -d "$SUITES_DIR/pylib" ]; then
    for d in "$SUITES_DIR"/pylib/*/; do
        pkg="$(basename "$d")"
        if [ "$DRY" = 1 ] || ! "$PY" -c "import $pkg" >/dev/null 2>&1; then
            PYPATH="$PYPATH:${d%/}"
            say "python: $pkg from $d (not installed)"
        fi
    done
fi
export PYTHONPATH="$PYPATH${PYTHONPATH:+:$PYTHONPATH}"
XDIST=()
PTIMEOUT_OPT=()  # (1) when pytest-timeout is there: each pytest suite gets --timeout (test_timeout SUITE)
if [ "$DRY" = 1 ] || "$PY" -c 'import xdist' >/dev/null 2>&1; then
    [ "$WORKERS" -gt 0 ] && XDIST=(-n "$WORKERS")
else
    say "pytest-xdist missing: tests run in one process"
fi
if [ "$DRY" = 1 ] || "$PY" -c 'import pytest_timeout' >/dev/null 2>&1; then
    PTIMEOUT_OPT=(1)
fi

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
server_alive() {
    [ -n "$server_pid" ] && kill -0 "$server_pid" 2>/dev/null &&
        [ "$(sed 's/.*) //' "/proc/$server_pid/stat" 2>/dev/null | cut -c1)" != Z ]
}
stop_server() {
    [ -n "$server_pid" ] || return 0
    if kill -0 "$server_pid" 2>/dev/null; then
        kill -TERM "$server_pid" 2>/dev/null
        for _ in $(seq 1 50); do kill -0 "$server_pid" 2>/dev/null || break; sleep 0.1; done
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
        echo "=== $(date '+%F %T') vcuda-server --listen $TCP_ADDR --listen $UNIX_ADDR" >>"$SERVER_LOG"
        # shellcheck disable=SC2086  # CONFORMANCE_SERVER_ARGS: words
        "$SERVER_BIN" --listen "$TCP_ADDR" --listen "$UNIX_ADDR" --log-level info ${CONFORMANCE_SERVER_ARGS---isolation process} \
            >>"$SERVER_LOG" 2>&1 &
        server_pid=$!
        for _ in $(seq 1 200); do
            server_alive || { wait "$server_pid" 2>/dev/null; server_pid=""; break; }
            if [ -S "$SOCK" ] && port_listening "$port"; then
                say "server up on $TCP_ADDR and $UNIX_ADDR (pid $server_pid; arguments: ${CONFORMANCE_SERVER_ARGS---isolation process})"
                return 0
            fi
            sleep 0.1
        done
        say "server did not come up (attempt $attempt); see $SERVER_LOG"
        stop_server
    done
    return 1
}
cleanup() { stop_server; rm -f "$SOCK"; }
trap cleanup EXIT
trap 'exit 130' INT TERM

server_deaths=0
notes=()
ensure_server() {  # before a vcuda run
    server_alive && return 0
    [ -n "$server_pid" ] && { notes+=("the server was gone before $1; restarted"); server_deaths=$((server_deaths + 1)); }
    start_server
}
check_server_after() {  # after a vcuda run: a run that kills the server is noted, the server restarted
    sleep 0.2
    if ! server_alive; then
        say "the server died under $1; restarting it"
        notes+=("the server died under $1 (see server.log)")
        server_deaths=$((server_deaths + 1))
        start_server
    fi
}
# set_prefix MODE: PREFIX, the command prefix that runs a program natively or through vcuda in MODE
PREFIX=()
set_prefix() {
    case "$1" in
        native) PREFIX=(env -u VCUDA_SERVER) ;;
        shm) PREFIX=("$VCUDA_BIN" run --server "$UNIX_ADDR" --) ;;
        tcp) PREFIX=("$VCUDA_BIN" run --server "${TCP_ADDR:-127.0.0.1:PORT}" --) ;;
    esac
}

# ------------------------------------------------------------------------------------------ the samples
sample_names() {
    if [ -n "${CONFORMANCE_SAMPLES:-}" ]; then
        echo "$CONFORMANCE_SAMPLES" | tr ' ' '\n' | awk NF
        return
    fi
    local d
    for d in "$SUITES_DIR"/samples/*/; do
        [ -x "$d$(basename "$d")" ] && basename "$d"
    done
}
SAMPLE_LIB_PATH=""
find_sample_libs() {  # the directories of the NVIDIA libraries the samples need (cuBLAS, cuFFT, NVRTC, ...)
    local missing
    missing="$(for n in $(sample_names); do ldd "$SUITES_DIR/samples/$n/$n" 2>/dev/null; done |
        awk '/=> not found/ { print $1 }' | grep -v '^libcuda\.so' | sort -u | tr '\n' ' ')"
    [ -n "$missing" ] || return 0
    SAMPLE_LIB_PATH="$("$PY" - "$missing" <<'EOF'
import glob, importlib.util, os, sys
want = sys.argv[1].split()
roots = []
try:
    import nvidia
    roots += list(nvidia.__path__)
except Exception:
    pass
spec = importlib.util.find_spec("torch")
if spec and spec.origin:
    roots.append(os.path.join(os.path.dirname(spec.origin), "lib"))
roots += sorted(glob.glob("/usr/local/cuda*/lib64")) + ["/usr/lib/x86_64-linux-gnu"]
dirs, found = [], set()
for root in roots:
    for dirpath, dirnames, filenames in os.walk(root):
        if dirpath.count(os.sep) - root.count(os.sep) > 4:
            dirnames[:] = []
            continue
        for lib in want:
            if lib not in found and lib in filenames:
                found.add(lib)
                if dirpath not in dirs:
                    dirs.append(dirpath)
print(":".join(dirs))
missing = [l for l in want if l not in found]
if missing:
    sys.stderr.write("run_conformance: libraries not found for the samples: %s\n" % " ".join(missing))
EOF
)"
    say "samples need: $missing-> ${SAMPLE_LIB_PATH:-(none found)}"
}

# one_sample MODE NAME IDX ARGS...: runs it in a scratch folder holding links to the sample's files; appends
# `OUTCOME<TAB>call<TAB>ID` to the results file of the mode.
one_sample() {
    local mode="$1" name="$2" idx="$3"
    shift 3
    local id="$name" work rc outcome lim="${CONFORMANCE_SAMPLE_TIMEOUT:-30}"
    [ "$idx" != 0 ] && id="${name}[$idx]"
    work="$OUTDIR/samples.$mode.work/$name.$idx"
    mkdir -p "$work"
    ln -sf "$SUITES_DIR/samples/$name"/* "$work"/ 2>/dev/null
    local log="$OUTDIR/samples.$mode.logs/$id.log"
    set_prefix "$mode"
    (
        cd "$work" || exit 99
        timeout -k 5 "$lim" env LD_LIBRARY_PATH="$SAMPLE_LIB_PATH${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
            VCUDA_LOG_FILE="$OUTDIR/samples.$mode.logs/$id.client.log" "${PREFIX[@]}" "./$name" "$@" </dev/null
    ) >"$log" 2>&1
    rc=$?
    if [ "$rc" = 0 ] && grep -q -E 'Test failed|TEST FAILED|Test FAILED|Result = FAIL|FAILED!' "$log"; then
        outcome=failed  # exits 0 but says it failed
    elif [ "$rc" = 0 ]; then
        outcome=passed
    elif [ "$rc" = 2 ] || grep -q -i 'waiv' "$log"; then
        outcome=skipped
    else
        outcome=failed
    fi
    echo "rc=$rc" >>"$log"
    printf '%s\tcall\t%s\n' "$outcome" "$id" >>"$OUTDIR/samples.$mode.results"
}

run_samples_mode() {  # run_samples_mode MODE LIMIT
    local mode="$1" limit="$2" deadline name idx line jobs="${CONFORMANCE_SAMPLES_JOBS:-8}"
    deadline=$(( $(date +%s) + limit ))
    rm -rf "$OUTDIR/samples.$mode.work" "$OUTDIR/samples.$mode.logs" "$OUTDIR/samples.$mode.results"
    mkdir -p "$OUTDIR/samples.$mode.logs"
    : >"$OUTDIR/samples.$mode.results"
    local -a argv pids=()
    for name in $(sample_names); do
        if [ ! -x "$SUITES_DIR/samples/$name/$name" ]; then
            printf 'error\tcall\t%s\n' "$name" >>"$OUTDIR/samples.$mode.results"
            continue
        fi
        local runs=()
        if [ -f "$SUITES_DIR/samples/$name/args" ]; then
            mapfile -t runs < <(grep -v '^#' "$SUITES_DIR/samples/$name/args")
        fi
        [ ${#runs[@]} -gt 0 ] || runs=("")
        idx=0
        for line in "${runs[@]}"; do
            [ ${#runs[@]} -gt 1 ] && idx=$((idx + 1))
            read -r -a argv <<<"$line"
            if [ "$(date +%s)" -ge "$deadline" ]; then
                say "samples ($mode): time limit reached; $name and later not run"
                break 2
            fi
            if [ "$DRY" = 1 ]; then
                set_prefix "$mode"
                echo "    (cd samples/$name && ${PREFIX[*]} ./$name ${argv[*]})"
                continue
            fi
            while :; do  # at most $jobs samples at once (the server is a background job too: not `wait -n`)
                local alive=() p
                for p in ${pids[@]+"${pids[@]}"}; do kill -0 "$p" 2>/dev/null && alive+=("$p"); done
                pids=(${alive[@]+"${alive[@]}"})
                [ ${#pids[@]} -lt "$jobs" ] && break
                sleep 0.05
            done
            one_sample "$mode" "$name" "$idx" ${argv[@]+"${argv[@]}"} &
            pids+=($!)
        done
    done
    for p in ${pids[@]+"${pids[@]}"}; do wait "$p" 2>/dev/null; done
    rm -rf "$OUTDIR/samples.$mode.work"  # links and the samples' own output files: not outputs of the run
}

# ------------------------------------------------------------------------------------------ pytest suites
# torch: the run root is OUTDIR/torch.root, a mirror of SUITES_DIR/torch/ (links to its entries: test/ with
# PyTorch's test files when carried) plus a link to torch_wheel_tests.py and a pytest.ini of its own, so that pytest's
# rootdir is that folder and the test ids read test/test_cuda.py::TestCuda::test_x and torch_wheel_tests.py::...
# Its conftest.py (torch_conftest.py) supplies names the carried files import that the installed wheel lacks.
TORCH_ROOT="$OUTDIR/torch.root"
prepare_torch_root() {
    local e
    rm -rf "$TORCH_ROOT"
    mkdir -p "$TORCH_ROOT"
    if [ -d "$SUITES_DIR/torch" ]; then
        for e in "$SUITES_DIR"/torch/*; do [ -e "$e" ] && ln -s "$e" "$TORCH_ROOT/"; done
    fi
    ln -sf "$HERE/torch_wheel_tests.py" "$TORCH_ROOT/torch_wheel_tests.py"
    ln -sf "$HERE/torch_conftest.py" "$TORCH_ROOT/conftest.py"  # names the wheel lacks (torch_conftest.py)
    [ -e "$TORCH_ROOT/pytest.ini" ] || printf '[pytest]\n' >"$TORCH_ROOT/pytest.ini"
}
torch_carried() {  # torch_carried FILE...: those of PyTorch's test files that SUITES_DIR/torch/test holds, as test/FILE
    local f
    for f in "$@"; do [ -f "$SUITES_DIR/torch/test/$f" ] && echo "test/$f"; done
}
suite_paths() {
    local v
    v="$(getv "CONFORMANCE_PATHS_$1" "")"
    if [ -n "$v" ]; then echo "$v"; return; fi
    case "$1" in
        cupy) echo "tests/cupy_tests/core_tests tests/cupy_tests/cuda_tests tests/cupy_tests/random_tests" \
                   "tests/cupy_tests/linalg_tests tests/cupy_tests/fft_tests tests/cupyx_tests/scipy_tests/sparse_tests" ;;
        jax) echo "tests/api_test.py tests/lax_test.py tests/random_test.py tests/fft_test.py tests/linalg_test.py" ;;
        torch) echo "torch_wheel_tests.py $(torch_carried test_cuda.py test_cuda_sanitizer.py | tr '\n' ' ')" ;;
    esac
}
# torch's files whose tests need a fresh process each (upstream's run_test.py runs them with --subprocess): here
# each test is its own pytest process. CONFORMANCE_ISOLATED_torch (paths relative to the run root) replaces the list;
# set and empty, none.
torch_isolated_paths() {
    if [ "${CONFORMANCE_ISOLATED_torch+set}" = set ]; then echo "$CONFORMANCE_ISOLATED_torch"; return; fi
    torch_carried test_cuda_nvml_based_avail.py test_cuda_trace.py test_cuda_primary_ctx.py | tr '\n' ' '
}
suite_dir() {  # where pytest runs (its rootdir, with the suite's conftest.py and pyproject.toml)
    case "$1" in
        torch) echo "$TORCH_ROOT" ;;
        *) echo "$SUITES_DIR/$1" ;;
    esac
}
max_tests() {
    case "$1" in torch) getv CONFORMANCE_MAX_TESTS_torch 400 ;; cupy) getv CONFORMANCE_MAX_TESTS_cupy 2000 ;;
        jax) getv CONFORMANCE_MAX_TESTS_jax 300 ;; esac
}
default_marks() {  # the default -m expression
    case "$1" in cupy) echo "not slow and not multi_gpu" ;; esac
}
test_timeout() {  # pytest-timeout per test for SUITE
    case "$1" in torch) getv CONFORMANCE_TEST_TIMEOUT_torch "${CONFORMANCE_TEST_TIMEOUT:-60}" ;;
        *) getv "CONFORMANCE_TEST_TIMEOUT_$1" "$TEST_TIMEOUT" ;; esac
}
suite_env() {  # the suite's environment, NAME=VALUE words
    case "$1" in
        jax) echo "XLA_PYTHON_CLIENT_PREALLOCATE=false JAX_NUM_GENERATED_CASES=${JAX_NUM_GENERATED_CASES:-2}" \
                  "JAX_PLATFORMS=cuda,cpu" ;;
        cupy) echo "CUPY_TEST_GPU_LIMIT=1" ;;
        torch) echo "PYTORCH_TEST_WITH_SLOW=0 PYTORCH_TESTING_DEVICE_ONLY_FOR=cuda" ;;
    esac
}
and_marks() {  # and_marks EXPR1 EXPR2: their conjunction (either may be empty)
    if [ -n "$1" ] && [ -n "$2" ]; then echo "($1) and ($2)"; else echo "$1$2"; fi
}

shown() { local d="${1#"$OUTDIR"/}"; echo "${d#"$SUITES_DIR"/}"; }  # a folder as the dry run shows it

# one_pytest LABEL LIMIT MAX_TESTS XML ARGS...: one pytest session of the current suite and mode (globals: suite,
# dir, base, envs, kargs, PREFIX) in dir, stopped by SIGINT at LIMIT seconds; its output appended to LOG_FILE;
# sets $pass_rc. LABEL is for the dry run.
LOG_FILE=""
ONLY_IDS=""  # the tests the native run reached, for the modes after it, when its time ran out (else empty)
one_pytest() {
    local label="$1" lim="$2" max="$3" xml="$4"
    shift 4
    local -a cmd=("$PY" -m pytest -p no:cacheprovider -p no:benchmark -p conformance_plugin -q -rN --no-header
        --tb=short --continue-on-collection-errors)
    [ -n "$xml" ] && cmd+=(--junitxml="$xml")
    cmd+=("$@")
    if [ "$DRY" = 1 ]; then
        echo "    [$label] (cd $(shown "$dir") && CONFORMANCE_MAX_TESTS=$max ${envs[*]} timeout -s INT $lim" \
             "${PREFIX[*]} $(printf '%q ' "${cmd[@]}"))"
        pass_rc=0
        return
    fi
    # SIGINT first: pytest ends the session and still writes its JUnit file; the stream file has the rest
    (cd "$dir" && timeout -s INT -k 20 "$lim" env CONFORMANCE_MAX_TESTS="$max" CONFORMANCE_RESULTS="$base.results" \
        CONFORMANCE_ONLY_IDS="$ONLY_IDS" \
        VCUDA_LOG_FILE="$base.client.log" ${envs[@]+"${envs[@]}"} "${PREFIX[@]}" "${cmd[@]}") >>"$LOG_FILE" 2>&1 </dev/null
    pass_rc=$?
}

# isolated_pass LIMIT PATHS...: each test of PATHS in a pytest process of its own (the ids collected natively, once
# per runner invocation), CONFORMANCE_WORKERS at a time; none started after LIMIT seconds, none left running 30 s
# after that (a test stopped there counts as not reached)
isolated_pass() {
    local lim="$1" deadline ids="$OUTDIR/torch.isolated.ids" id n=0 jobs="$WORKERS" per
    shift
    deadline=$(( $(date +%s) + lim ))
    [ "$jobs" -gt 0 ] || jobs=1
    per=$(( $(test_timeout torch) + 30 ))
    local -a pids=() to=()
    [ "${#PTIMEOUT_OPT[@]}" -gt 0 ] && to=(--timeout "$(test_timeout torch)")
    if [ "$DRY" = 1 ]; then
        [ "$mode" = native ] &&
            echo "    [isolated] the ids, once: (cd $(shown "$dir") && ${envs[*]} ${PREFIX[*]} $PY -m pytest --collect-only" \
                 "-q ${kargs[*]} $*)"
        echo "    [isolated] each test ID, $jobs at once, none started after ${lim}s:"
        echo "        (cd $(shown "$dir") && CONFORMANCE_MAX_TESTS=0 ${envs[*]} timeout -s INT $per ${PREFIX[*]}" \
             "$PY -m pytest -p no:cacheprovider -p no:benchmark -p conformance_plugin -q -rN --no-header --tb=short" \
             "${to[*]} ID)"
        return
    fi
    if [ ! -f "$ids" ]; then
        # in the first mode, native: the same ids for every mode
        (cd "$dir" && timeout -k 10 120 env ${envs[@]+"${envs[@]}"} "${PREFIX[@]}" "$PY" -m pytest -p no:cacheprovider \
            -p no:benchmark --collect-only -q ${kargs[@]+"${kargs[@]}"} "$@") 2>&1 </dev/null | grep '::' >"$ids"
        say "torch: $(wc -l <"$ids") tests that need a fresh process each ($*)"
    fi
    while read -r id; do
        [ -n "$id" ] || continue
        [ "$(date +%s)" -lt "$deadline" ] || { say "torch ($mode): isolated tests: time limit reached after $n"; break; }
        while :; do
            local alive=() p
            for p in ${pids[@]+"${pids[@]}"}; do kill -0 "$p" 2>/dev/null && alive+=("$p"); done
            pids=(${alive[@]+"${alive[@]}"})
            [ ${#pids[@]} -lt "$jobs" ] && break
            sleep 0.1
        done
        local this=$(( deadline + 30 - $(date +%s) ))
        [ "$this" -lt "$per" ] || this="$per"
        (cd "$dir" && timeout -s INT -k 10 "$this" env CONFORMANCE_MAX_TESTS=0 CONFORMANCE_RESULTS="$base.results" \
            VCUDA_LOG_FILE="$base.client.log" ${envs[@]+"${envs[@]}"} "${PREFIX[@]}" "$PY" -m pytest -p no:cacheprovider \
            -p no:benchmark -p conformance_plugin -q -rN --no-header --tb=short ${to[@]+"${to[@]}"} "$id") \
            >"$base.isolated.$n.log" 2>&1 </dev/null &
        pids+=($!)
        n=$((n + 1))
    done <"$ids"
    for p in ${pids[@]+"${pids[@]}"}; do wait "$p" 2>/dev/null; done
    for p in $(seq 0 $((n - 1))); do cat "$base.isolated.$p.log"; rm -f "$base.isolated.$p.log"; done >>"$base.isolated.log"
}

run_pytest_mode() {  # run_pytest_mode SUITE MODE LIMIT; sets $run_rc and $run_passes
    local suite="$1" mode="$2" limit="$3" dir kexpr mexpr t0 left
    base="$OUTDIR/$1.$2"
    local -a paths kargs envs serial_paths=() iso_paths=()
    dir="$(suite_dir "$suite")"
    read -r -a paths <<<"$(suite_paths "$suite")"
    read -r -a envs <<<"$(suite_env "$suite")"
    kexpr="$(getv "CONFORMANCE_K_$suite" "")"
    kargs=()
    [ -n "$kexpr" ] && kargs=(-k "$kexpr")
    mexpr="$(getv "CONFORMANCE_M_$suite" "$(default_marks "$suite")")"
    local -a to=()
    [ "${#PTIMEOUT_OPT[@]}" -gt 0 ] && to=(--timeout "$(test_timeout "$suite")")
    rm -f "$base.results" "$base.xml" "$base.serial.xml" "$base.log" "$base.serial.log" "$base.isolated.log"
    set_prefix "$mode"
    run_passes=""
    if [ "$suite" = torch ]; then
        # PyTorch's own files: tests marked serial (serialTest(): large allocations, memory fractions, allocator
        # settings) run in a pass of their own without xdist, as upstream runs them; the others in parallel; the
        # fresh-process files one process per test. Shares of the limit: isolated 15 %, serial 25 %, the rest
        # (with what they leave) to the parallel pass.
        local p
        for p in "${paths[@]}"; do case "$p" in test/*) serial_paths+=("$p") ;; esac; done
        read -r -a iso_paths <<<"$(torch_isolated_paths)"
        t0=$(date +%s)
        if [ ${#iso_paths[@]} -gt 0 ]; then
            LOG_FILE="$base.isolated.log"
            isolated_pass $(( limit * 15 / 100 > 10 ? limit * 15 / 100 : 10 )) "${iso_paths[@]}"
            run_passes="isolated:$(( $(date +%s) - t0 ))s"
        fi
        if [ ${#serial_paths[@]} -gt 0 ]; then
            left=$(( limit - ($(date +%s) - t0) ))
            [ "$left" -lt $(( limit * 25 / 100 )) ] || left=$(( limit * 25 / 100 ))
            if [ "$left" -ge 10 ]; then
                LOG_FILE="$base.serial.log"
                one_pytest serial "$left" 0 "$base.serial.xml" ${to[@]+"${to[@]}"} ${kargs[@]+"${kargs[@]}"} \
                    -m "$(and_marks "$mexpr" serial)" "${serial_paths[@]}"
                run_passes="$run_passes serial:rc=$pass_rc"
            else
                run_passes="$run_passes serial:no-time"
            fi
            mexpr="$(and_marks "$mexpr" "not serial")"
        fi
        left=$(( limit - ($(date +%s) - t0) ))
        [ "$left" -ge 10 ] || left=10
        limit="$left"
    fi
    [ -n "$mexpr" ] && kargs+=(-m "$mexpr")
    LOG_FILE="$base.log"
    one_pytest parallel "$limit" "$(max_tests "$suite")" "$base.xml" ${XDIST[@]+"${XDIST[@]}"} ${to[@]+"${to[@]}"} \
        ${kargs[@]+"${kargs[@]}"} "${paths[@]}"
    run_rc=$pass_rc
}

# ------------------------------------------------------------------------------------------ the matrix
if [ "$DRY" != 1 ]; then
    say "GPU: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1)"
    say "python: $PY; $("$PY" -c '
import importlib.metadata as m
out = []
for d in ("torch", "cupy-cuda13x", "cupy-cuda12x", "jax", "jaxlib", "pytest", "pytest-xdist", "pytest-timeout"):
    try: out.append(d + " " + m.version(d))
    except Exception: pass
print(", ".join(out))' 2>/dev/null)"
fi
say "build: $BUILD; suites: $SUITES_DIR; outputs: $OUTDIR; budget ${BUDGET}s; suites: ${SUITES[*]}; modes: ${MODES[*]}"
if [ "$DRY" != 1 ]; then
    if ! start_server; then
        tail -20 "$SERVER_LOG"
        echo "CONFORMANCE: vcuda-server did not start"
        exit 1
    fi
fi
for suite in "${SUITES[@]}"; do
    if [ "$suite" = samples ]; then
        [ -d "$SUITES_DIR/samples" ] || { say "samples: no $SUITES_DIR/samples; skipped"; continue; }
        [ "$DRY" = 1 ] || find_sample_libs
    elif [ "$DRY" != 1 ] && ! "$PY" -c 'import pytest' >/dev/null 2>&1; then
        say "$suite: $PY has no pytest; skipped"
        continue
    elif [ ! -d "$(suite_dir "$suite")" ] && [ "$suite" != torch ]; then
        say "$suite: no $(suite_dir "$suite"); skipped"
        continue
    fi
    if [ "$suite" = torch ]; then
        prepare_torch_root
        rm -f "$OUTDIR/torch.isolated.ids"
        say "torch: run root $TORCH_ROOT; parallel and serial: $(suite_paths torch); one process per test:" \
            "$(torch_isolated_paths)"
        if [ "$DRY" != 1 ] && [ -f "$SUITES_DIR/torch/test/test_cuda.py" ] && ! "$PY" -c 'import psutil' >/dev/null 2>&1; then
            say "torch: $PY has no psutil, which test/test_cuda.py imports: that file will not be collected" \
                "(an error in the table); install psutil to run it"
            notes+=("torch: no psutil, test/test_cuda.py not collected")
        fi
    fi
    ONLY_IDS=""
    for mode in "${MODES[@]}"; do
        limit="$(run_limit "$suite" "$mode")"
        say "$suite ($mode): limit ${limit}s"
        t0=$(date +%s)
        [ "$mode" != native ] && [ "$DRY" != 1 ] && ensure_server "$suite ($mode)"
        status="done"
        run_passes=""
        if [ "$suite" = samples ]; then
            run_samples_mode "$mode" "$limit"
            [ $(( $(date +%s) - t0 )) -ge "$limit" ] && status=TIMEOUT
        else
            run_pytest_mode "$suite" "$mode" "$limit"
            # pytest: 0 all passed, 1 some failed, 2 interrupted, 3 internal error, 4 usage, 5 nothing collected
            case "$run_rc" in 124 | 137 | 130) status=TIMEOUT ;; 0 | 1) ;; 2) status=interrupted ;;
                5) status="no-tests" ;; *) status="rc=$run_rc" ;; esac
        fi
        [ "$mode" != native ] && [ "$DRY" != 1 ] && check_server_after "$suite ($mode)"
        spent_run "$suite" "$mode"
        secs=$(( $(date +%s) - t0 ))
        printf 'seconds=%s\nstatus=%s\nlimit=%s\npasses=%s\n' "$secs" "$status" "$limit" "${run_passes# }" \
            >"$OUTDIR/$suite.$mode.meta"
        # A native pytest run cut by its limit: the modes through vcuda run only the tests it reached (the
        # others could not be compared), so their time goes to what counts.
        if [ "$mode" = native ] && [ "$status" = TIMEOUT ] && [ "$suite" != samples ] && [ "$DRY" != 1 ]; then
            ONLY_IDS="$OUTDIR/$suite.native.reached"
            awk -F'\t' '$2 != "collect" { print $3 }' "$OUTDIR/$suite.native.results" 2>/dev/null | sort -u >"$ONLY_IDS"
            say "$suite: the native run reached $(wc -l <"$ONLY_IDS") tests before its limit; the modes through" \
                "vcuda run those ($(shown "$ONLY_IDS"))"
        fi
        [ "$DRY" = 1 ] || say "$suite ($mode): $status in ${secs}s${run_passes:+ (${run_passes# }, then the parallel pass)};" \
            "$(tail -1 "$OUTDIR/$suite.$mode.log" 2>/dev/null | cut -c1-150)"
    done
done
[ "$DRY" = 1 ] && { say "dry run: nothing was run"; exit 0; }
stop_server

# ------------------------------------------------------------------------------------------ the summary
{
    echo
    "$PY" "$HERE/conformance_results.py" report "$OUTDIR" "${SUITES[*]}" "${MODES[*]}" "$EXCEPTIONS"
    for note in ${notes[@]+"${notes[@]}"}; do echo "note: $note"; done
    for m in "${MODES[@]:1}"; do
        if [ -s "$OUTDIR/regressions.$m.txt" ]; then
            echo "--- first tests that pass natively but not through vcuda ($m):"
            head -25 "$OUTDIR/regressions.$m.txt" | sed 's/^/    /'
        fi
    done
    echo "server deaths: $server_deaths; wall time: $(( $(date +%s) - start )) s; outputs in $OUTDIR"
} | tee "$OUTDIR/summary.txt"

lost="$(for m in "${MODES[@]:1}"; do grep -v '(exception' "$OUTDIR/regressions.$m.txt" 2>/dev/null; done | wc -l)"
[ "$lost" = 0 ] && [ "$server_deaths" = 0 ]
