"""A test-by-test log written as the session runs, so that a run stopped by a time limit still says which tests
ran, how long each took and why each failure failed (pytest's own summary, ``--durations`` and junit XML come
only at the end).

``QWEN_FP4_TEST_PROGRESS=path`` (scripts/gpu_check.sh sets it) appends one line per test to ``path``:
``seconds<TAB>outcome<TAB>node id`` (setup, call and teardown summed; the outcome of the first phase that did
not pass), then a failure's report indented below it. Under pytest-xdist the controller alone writes (the
workers inherit the variable and return at once), and a test whose worker crashed gets its line from the one
report xdist makes for it.
"""

from __future__ import annotations

import os
from typing import Dict, Optional, Tuple

#: The environment variable naming the log file (unset: no log).
PROGRESS_VAR = "QWEN_FP4_TEST_PROGRESS"

_pending: Dict[str, Tuple[float, str, str]] = {}


def _path() -> Optional[str]:
    return os.environ.get(PROGRESS_VAR) or None


def record(report) -> None:
    """Fold one phase's report (``pytest_runtest_logreport``) into its test's line; write the line after the
    teardown."""
    path = _path()
    if path is None or os.environ.get("PYTEST_XDIST_WORKER"):
        return
    if report.when not in ("setup", "call", "teardown"):  # xdist's report of a crashed worker: no teardown follows
        _pending.pop(report.nodeid, None)
        _write(path, report.duration, "crashed", report.nodeid, report.longreprtext)
        return
    seconds, outcome, detail = _pending.get(report.nodeid, (0.0, "passed", ""))
    seconds += report.duration
    if report.failed and outcome in ("passed", "skipped"):  # the first phase that failed names the outcome
        outcome = "failed" if report.when == "call" else f"error in {report.when}"
        detail = report.longreprtext
    elif report.skipped and outcome == "passed":
        outcome = "skipped"
    _pending[report.nodeid] = (seconds, outcome, detail)
    if report.when != "teardown":
        return
    del _pending[report.nodeid]
    _write(path, seconds, outcome, report.nodeid, detail)


def _write(path: str, seconds: float, outcome: str, nodeid: str, detail: str) -> None:
    """One test's line, and its failure report (the last 60 lines) indented below it, in one write."""
    text = f"{seconds:.2f}\t{outcome}\t{nodeid}\n" + "".join(f"    {line}\n" for line in detail.splitlines()[-60:])
    with open(path, "a", encoding="utf-8") as log:
        log.write(text)
