#!/usr/bin/env bash
# The conformance runner's pytest plugin (conformance_plugin.py), on a suite of ten trivial tests:
# CONFORMANCE_MAX_TESTS keeps a stable subset, CONFORMANCE_ONLY_IDS keeps only the listed tests (with both, what
# both keep), CONFORMANCE_RESULTS gets one line per test phase. Usage: plugin_test.sh [PYTHON...] (the first
# interpreter that has pytest is used; tools/setup.sh installs Debian's python3-pytest).
set -u
here="$(cd "$(dirname "$0")" && pwd)"
py=""
for c in "$@" python3 /usr/bin/python3; do
    if "$c" -c 'import pytest' >/dev/null 2>&1; then py="$c"; break; fi
done
[ -n "$py" ] || { echo "plugin_test: no python3 with pytest (tools/setup.sh installs python3-pytest)"; exit 1; }
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
cat >"$tmp/test_a.py" <<'PY'
import pytest


@pytest.mark.parametrize("i", range(10))
def test_x(i):
    assert i >= 0
PY
fails=0
# run EXPECTED-LAST-LINE-START ENV...: pytest with the plugin; its summary line must start so
run() {
    local want="$1" got
    shift
    rm -f "$tmp/results"
    got="$(cd "$tmp" && env "$@" CONFORMANCE_RESULTS="$tmp/results" PYTHONPATH="$here" "$py" -m pytest \
        -p no:cacheprovider -p conformance_plugin -q test_a.py 2>&1 | tail -1)"
    case "$got" in
        "$want"*) echo "ok: $* -> $got" ;;
        *) echo "FAIL: $* -> '$got', want '$want...'"; fails=$((fails + 1)) ;;
    esac
}
called() { awk -F'\t' '$2 == "call" { print $3 }' "$tmp/results" | sort; }

run "10 passed"
[ "$(called | wc -l)" = 10 ] || { echo "FAIL: the results stream has $(called | wc -l) call lines, want 10"; fails=$((fails + 1)); }
run "4 passed, 6 deselected" CONFORMANCE_MAX_TESTS=4
subset="$(called)"
run "4 passed, 6 deselected" CONFORMANCE_MAX_TESTS=4
[ "$(called)" = "$subset" ] || { echo "FAIL: CONFORMANCE_MAX_TESTS chose other tests the second time"; fails=$((fails + 1)); }
printf 'test_a.py::test_x[3]\ntest_a.py::test_x[7]\n' >"$tmp/only"
run "2 passed, 8 deselected" CONFORMANCE_ONLY_IDS="$tmp/only"
[ "$(called)" = "$(sort "$tmp/only")" ] || { echo "FAIL: CONFORMANCE_ONLY_IDS ran $(called | tr '\n' ' ')"; fails=$((fails + 1)); }
both="$(comm -12 <(echo "$subset") <(sort "$tmp/only"))"
n=$(printf '%s' "$both" | grep -c .)
run "$([ "$n" -gt 0 ] && echo "$n passed, $((10 - n)) deselected" || echo "10 deselected")" \
    CONFORMANCE_MAX_TESTS=4 CONFORMANCE_ONLY_IDS="$tmp/only"
[ "$(called)" = "$both" ] || { echo "FAIL: both limits ran $(called | tr '\n' ' '), want $both"; fails=$((fails + 1)); }
[ "$fails" = 0 ] && echo "plugin_test: all checks passed" || echo "plugin_test: $fails check(s) failed"
[ "$fails" = 0 ]
