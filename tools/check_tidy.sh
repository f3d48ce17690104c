#!/usr/bin/env bash
# Fails when clang-tidy (14, Debian bookworm's) finds anything with .clang-tidy's checks in the project's own
# sources: client/, server/, common/, mgmt/ and protocol/ (not tests, the software driver, nor generated code).
# Reads build/dev/compile_commands.json and the headers generated there: run it after the dev build. One
# clang-tidy per file, $(nproc) at once. `tools/check_tidy.sh FILE...` checks only those files.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v clang-tidy >/dev/null || { echo "check_tidy: clang-tidy is missing (tools/setup.sh installs it)" >&2; exit 2; }
[ -f build/dev/compile_commands.json ] || {
  echo "check_tidy: build/dev/compile_commands.json is missing (cmake --preset dev && cmake --build --preset dev)" >&2
  exit 2
}
if (($#)); then
  files=("$@")
else
  mapfile -t files < <(git ls-files 'client/*.cpp' 'server/*.cpp' 'common/*.cpp' 'mgmt/*.cpp' 'protocol/*.cpp' |
    grep -v '^mgmt/tests/')
fi
log=$(mktemp)
trap 'rm -f "$log"' EXIT
start=$SECONDS
# clang rejects one thing that GCC accepts: the client defines the driver's entry points `noexcept` (STYLE.md)
# where cuda.h, a system header, declares them without. That error, and the ambiguous calls to those entry
# points it leaves behind, are expected and left out below; they do not stop clang-tidy's checks
# (-ferror-limit=0: nor does the number of them).
rc=0
printf '%s\0' "${files[@]}" |
  xargs -0 -n1 -P"$(nproc 2>/dev/null || echo 2)" clang-tidy -p build/dev --quiet --extra-arg=-ferror-limit=0 \
    >"$log" 2>&1 || rc=$?
if ((rc >= 124)); then  # xargs: a clang-tidy crashed or could not run
  cat "$log" >&2
  echo "check_tidy: clang-tidy failed (xargs exit $rc)" >&2
  exit 2
fi
found=$(grep -E '^[^ ]+:[0-9]+:[0-9]+: (warning|error): ' "$log" |
  grep -Ev "error: (exception specification in declaration does not match previous declaration|call to 'cu[A-Za-z0-9_]+' is ambiguous)" |
  sort -u || true)
if [ -z "$found" ]; then
  echo "check_tidy: ${#files[@]} files clean ($((SECONDS - start)) s)"
  exit 0
fi
echo "$found" >&2
echo "check_tidy: clang-tidy found $(wc -l <<<"$found") thing(s) in ${#files[@]} files ($((SECONDS - start)) s); fix" \
  "them, or leave a check out in .clang-tidy with the reason" >&2
exit 1
