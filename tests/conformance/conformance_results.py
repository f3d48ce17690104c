#!/usr/bin/env python3
"""Per-test outcomes of the conformance runs, the table, and the tests that pass natively but not through vcuda.

Usage:
  conformance_results.py outcomes FILE            one `OUTCOME<TAB>ID` per test (FILE: .results stream or JUnit .xml)
  conformance_results.py report OUTDIR SUITES MODES [EXCEPTIONS]
      reads OUTDIR/SUITE.MODE.results (else OUTDIR/SUITE.MODE.xml) and OUTDIR/SUITE.MODE.meta for each suite and
      mode; writes OUTDIR/SUITE.MODE.outcomes, OUTDIR/regressions.MODE.txt (`SUITE<TAB>TEST<TAB>OUTCOME` for each
      test that passed natively and did not pass in MODE; OUTCOME `not-run` where the run ended before reaching
      it) and prints the table. SUITES and MODES are space-separated lists; `native` must be the first mode.
      EXCEPTIONS: lines `MODE<TAB>SUITE<TAB>TEST-GLOB<TAB>REASON`, tests that cannot pass in MODE (listed, not
      counted as lost).

Outcomes: passed, failed, error, skipped. From the stream of the pytest plugin (`OUTCOME<TAB>WHEN<TAB>ID` per test
phase): a failed call is `failed`, a failed setup or teardown `error`, xfailed counts as skipped and xpassed as
passed. From JUnit XML: <failure> failed, <error> error, <skipped> skipped, else passed (id CLASSNAME::NAME).
"""
import fnmatch
import os
import sys
import xml.etree.ElementTree as ET

ORDER = ("passed", "failed", "error", "skipped")


def from_stream(path):
    phases = {}
    order = []
    with open(path, errors="replace") as f:
        for line in f:
            parts = line.rstrip("\n").split("\t", 2)
            if len(parts) != 3:
                continue
            outcome, when, nodeid = parts
            if nodeid not in phases:
                phases[nodeid] = []
                order.append(nodeid)
            phases[nodeid].append((outcome, when))
    result = {}
    for nodeid in order:
        ph = phases[nodeid]
        failed = [w for o, w in ph if o == "failed"]
        if failed:
            result[nodeid] = "failed" if "call" in failed else "error"
        elif any(o in ("passed", "xpassed") and w == "call" for o, w in ph):
            result[nodeid] = "passed"
        elif any(o in ("skipped", "xfailed") for o, w in ph):
            result[nodeid] = "skipped"
        elif all(o == "passed" for o, w in ph) and ph:
            # setup passed, no call report yet: the run ended inside this test
            result[nodeid] = "error" if any(w == "call" for o, w in ph) else "not-run"
        else:
            result[nodeid] = "error"
    return {k: v for k, v in result.items() if v != "not-run"}


def from_junit(path):
    result = {}
    try:
        root = ET.parse(path).getroot()
    except (ET.ParseError, OSError):
        return result
    for tc in root.iter("testcase"):
        key = "%s::%s" % (tc.get("classname", ""), tc.get("name", ""))
        tags = {child.tag for child in tc}
        if "failure" in tags:
            outcome = "failed"
        elif "error" in tags:
            outcome = "error"
        elif "skipped" in tags:
            outcome = "skipped"
        else:
            outcome = "passed"
        prev = result.get(key)
        if prev is None or ORDER.index(outcome) in (1, 2):  # a failure or error wins over an earlier record
            result[key] = outcome
    return result


def outcomes_of(base):
    if os.path.exists(base + ".results"):
        return from_stream(base + ".results")
    if os.path.exists(base + ".xml"):
        return from_junit(base + ".xml")
    return {}


def read_meta(path):
    meta = {}
    try:
        with open(path) as f:
            for line in f:
                if "=" in line:
                    k, v = line.rstrip("\n").split("=", 1)
                    meta[k] = v
    except OSError:
        pass
    return meta


def load_exceptions(path):
    """Lines `MODE<TAB>SUITE<TAB>TEST-GLOB<TAB>REASON` (# comments): tests that cannot pass through vcuda in MODE."""
    out = []
    try:
        with open(path) as f:
            for line in f:
                line = line.rstrip("\n")
                if not line.strip() or line.lstrip().startswith("#"):
                    continue
                parts = line.split("\t")
                if len(parts) >= 3:
                    out.append((parts[0], parts[1], parts[2], parts[3] if len(parts) > 3 else ""))
    except OSError:
        pass
    return out


def excepted(exceptions, mode, suite, test):
    for m, s, glob, why in exceptions:
        if fnmatch.fnmatchcase(mode, m) and fnmatch.fnmatchcase(suite, s) and fnmatch.fnmatchcase(test, glob):
            return why or "listed"
    return ""


def report(outdir, suites, modes, exceptions_path=None):
    exceptions = load_exceptions(exceptions_path) if exceptions_path else []
    rows = []
    regress = {m: [] for m in modes[1:]}
    for suite in suites:
        native = None
        for mode in modes:
            base = os.path.join(outdir, "%s.%s" % (suite, mode))
            meta = read_meta(base + ".meta")
            if not meta and not os.path.exists(base + ".results") and not os.path.exists(base + ".xml"):
                continue
            res = outcomes_of(base)
            with open(base + ".outcomes", "w") as f:
                for k in sorted(res):
                    f.write("%s\t%s\n" % (res[k], k))
            counts = {o: 0 for o in ORDER}
            for o in res.values():
                counts[o] = counts.get(o, 0) + 1
            lost = reach = "-"
            if mode == modes[0]:
                native = res
            elif native is not None:
                lost_list = []
                for k in sorted(native):
                    if native[k] == "passed" and res.get(k) != "passed":
                        o = res.get(k, "not-run")
                        why = excepted(exceptions, mode, suite, k)
                        lost_list.append((k, o + (" (exception: %s)" % why if why else "")))
                regress[mode].extend((suite, k, o) for k, o in lost_list)
                counted = [o for k, o in lost_list if "(exception" not in o]
                lost = str(sum(1 for o in counted if o != "not-run"))
                reach = str(sum(1 for o in counted if o == "not-run"))
                with open(base + ".regressions", "w") as f:
                    for k, o in lost_list:
                        f.write("%s\t%s\n" % (k, o))
            rows.append((suite, mode, counts["passed"], counts["failed"], counts["skipped"], counts["error"], lost, reach,
                         meta.get("seconds", "?"), meta.get("status", "?")))
    for mode, lst in regress.items():
        with open(os.path.join(outdir, "regressions.%s.txt" % mode), "w") as f:
            for suite, k, o in lst:
                f.write("%s\t%s\t%s\n" % (suite, k, o))
    head = ("suite", "mode", "passed", "failed", "skipped", "errors", "lost", "not-reached", "seconds", "run")
    widths = [max(len(str(r[i])) for r in rows + [head]) for i in range(len(head))]
    fmt = " | ".join("%%-%ds" % w for w in widths)
    print(fmt % head)
    print("-+-".join("-" * w for w in widths))
    for r in rows:
        print(fmt % tuple(str(x) for x in r))
    total = sum(len(v) for v in regress.values())
    for mode, lst in regress.items():
        n_exc = sum(1 for x in lst if "(exception" in x[2])
        print("passed natively, not through vcuda (%s): %d, of which %d on the exceptions list  (regressions.%s.txt)"
              % (mode, len(lst), n_exc, mode))
    print("lost: passed natively, failed or errored through vcuda (exceptions not counted); not-reached: passed "
          "natively, not run through vcuda before the time limit")
    return total


def main(argv):
    if len(argv) >= 3 and argv[1] == "outcomes":
        path = argv[2]
        res = from_junit(path) if path.endswith(".xml") else from_stream(path)
        for k in sorted(res):
            print("%s\t%s" % (res[k], k))
        return 0
    if len(argv) in (5, 6) and argv[1] == "report":
        report(argv[2], argv[3].split(), argv[4].split(), argv[5] if len(argv) == 6 else None)
        return 0
    sys.stderr.write(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
