#!/usr/bin/env bash
# Installs what is missing, builds vcuda and its tests, and runs every test: `tools/test.sh`.
# The frame and transport tests run a second time under AddressSanitizer + UBSan.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc 2>/dev/null || echo 2)

tools/setup.sh
tools/check_format.sh
cmake --preset dev
cmake --build --preset dev -j "$jobs"
tools/check_tidy.sh
ctest --preset dev -j "$jobs" --timeout 900

cmake --preset asan
cmake --build --preset asan -j "$jobs" --target vcuda_unit_tests
ASAN_OPTIONS=detect_leaks=1:halt_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
  ctest --preset asan -R '^unit\.' -j "$jobs" --timeout 900
echo "tools/test.sh: all tests passed"
