"""A test-by-test log written as the session runs, so that a run stopped by a time limit still says which tests
ran, how long each took and why each failure failed (pytest's own summary, ``--durations`` and junit XML come
only at the end).

``QWEN_FP4_TEST_PROGRESS=path`` (scripts/gpu_check.sh sets it) appends one line per test to ``path``:
``seconds<TAB>outcome<TAB>node id`` (setup, call and teardown summed; the outcome of the first phase that did
not pass), then a failure's report indented below it. Under pytest-xdist the controller writes every line.
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
    if path is None:
        return
    seconds, outcome, detail = _pending.get(report.nodeid, (0.0, "passed", ""))
    seconds += report.duration
    if report.when == "call" and report.skipped and outcome == "passed":
        outcome = "skipped"
    if report.failed and outcome in ("passed", "skipped"):
        outcome = "failed" if report.when == "call" else f"error in {report.when}"
        detail = report.longreprtext
    elif report.skipped and report.when == "setup":
        outcome = "skipped"
    _pending[report.nodeid] = (seconds, outcome, detail)
    if report.when != "teardown":
        return
    del _pending[report.nodeid]
    with open(path, "a", encoding="utf-8") as log:
        log.write(f"{seconds:.2f}\t{outcome}\t{report.nodeid}\n")
        if detail:
            log.write("".join(f"    {line}\n" for line in detail.splitlines()[-60:]))
