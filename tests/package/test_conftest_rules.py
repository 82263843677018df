"""The test suite's own rules (tests/conftest.py's hooks, applying helpers.session and helpers.tiers): which
marked tests skip on which machine, the seed, and the tiers (the default run and the exhaustive sweep)."""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch

from helpers import session, tiers
from qwen_resnorm_fp4 import _library, info


def _machine(monkeypatch, *, gpu: bool, library: bool = True, capability=(9, 0), emulation: bool = False) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpu)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: capability)
    monkeypatch.setattr(_library, "cuda_available", lambda: library)
    build = dict(info.build_info(), blackwell_emulation=emulation)
    monkeypatch.setattr(info, "build_info", lambda: build)
    monkeypatch.delenv(session.CPU_ONLY_VAR, raising=False)


def test_markers_skip_only_where_the_machine_cannot_run_them(monkeypatch):
    _machine(monkeypatch, gpu=False)
    assert all(r == "needs a CUDA GPU" for r in session.marker_skip_reasons().values())

    _machine(monkeypatch, gpu=True, capability=(9, 0))
    reasons = session.marker_skip_reasons()
    assert reasons["gpu"] is None
    assert "Blackwell" in reasons["blackwell"] and "emulation" in reasons["blackwell_emulation"]

    for major in session.BLACKWELL_MAJORS:
        _machine(monkeypatch, gpu=True, capability=(major, 0), emulation=True)
        assert set(session.marker_skip_reasons().values()) == {None}

    _machine(monkeypatch, gpu=True)
    monkeypatch.setenv(session.CPU_ONLY_VAR, "1")
    assert session.CPU_ONLY_VAR in session.gpu_skip_reason()


def test_a_gpu_session_without_the_compiled_library_is_refused(monkeypatch):
    _machine(monkeypatch, gpu=True, library=False)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "a GPU")
    assert "compiled library is not loaded" in session.what_runs()[1]
    monkeypatch.setenv(session.CPU_ONLY_VAR, "1")
    assert session.what_runs()[1] is None


def test_seed_fixture_seeds_torch_and_follows_the_variable(seed, monkeypatch):
    assert 0 <= seed < 2 ** 32
    drawn = torch.randn(4)
    torch.manual_seed(seed)
    assert torch.equal(torch.randn(4), drawn)  # torch was seeded with the seed the test sees
    monkeypatch.setenv(session.SEED_VAR, "1234")
    assert session.draw_seed() == 1234
    monkeypatch.setenv(session.SEED_VAR, "twelve")
    with pytest.raises(pytest.UsageError, match=session.SEED_VAR):
        session.draw_seed()


# ----------------------------------------------------------------------------------------------------
# Tiers: the default run and the exhaustive sweep
# ----------------------------------------------------------------------------------------------------


def test_sweep_marks_the_values_outside_the_default_exhaustive():
    params = tiers.sweep("a", (1, 2, 3), (1, 3)).args[1]
    assert [p.values for p in params] == [(1,), (2,), (3,)]
    assert [[m.name for m in p.marks] for p in params] == [[], [tiers.EXHAUSTIVE_MARKER], []]
    pairs = tiers.sweep("a, b", [(1, 2), (3, 4)], [(3, 4)]).args[1]
    assert [p.values for p in pairs] == [(1, 2), (3, 4)]
    assert [len(p.marks) for p in pairs] == [1, 0]
    for default in ((5,), ()):  # the default is a non-empty subset of the values: the sweep always holds it
        with pytest.raises(ValueError, match="non-empty subset"):
            tiers.sweep("a", (1, 2), default)


class _Item:
    def __init__(self, nodeid: str, exhaustive: bool):
        self.nodeid, self.exhaustive = nodeid, exhaustive

    def get_closest_marker(self, name):
        return object() if name == tiers.EXHAUSTIVE_MARKER and self.exhaustive else None


class _Config:
    def __init__(self, rootpath, *, exhaustive=False, markexpr="", args=()):
        self.options = {"exhaustive": exhaustive, "markexpr": markexpr}
        self.args, self.rootpath, self.stash = list(args), rootpath, pytest.Stash()
        self.deselected = []
        self.hook = type("Hook", (), {"pytest_deselected": lambda _, items: self.deselected.extend(items)})()

    def getoption(self, name, default=None):
        return self.options.get(name, default)


def test_the_default_tier_deselects_the_exhaustive_cases_unless_asked(tmp_path, monkeypatch):
    monkeypatch.delenv(tiers.EXHAUSTIVE_VAR, raising=False)

    def run(**kw):
        items = [_Item("tests/t.py::f[1]", False), _Item("tests/t.py::f[2]", True), _Item("tests/t.py::g", False)]
        config = _Config(tmp_path, **kw)
        tiers.select_tier(config, items)
        return [i.nodeid for i in items], [i.nodeid for i in config.deselected], tiers.tier_line(config)

    kept, dropped, line = run()
    assert kept == ["tests/t.py::f[1]", "tests/t.py::g"] and dropped == ["tests/t.py::f[2]"]
    assert "default tier (1 cases" in line and "--exhaustive" in line
    for asked in (dict(exhaustive=True), dict(markexpr="gpu and exhaustive"), dict(markexpr="not exhaustive")):
        kept, dropped, line = run(**asked)  # -m naming the marker selects by itself
        assert len(kept) == 3 and dropped == [], asked
    monkeypatch.setenv(tiers.EXHAUSTIVE_VAR, "1")
    kept, dropped, line = run()
    assert len(kept) == 3 and line.startswith("tests: the exhaustive sweep")
    monkeypatch.delenv(tiers.EXHAUSTIVE_VAR)
    # a case named on the command line with its parameters runs whatever its tier (a failure's rerun command)
    kept, _, _ = run(args=[str(tmp_path / "tests" / "t.py") + "::f[2]"])
    assert kept == ["tests/t.py::f[1]", "tests/t.py::f[2]", "tests/t.py::g"]
    assert not tiers.exhaustive_requested(_Config(tmp_path, markexpr="gpu and not slow"))


def test_this_session_holds_only_its_tier(request):
    """In this very session: the exhaustive cases were collected only if the run asked for them (or named them)."""
    marked = [i for i in request.session.items if i.get_closest_marker(tiers.EXHAUSTIVE_MARKER)]
    if not tiers.exhaustive_requested(request.config):
        assert not set(i.nodeid for i in marked) - tiers.named_node_ids(request.config)
    assert tiers.exhaustive_run() == tiers.exhaustive_requested(request.config)


def test_child_bytecode_cache_only_where_torch_has_none(monkeypatch, tmp_path):
    """Children get one writable bytecode cache only where torch's sources have no bytecode beside them and the
    environment names no cache; otherwise nothing changes."""
    monkeypatch.setattr(session, "CHILD_BYTECODE_CACHE", tmp_path / "pycache")
    monkeypatch.delenv("PYTHONPYCACHEPREFIX", raising=False)
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    monkeypatch.setattr(importlib.util, "cache_from_source", lambda path: str(tmp_path / "present.pyc"))
    (tmp_path / "present.pyc").write_bytes(b"")
    assert session.cache_child_bytecode() is None and "PYTHONPYCACHEPREFIX" not in os.environ

    monkeypatch.setattr(importlib.util, "cache_from_source", lambda path: str(tmp_path / "absent.pyc"))
    assert session.cache_child_bytecode() == tmp_path / "pycache"
    env = os.environ
    assert env["PYTHONPYCACHEPREFIX"] == str(tmp_path / "pycache") and (tmp_path / "pycache").is_dir()
    assert "PYTHONDONTWRITEBYTECODE" not in env
    assert "child interpreters cache bytecode" in session.what_runs()[0]

    monkeypatch.setenv("PYTHONPYCACHEPREFIX", "/elsewhere")  # a cache the user chose is kept
    assert session.cache_child_bytecode() is None and env["PYTHONPYCACHEPREFIX"] == "/elsewhere"
