"""helpers.progress: the test-by-test log a time-limited GPU run leaves (QWEN_FP4_TEST_PROGRESS)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from helpers import progress


def phase(nodeid, when, outcome, duration, text=""):
    return SimpleNamespace(nodeid=nodeid, when=when, duration=duration, failed=outcome == "failed",
                           skipped=outcome == "skipped", longreprtext=text)


@pytest.fixture(autouse=True)
def _as_the_controller(monkeypatch):
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)  # this test may itself run in an xdist worker


def test_one_line_per_test_with_its_time_outcome_and_failure(tmp_path, monkeypatch):
    path = tmp_path / "progress.tsv"
    monkeypatch.setenv(progress.PROGRESS_VAR, str(path))
    for report in (phase("a.py::ok", "setup", "passed", 0.5), phase("a.py::ok", "call", "passed", 2.0),
                   phase("a.py::ok", "teardown", "passed", 0.25),
                   phase("a.py::bad", "setup", "passed", 0.0), phase("a.py::bad", "call", "failed", 1.0, "E boom"),
                   phase("a.py::bad", "teardown", "passed", 0.0),
                   phase("a.py::skip", "setup", "skipped", 0.0), phase("a.py::skip", "teardown", "passed", 0.0),
                   phase("a.py::fix", "setup", "failed", 0.5, "E fixture"),
                   phase("a.py::fix", "teardown", "passed", 0.0)):
        progress.record(report)
        if report.nodeid == "a.py::ok" and report.when == "call":
            assert not path.exists()  # a test's line comes with its teardown, not before
    assert path.read_text().splitlines() == [
        "2.75\tpassed\ta.py::ok", "1.00\tfailed\ta.py::bad", "    E boom", "0.00\tskipped\ta.py::skip",
        "0.50\terror in setup\ta.py::fix", "    E fixture"]


def test_no_log_without_the_variable(tmp_path, monkeypatch):
    monkeypatch.delenv(progress.PROGRESS_VAR, raising=False)
    monkeypatch.chdir(tmp_path)
    progress.record(phase("a.py::ok", "teardown", "passed", 0.1))
    assert list(tmp_path.iterdir()) == []


def test_xdist_workers_leave_the_log_to_the_controller_and_a_crash_gets_its_line(tmp_path, monkeypatch):
    path = tmp_path / "progress.tsv"
    monkeypatch.setenv(progress.PROGRESS_VAR, str(path))
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")
    for when in ("setup", "call", "teardown"):
        progress.record(phase("a.py::ok", when, "passed", 1.0))
    assert not path.exists()  # a worker writes nothing: its reports reach the controller, which writes
    monkeypatch.delenv("PYTEST_XDIST_WORKER")
    progress.record(phase("a.py::dies", "setup", "passed", 0.5))
    progress.record(phase("a.py::dies", "???", "failed", 0.0, "worker 'gw0' crashed while running 'a.py::dies'"))
    assert path.read_text().splitlines() == ["0.00\tcrashed\ta.py::dies",
                                             "    worker 'gw0' crashed while running 'a.py::dies'"]
