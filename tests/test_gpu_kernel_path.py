"""QWEN_FP4_KERNEL_PATH on the GPU, in any build: read on every call; portable always works; blackwell raises,
naming the variable, where this build has no Blackwell path for the device (and runs where it has one); an
unknown value raises listing the valid ones; info says what the ops do."""

from __future__ import annotations

import pytest
import torch

import qwen_resnorm_fp4 as q
from qwen_resnorm_fp4 import info
from qwen_resnorm_fp4.env import KERNEL_PATH_VAR
from reliability_utils import as_bits, block_inputs, resnorm_args

pytestmark = pytest.mark.gpu


def _calls():
    kw = block_inputs(129, 3072, device="cuda", seed=11)
    G = torch.tensor([100.0], device="cuda")
    y, _ = q.resnorm(*resnorm_args(kw))
    return {"resnorm_quant": lambda: q.resnorm_quant(*resnorm_args(kw), G),
            "nvfp4_quantize": lambda: q.nvfp4_quantize(y, G)}


def test_unknown_value_is_an_error(monkeypatch):
    monkeypatch.setenv(KERNEL_PATH_VAR, "hopper")
    for op, fn in _calls().items():
        with pytest.raises(RuntimeError, match=r"QWEN_FP4_KERNEL_PATH must be auto, portable or blackwell.*'hopper'"):
            fn()
    assert info.kernel_path(torch.cuda.get_device_capability()).startswith("error: QWEN_FP4_KERNEL_PATH")


def test_blackwell_where_unusable_is_an_error_else_runs(monkeypatch):
    cap = torch.cuda.get_device_capability()
    monkeypatch.setenv(KERNEL_PATH_VAR, "blackwell")
    usable = not info.kernel_path(cap).startswith("error")
    for op, fn in _calls().items():
        if usable:
            fn()
        else:
            with pytest.raises(RuntimeError, match="QWEN_FP4_KERNEL_PATH=blackwell, but the Blackwell path is not usable"):
                fn()


def test_auto_and_unset_equal_the_path_info_names(monkeypatch):
    """auto, unset and empty take one path; on a GPU without a Blackwell path that is the portable one."""
    calls = _calls()
    cap = torch.cuda.get_device_capability()
    outs = {}
    for value in ("auto", "", None, "portable"):
        if value is None:
            monkeypatch.delenv(KERNEL_PATH_VAR, raising=False)
        else:
            monkeypatch.setenv(KERNEL_PATH_VAR, value)
        outs[value] = [as_bits(t) for fn in calls.values() for t in fn()]
    for value in ("", None):
        assert all(torch.equal(a, b) for a, b in zip(outs["auto"], outs[value]))
    monkeypatch.setenv(KERNEL_PATH_VAR, "auto")
    if info.kernel_path(cap) in (info.PATH_PORTABLE, info.PATH_PORTABLE_JIT):
        assert all(torch.equal(a, b) for a, b in zip(outs["auto"], outs["portable"]))
