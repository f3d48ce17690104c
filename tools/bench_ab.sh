#!/usr/bin/env bash
# Two builds' benchmarks taken in turns, for "no figure worse than before": runs tools/bench.sh for BASE and NEW
# alternately TURNS times (default 3; BASE first in odd turns, NEW first in even ones, so neither always runs
# on a warmer machine), keeps every table in OUT_DIR (bench_base_K.txt, bench_new_K.txt), then prints
# tools/bench_compare.py's medians and ranges of each figure's ratio to native, and the figures where NEW is
# worse beyond the ranges. bench.sh's own variables apply (BENCH_RUNS, default 2 here; BENCH_TORCH, default 0
# here: the PyTorch row takes minutes a run).
#
# Usage: tools/bench_ab.sh BASE_BUILD NEW_BUILD [TURNS] [OUT_DIR]    (OUT_DIR default: a new temporary folder)
set -u
if [ $# -lt 2 ] || [ "$1" = "-h" ] || [ "$1" = "--help" ]; then
    sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
fi
here=$(cd "$(dirname "$0")" && pwd)
base=$1 new=$2 turns=${3:-3}
out=${4:-$(mktemp -d)}
mkdir -p "$out" || exit 2
for b in "$base" "$new"; do
    [ -x "$b/tests/programs/vcuda_bench" ] || { echo "bench_ab: $b/tests/programs/vcuda_bench is missing" >&2; exit 2; }
done
case $turns in ''|*[!0-9]*) echo "bench_ab: TURNS must be a number" >&2; exit 2 ;; esac
for t in $(seq "$turns"); do
    order="base new"
    [ $((t % 2)) = 0 ] && order="new base"
    for v in $order; do
        dir=$base
        [ "$v" = new ] && dir=$new
        echo "bench_ab: turn $t, $v ($dir)" >&2
        BENCH_RUNS=${BENCH_RUNS:-2} BENCH_TORCH=${BENCH_TORCH:-0} "$here/bench.sh" "$dir" >"$out/bench_${v}_$t.txt" 2>&1 ||
            echo "bench_ab: bench.sh failed for $v in turn $t (see $out/bench_${v}_$t.txt)" >&2
    done
done
echo "tables in $out"
python3 "$here/bench_compare.py" "$out" base new
