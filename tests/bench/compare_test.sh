#!/usr/bin/env bash
# tools/bench_compare.py on tables measured on the H200 (session 22: 37fa483 as base, 42e98a8 as new, four turns):
# no figure worse beyond the ranges; then the same with one figure of NEW made 10x slower, which it must name.
set -u
py=${1:-python3}
here=$(cd "$(dirname "$0")" && pwd)
tool=$here/../../tools/bench_compare.py
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL bench_compare: $*"; exit 1; }
out=$("$py" "$tool" "$here/compare_fixture") || fail "exit status $?"
grep -q "^0 figure(s) where new is worse" <<<"$out" || fail "the measured tables: $(tail -3 <<<"$out")"
grep -qE "^htod_4KiB +us +shm" <<<"$out" || fail "no row for htod_4KiB over shm"
cp "$here"/compare_fixture/*.txt "$tmp"/
# htod_4KiB's shm ratio (the last column) made 10x in both of NEW's tables.
for f in "$tmp"/bench_new_*.txt; do
    awk '$1 == "htod_4KiB" { $NF = sprintf("%.2fx", $NF * 10) } { print }' "$f" >"$f.x" && mv "$f.x" "$f"
done
out=$("$py" "$tool" "$tmp") || fail "exit status $?"
grep -q "^1 figure(s) where new is worse" <<<"$out" || fail "a figure made 10x worse: $(tail -3 <<<"$out")"
grep -q "htod_4KiB (us, shm)" <<<"$out" || fail "it did not name htod_4KiB over shm"
"$py" "$tool" "$tmp/none" >/dev/null 2>&1 && fail "no tables must exit 2"
echo "PASS bench_compare"
