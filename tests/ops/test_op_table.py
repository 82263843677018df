"""The op table (qwen_resnorm_fp4/ops.py) drives every op: each entry's schema is defined, its fake and
Python implementation registered, its wrapper bound, its CUDA kernel registered once, and the op is named
in few places (the table, its wrapper, its reference, its registration, its callers)."""

from __future__ import annotations

import re

import pytest
import torch

from helpers.paths import REPO_ROOT
import qwen_resnorm_fp4.api as api
import qwen_resnorm_fp4.ops as ops

PACKAGE, CSRC = REPO_ROOT / "qwen_resnorm_fp4", REPO_ROOT / "csrc"
USER_OPS = sorted(name for name, entry in ops.OPS.items() if entry.rules is not None)
#: The most files of qwen_resnorm_fp4/ and csrc/ that may name an op (issue 47's bound).
MAX_FILES_NAMING_AN_OP = 6


@pytest.mark.parametrize("name", USER_OPS)
def test_each_entry_is_defined_faked_implemented_and_bound(name):
    entry = ops.OPS[name]
    overload = getattr(torch.ops.qwen_fp4, name).default
    assert str(overload._schema) == f"qwen_fp4::{ops.SCHEMAS[name]}"
    assert torch._C._dispatch_has_kernel_for_dispatch_key(f"qwen_fp4::{name}", "CPU")
    assert torch.library.get_kernel(f"qwen_fp4::{name}", "Meta") is not None  # the fake
    assert api._BOUND[name][0] is entry and api._BOUND[name][1].op is overload
    if entry.is_out_variant:
        assert entry.functional in ops.OPS and not ops.OPS[entry.functional].is_out_variant
        assert entry.outputs is None
    else:
        assert callable(entry.outputs) and callable(entry.reference)


def test_every_cuda_kernel_is_registered_once_for_an_op_of_the_table():
    text = (CSRC / "registration.cpp").read_text()
    registered = re.findall(r'm\.impl\("(\w+)"', text)
    assert len(registered) == len(set(registered))
    assert set(registered) == set(ops.OPS)


def _files_naming(name: str):
    pattern = re.compile(rf"(?<![\w]){re.escape(name)}(?![\w])")
    files = [p for p in PACKAGE.rglob("*.py")] + [p for p in CSRC.iterdir() if p.suffix in (".h", ".cuh", ".cu",
                                                                                            ".cpp")]
    return sorted(str(p.relative_to(REPO_ROOT)) for p in files if pattern.search(p.read_text()))


@pytest.mark.parametrize("name", USER_OPS)
def test_an_op_is_named_in_few_files(name):
    files = _files_naming(name)
    assert len(files) <= MAX_FILES_NAMING_AN_OP, f"{name} is named in {len(files)} files: {files}"
    assert "qwen_resnorm_fp4/ops.py" in files and "csrc/registration.cpp" in files


def test_an_out_variant_writes_its_functional_ops_bytes_on_cpu():
    """The out-variant's Python implementation is derived from its functional op's reference: the same bytes."""
    from helpers.inputs import make_inputs

    inp = make_inputs(2, 4, 128, "batch", torch.bfloat16, seed=3, affine=False)
    args = (inp["residual"], inp["x"], inp["bias"], inp["gate"], inp["scale"], inp["shift"])
    want = torch.ops.qwen_fp4.resnorm_quant(*args, inp["global_scale"], 1e-6, True)
    outs = (torch.empty_like(want[0]), torch.empty_like(want[1]), torch.empty_like(want[2]))
    torch.ops.qwen_fp4.resnorm_quant_out(*args, inp["global_scale"], 1e-6, True, *outs)
    assert all(torch.equal(a.view(torch.uint8), b.view(torch.uint8)) for a, b in zip(outs, want))
