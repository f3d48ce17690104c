#!/usr/bin/env bash
# The performance benchmark, on a machine with a GPU: runs tests/bench's vcuda_bench natively and through vcuda
# over TCP loopback, over TCP loopback with TLS (a second server, with throw-away certificates made by
# BUILD/tests/tls/vcuda_test_certs; without that tool the column stays "-"), over the Unix socket alone
# (VCUDA_SHM=0) and over shared-memory rings (the default on one host), then a PyTorch training step the same
# ways when PyTorch is installed, and prints one table with each figure's ratio to native (for GB/s, higher is
# better; for µs and ms, lower). The modes take turns, BENCH_RUNS times (default 3): each figure is the median
# of its runs, and the range of every figure follows the table.
#
# Usage: tools/bench.sh BUILD_DIR        (BENCH_TORCH=0 leaves the PyTorch row out; BENCH_RUNS=N)
set -u
if [ $# -lt 1 ] || [ "$1" = "-h" ] || [ "$1" = "--help" ]; then
    sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
fi
build=$(cd "$1" && pwd) || exit 2
here=$(cd "$(dirname "$0")/.." && pwd)
bench=$build/tests/programs/vcuda_bench
[ -x "$bench" ] || { echo "bench: $bench is missing (build the vcuda_test_programs target)" >&2; exit 2; }
tmp=$(mktemp -d)
port=$((20000 + RANDOM % 20000))
"$build/bin/vcuda-server" --listen 127.0.0.1:$port --listen unix:$tmp/s.sock --log-level warn 2>"$tmp/server.log" &
server=$!
for _ in $(seq 50); do [ -S "$tmp/s.sock" ] && break; sleep 0.1; done
# TCP+TLS: the same server options with a certificate; the client trusts its CA.
tls_port=$((port + 1))
tls_server=""
if [ -x "$build/tests/tls/vcuda_test_certs" ] && "$build/tests/tls/vcuda_test_certs" "$tmp/certs"; then
    "$build/bin/vcuda-server" --listen 127.0.0.1:$tls_port --tls-cert "$tmp/certs/server.pem" \
        --tls-key "$tmp/certs/server.key" --log-level warn 2>"$tmp/server-tls.log" &
    tls_server=$!
    sleep 1
else
    echo "bench: $build/tests/tls/vcuda_test_certs is missing: no TCP+TLS column" >&2
fi

modes=(native tcp unix shm)
[ -n "$tls_server" ] && modes=(native tcp tls unix shm)
via() {  # via MODE CMD...: runs CMD natively or through vcuda over MODE
    local mode=$1; shift
    case $mode in
        native) env -u VCUDA_SERVER "$@" ;;
        tcp) LD_LIBRARY_PATH=$build/lib/vcuda VCUDA_SERVER=127.0.0.1:$port "$@" ;;
        tls) LD_LIBRARY_PATH=$build/lib/vcuda VCUDA_SERVER=127.0.0.1:$tls_port VCUDA_TLS_CA=$tmp/certs/ca.pem "$@" ;;
        unix) LD_LIBRARY_PATH=$build/lib/vcuda VCUDA_SERVER=unix:$tmp/s.sock VCUDA_SHM=0 "$@" ;;
        shm) LD_LIBRARY_PATH=$build/lib/vcuda VCUDA_SERVER=unix:$tmp/s.sock "$@" ;;
    esac
}
runs=${BENCH_RUNS:-3}
table_id=""
[ -f "$build/lib/vcuda/private_table_id" ] && table_id=$(tr -d ' \t\r\n' <"$build/lib/vcuda/private_table_id")
torch=0
[ "${BENCH_TORCH:-1}" = 1 ] && python3 -c "import torch" 2>/dev/null && torch=1
# Each run: every mode in turn, so that a noisy spell of the machine falls on all of them alike.
for r in $(seq "$runs"); do
    for m in "${modes[@]}"; do via "$m" "$bench" >>"$tmp/$m" 2>&1; done
    [ $torch = 1 ] || continue
    for m in "${modes[@]}"; do
        out=$(via "$m" env VCUDA_PRIVATE_TABLE_ID="$table_id" timeout 300 \
              python3 "$here/tests/gpu/frameworks/torch_train.py" step_time 2>>"$tmp/torch.err")
        step=$(sed -n 's/^info: step_ms=\([^ ]*\).*/\1/p' <<<"$out" | tail -1)
        trips=$(sed -n 's/^info: sync_round_trips_per_step=\([^ ]*\).*/\1/p' <<<"$out" | tail -1)
        [ -n "$step" ] && echo "metric torch_training_step $step ms" >>"$tmp/$m"
        [ -n "$trips" ] && [ "$m" != native ] && echo "trips $trips" >>"$tmp/$m"
    done
done
kill $server $tls_server 2>/dev/null; wait $server $tls_server 2>/dev/null
touch "$tmp/tls"  # (no TLS run: its column prints "-")

# A figure's runs in mode $1, sorted; value: their median.
runs_of() { awk -v m="$2" '$1=="metric" && $2==m {print $3}' "$tmp/$1" | sort -g; }
median() { awk '{v[NR]=$1} END{if(NR) print v[int((NR+1)/2)]}'; }  # of sorted numbers on stdin
value() { runs_of "$1" "$2" | median; }
range() { runs_of "$1" "$2" | awk 'NR==1{lo=$1} {hi=$1} END{if(NR) printf "%s-%s", lo, hi}'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN{if(a==""||b==""||b+0==0)print "-"; else printf "%.2fx", a/b}'; }
figures=$(awk '$1=="metric" {print $2}' "$tmp/native" | awk '!seen[$0]++')
echo "median of $runs runs per mode"
printf "%-28s %-5s %10s %10s %7s %10s %7s %10s %7s %10s %7s\n" figure unit native tcp ratio tcp+tls ratio unix ratio \
    shm ratio
for m in $figures; do
    n=$(value native "$m")
    unit=$(awk -v m="$m" '$1=="metric" && $2==m {print $4; exit}' "$tmp/native")
    line=$(printf "%-28s %-5s %10s" "$m" "$unit" "$n")
    for v in tcp tls unix shm; do
        x=$(value "$v" "$m")
        line="$line $(printf "%10s %7s" "${x:--}" "$(ratio "$x" "$n")")"
    done
    echo "$line"
done
if [ "$runs" -gt 1 ]; then
    echo
    echo "range over the runs (min-max)"
    printf "%-28s %18s %18s %18s %18s %18s\n" figure native tcp tcp+tls unix shm
    for m in $figures; do
        line=$(printf "%-28s" "$m")
        for v in native tcp tls unix shm; do line="$line $(printf "%18s" "$(range "$v" "$m")")"; done
        echo "$line"
    done
fi
for v in tcp tls unix shm; do
    t=$(awk '$1=="trips" {print $2}' "$tmp/$v" | sort -g | median)
    [ -n "$t" ] && echo "torch step, sync round trips per step ($v): $t"
done
grep -h "FAIL" "$tmp"/native "$tmp"/tcp "$tmp"/unix "$tmp"/shm "$tmp"/tls 2>/dev/null
[ -s "$tmp/torch.err" ] && grep -iE "error|Traceback" "$tmp/torch.err" | head -5
rm -rf "$tmp"
