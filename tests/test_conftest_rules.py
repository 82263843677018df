"""The test suite's own rules (tests/conftest.py): which marked tests skip on which machine, and the seed."""

from __future__ import annotations

import pytest
import torch

import conftest
from qwen_resnorm_fp4 import _library, info


def _machine(monkeypatch, *, gpu: bool, library: bool = True, capability=(9, 0), emulation: bool = False) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpu)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: capability)
    monkeypatch.setattr(_library, "cuda_available", lambda: library)
    build = dict(info.build_info(), blackwell_emulation=emulation)
    monkeypatch.setattr(info, "build_info", lambda: build)
    monkeypatch.delenv(conftest.CPU_ONLY_VAR, raising=False)


def test_markers_skip_only_where_the_machine_cannot_run_them(monkeypatch):
    _machine(monkeypatch, gpu=False)
    assert all(r == "needs a CUDA GPU" for r in conftest._marker_skip_reasons().values())

    _machine(monkeypatch, gpu=True, capability=(9, 0))
    reasons = conftest._marker_skip_reasons()
    assert reasons["gpu"] is None
    assert "Blackwell" in reasons["blackwell"] and "emulation" in reasons["blackwell_emulation"]

    for major in conftest.BLACKWELL_MAJORS:
        _machine(monkeypatch, gpu=True, capability=(major, 0), emulation=True)
        assert set(conftest._marker_skip_reasons().values()) == {None}

    _machine(monkeypatch, gpu=True)
    monkeypatch.setenv(conftest.CPU_ONLY_VAR, "1")
    assert conftest.CPU_ONLY_VAR in conftest.gpu_skip_reason()


def test_a_gpu_session_without_the_compiled_library_is_refused(monkeypatch):
    _machine(monkeypatch, gpu=True, library=False)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "a GPU")
    assert "compiled library is not loaded" in conftest._what_runs()[1]
    monkeypatch.setenv(conftest.CPU_ONLY_VAR, "1")
    assert conftest._what_runs()[1] is None


def test_seed_fixture_seeds_torch_and_follows_the_variable(seed, monkeypatch):
    assert 0 <= seed < 2 ** 32
    drawn = torch.randn(4)
    torch.manual_seed(seed)
    assert torch.equal(torch.randn(4), drawn)  # torch was seeded with the seed the test sees
    monkeypatch.setenv(conftest.SEED_VAR, "1234")
    assert conftest._draw_seed() == 1234
    monkeypatch.setenv(conftest.SEED_VAR, "twelve")
    with pytest.raises(pytest.UsageError, match=conftest.SEED_VAR):
        conftest._draw_seed()
