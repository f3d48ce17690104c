#!/usr/bin/env bash
# Runs the micro-benchmark natively and through vcuda (TCP loopback and Unix socket) in one go, on a machine
# with a GPU, and prints a table with the ratio to native: tools/bench.sh BUILD_DIR
set -u
build=$(cd "${1:?usage: tools/bench.sh BUILD_DIR}" && pwd)
bench=$build/tests/programs/vcuda_bench
tmp=$(mktemp -d)
port=$((20000 + RANDOM % 20000))
"$build/bin/vcuda-server" --listen 127.0.0.1:$port --listen unix:$tmp/s.sock --log-level warn 2>"$tmp/server.log" &
server=$!
for i in $(seq 50); do [ -S "$tmp/s.sock" ] && break; sleep 0.1; done
"$bench" > "$tmp/native" 2>&1
LD_LIBRARY_PATH=$build/lib/vcuda VCUDA_SERVER=127.0.0.1:$port "$bench" > "$tmp/tcp" 2>&1
LD_LIBRARY_PATH=$build/lib/vcuda VCUDA_SERVER=unix:$tmp/s.sock "$bench" > "$tmp/unix" 2>&1
kill $server 2>/dev/null; wait $server 2>/dev/null
printf "%-28s %12s %12s %8s %12s %8s\n" figure native tcp ratio unix ratio
for m in $(awk '/^metric/ {print $2}' "$tmp/native"); do
  n=$(awk -v m=$m '$1=="metric" && $2==m {print $3}' "$tmp/native")
  u=$(awk -v m=$m '$1=="metric" && $2==m {print $4}' "$tmp/native")
  t=$(awk -v m=$m '$1=="metric" && $2==m {print $3}' "$tmp/tcp")
  x=$(awk -v m=$m '$1=="metric" && $2==m {print $3}' "$tmp/unix")
  printf "%-28s %9s %-2s %9s %-2s %7s %9s %-2s %7s\n" "$m" "$n" "${u:0:2}" "${t:--}" "${u:0:2}" \
    "$(awk -v a="$t" -v b="$n" 'BEGIN{if(a==""||b==0)print "-"; else printf "%.2fx", a/b}')" "${x:--}" "${u:0:2}" \
    "$(awk -v a="$x" -v b="$n" 'BEGIN{if(a==""||b==0)print "-"; else printf "%.2fx", a/b}')"
done
grep -h "FAIL" "$tmp"/native "$tmp"/tcp "$tmp"/unix
rm -rf "$tmp"
