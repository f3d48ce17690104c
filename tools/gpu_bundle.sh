#!/usr/bin/env bash
# Copies what the GPU suite needs from a build tree into a small, stripped bundle with the same layout
# (bin/, lib/vcuda/, tests/programs/, tests/tls/), to carry to a GPU machine: tools/gpu_bundle.sh BUILD_DIR OUT_DIR
set -euo pipefail
build=${1:?usage: tools/gpu_bundle.sh BUILD_DIR OUT_DIR}
out=${2:?usage: tools/gpu_bundle.sh BUILD_DIR OUT_DIR}
rm -rf "$out"
mkdir -p "$out/bin" "$out/lib/vcuda" "$out/tests/programs"
for b in vcuda-server vcuda vcuda-mgmt; do
  [ -f "$build/bin/$b" ] && strip -o "$out/bin/$b" "$build/bin/$b"
done
for l in "$build"/lib/vcuda/*.so.1; do strip -o "$out/lib/vcuda/$(basename "$l")" "$l"; done
cp "$build/lib/vcuda/private_table_id" "$out/lib/vcuda/" 2>/dev/null || true
find "$build/tests/programs" -maxdepth 1 -type f -perm -u+x -exec cp -a {} "$out/tests/programs/" \;
cp -a "$build"/tests/programs/libcudart.so.13* "$out/tests/programs/" 2>/dev/null || true
cp -a "$build"/tests/programs/libcupti.so.13 "$out/tests/programs/" 2>/dev/null || true  # for trace_a094
# Throw-away TLS certificates for tools/bench.sh's TCP+TLS column.
if [ -x "$build/tests/tls/vcuda_test_certs" ]; then
  mkdir -p "$out/tests/tls"
  strip -o "$out/tests/tls/vcuda_test_certs" "$build/tests/tls/vcuda_test_certs"
fi
du -sh "$out"
