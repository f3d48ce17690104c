# Sourced by the scripts that compare what a program prints through vcuda with its native or unmoved run
# (tests/integration/move_session.sh, tests/integration/manager_moves.sh, tests/gpu/move_suite.sh).
# shellcheck shell=bash

# normalize FILE: what a run printed, without what differs from run to run (times, rates, addresses the driver
# picks) and vcuda's own log lines.
normalize() { grep -v -i -E 'ms\b|µs|us\b|GB/s|MB/s|time|elapsed|0x[0-9a-f]+|\[vcuda-client\]' "$1"; }
