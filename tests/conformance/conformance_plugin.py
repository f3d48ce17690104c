"""pytest plugin of the conformance runner (run_conformance.sh loads it with `-p conformance_plugin`).

- CONFORMANCE_MAX_TESTS=N: keep N of the collected tests, chosen by a hash of each test's id (the same N tests
  natively and through vcuda, and in every xdist worker, whatever the collection order); the rest deselected.
- CONFORMANCE_ONLY_IDS=FILE: then keep only the tests whose ids are lines of FILE (the runner gives the modes
  through vcuda the tests the native run reached, when its time ran out: the others could not be compared).
- CONFORMANCE_RESULTS=FILE: append one line per test phase report, `OUTCOME<TAB>WHEN<TAB>NODEID`, flushed at once,
  so a run killed by its time limit still leaves the outcomes of the tests that finished (the JUnit XML file is
  written only at the end of the session). Written by the controlling process only (not by xdist workers).
  A file that cannot be collected (an import error: a missing module, a name the installed library lacks) is
  written as `failed<TAB>collect<TAB>FILE`, so that it counts as an error instead of vanishing from the table.
- Registers the `serial` marker (PyTorch's serialTest(); the runner runs those tests in a pass without xdist).
"""
import os
import zlib


def _key(nodeid):
    return zlib.crc32(nodeid.encode("utf-8", "replace"))


def _keep(config, items, keep_ids):
    dropped = [it for it in items if it.nodeid not in keep_ids]
    if dropped:
        items[:] = [it for it in items if it.nodeid in keep_ids]
        config.hook.pytest_deselected(items=dropped)


def pytest_collection_modifyitems(session, config, items):
    limit = os.environ.get("CONFORMANCE_MAX_TESTS", "").strip()
    if limit and 0 < int(limit) < len(items):
        _keep(config, items,
              {it.nodeid for it in sorted(items, key=lambda it: (_key(it.nodeid), it.nodeid))[: int(limit)]})
    only = os.environ.get("CONFORMANCE_ONLY_IDS", "").strip()
    if only:
        with open(only) as f:
            _keep(config, items, {line.rstrip("\n") for line in f if line.strip()})


_results = None


def pytest_configure(config):
    global _results
    config.addinivalue_line("markers", "serial: PyTorch's serialTest(), run by the runner without xdist")
    path = os.environ.get("CONFORMANCE_RESULTS", "").strip()
    if path and not hasattr(config, "workerinput"):  # not in an xdist worker
        _results = open(path, "a", buffering=1)


def pytest_runtest_logreport(report):
    if _results is None:
        return
    outcome = report.outcome
    if hasattr(report, "wasxfail"):
        outcome = "xfailed" if report.skipped else "xpassed"
    _results.write("%s\t%s\t%s\n" % (outcome, report.when, report.nodeid))


def pytest_collectreport(report):
    if _results is None or not report.failed:
        return
    _results.write("%s\tcollect\t%s\n" % (report.outcome, report.nodeid or "<collection>"))


def pytest_unconfigure(config):
    global _results
    if _results is not None:
        _results.close()
        _results = None
