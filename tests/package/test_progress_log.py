"""helpers.progress: the test-by-test log a time-limited GPU run leaves (QWEN_FP4_TEST_PROGRESS)."""

from __future__ import annotations

from types import SimpleNamespace

from helpers import progress


def phase(nodeid, when, outcome, duration, text=""):
    return SimpleNamespace(nodeid=nodeid, when=when, duration=duration, failed=outcome == "failed",
                           skipped=outcome == "skipped", longreprtext=text)


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
