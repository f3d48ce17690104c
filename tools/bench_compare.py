#!/usr/bin/env python3
"""Compares tools/bench.sh tables of two builds taken in turns (tools/bench_ab.sh writes them).

Usage: tools/bench_compare.py DIR [BASE NEW]   (defaults: base new)

Reads DIR/bench_BASE_*.txt and DIR/bench_NEW_*.txt (each a bench.sh table: one figure a row, a value and a ratio
to native per mode) and prints, for every figure and mode through vcuda, the median ratio to native of each build
with its range over the tables, then the figures where NEW is worse than BASE beyond the ranges: its best table
worse than BASE's worst (for µs a higher ratio, for GB/s a lower one). Ratios are taken within one table, so a
noisy spell of the machine moves native and vcuda alike. Exit status 0; 2 on bad usage or no tables.
"""
import glob
import os
import statistics
import sys

MODES = ("tcp", "tcp+tls", "unix", "shm")


def read_tables(directory, build):
    """{(figure, unit, mode): [ratio per table]} for one build."""
    out = {}
    for path in sorted(glob.glob(os.path.join(directory, f"bench_{build}_*.txt"))):
        lines = open(path, encoding="utf-8", errors="replace").read().splitlines()
        head = next((i for i, l in enumerate(lines) if l.split()[:1] == ["figure"]), None)
        if head is None:
            continue
        cols = lines[head].split()
        for line in lines[head + 1:]:
            words = line.split()
            if len(words) != len(cols) or not words[0][:1].islower():
                continue
            for i, col in enumerate(cols):
                if col in MODES:
                    try:
                        ratio = float(words[i + 1].rstrip("x"))
                    except (ValueError, IndexError):
                        continue
                    out.setdefault((words[0], words[1], col), []).append(ratio)
    return out


def main(argv):
    if len(argv) not in (2, 4) or argv[1] in ("-h", "--help"):
        print(__doc__.strip(), file=sys.stderr)
        return 2
    directory = argv[1]
    base, new = (argv[2], argv[3]) if len(argv) == 4 else ("base", "new")
    a, b = read_tables(directory, base), read_tables(directory, new)
    if not a or not b:
        print(f"bench_compare: no tables of {base!r} and {new!r} in {directory}", file=sys.stderr)
        return 2
    print(f"{'figure':28} {'unit':5} {'mode':8} {base + ': median [range]':>24} {new + ': median [range]':>24}")
    worse = []
    for key in a:
        if key not in b:
            continue
        fig, unit, mode = key
        ra, rb = a[key], b[key]
        cell = lambda r: f"{statistics.median(r):.2f}x [{min(r):.2f}-{max(r):.2f}]"
        print(f"{fig:28} {unit:5} {mode:8} {cell(ra):>24} {cell(rb):>24}")
        higher_is_better = unit == "GB/s"
        if (max(rb) < min(ra)) if higher_is_better else (min(rb) > max(ra)):
            worse.append(f"{fig} ({unit}, {mode}): {cell(ra)} -> {cell(rb)}")
    print(f"\n{len(worse)} figure(s) where {new} is worse than {base} beyond the ranges"
          f" ({len(next(iter(a.values())))} and {len(next(iter(b.values())))} tables)")
    for w in worse:
        print("  " + w)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
