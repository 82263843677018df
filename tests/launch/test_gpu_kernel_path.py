"""The kernel path on the GPU (set_launch_options(kernel_path=...)), in any build: portable always works;
blackwell raises, naming the switch, where this build has no Blackwell path for the device (and runs where it
has one); an unknown value is refused where it is set; auto takes the path info names."""

from __future__ import annotations

import pytest
import torch

import qwen_resnorm_fp4 as q
from qwen_resnorm_fp4 import info
from helpers.reliability import as_bits, block_inputs, resnorm_args

pytestmark = pytest.mark.gpu


@pytest.fixture
def set_path():
    """Sets the kernel path for the test; the launch options come back after."""
    before = q.launch_options()
    yield lambda path: q.set_launch_options(kernel_path=path)
    q.set_launch_options(*before)


def _calls():
    kw = block_inputs(129, 3072, device="cuda", seed=11)
    G = torch.tensor([100.0], device="cuda")
    y, _ = q.resnorm(*resnorm_args(kw))
    return {"resnorm_quant": lambda: q.resnorm_quant(*resnorm_args(kw), G),
            "nvfp4_quantize": lambda: q.nvfp4_quantize(y, G)}


def test_unknown_value_is_refused(set_path):
    before = q.launch_options()
    with pytest.raises(ValueError, match=r"kernel_path must be one of auto, portable, blackwell, got 'hopper'"):
        set_path("hopper")
    assert q.launch_options() == before


def test_blackwell_where_unusable_is_an_error_else_runs(set_path):
    cap = torch.cuda.get_device_capability()
    set_path("blackwell")
    usable = not info.kernel_path(cap).startswith("error")
    for fn in _calls().values():
        if usable:
            fn()
        else:
            with pytest.raises(RuntimeError, match="kernel path blackwell .* but the Blackwell path is not usable"):
                fn()


def test_auto_equals_the_path_info_names(set_path):
    """auto takes the path info names; on a GPU without a Blackwell path that is the portable one."""
    calls = _calls()
    cap = torch.cuda.get_device_capability()
    outs = {}
    for value in ("auto", "portable"):
        set_path(value)
        outs[value] = [as_bits(t) for fn in calls.values() for t in fn()]
    set_path("auto")
    if info.kernel_path(cap) in (info.PATH_PORTABLE, info.PATH_PORTABLE_JIT):
        assert all(torch.equal(a, b) for a, b in zip(outs["auto"], outs["portable"]))
