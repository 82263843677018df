"""Per-token modulation on CPU: gate/scale/shift [B, S, D] or [M, D], one row per token, with any row stride.

The reference (the CPU implementation) against contiguous copies and against the other forms, the rule set
(validation.py: shapes for every implementation, the CUDA op's layout rule for in-place reads) and the
typed wrappers' operand preparation (chunk views go in as they are, other layouts are copied). The
per-token loop over [D] parameters is tests/numerics/test_reference.py's test_modulation_forms_equal_per_batch_loop
("token" form); the kernels' side is tests/ops/test_gpu_per_token.py.
"""

from __future__ import annotations

import pytest
import torch

import qwen_resnorm_fp4 as q
from qwen_resnorm_fp4 import operands, validation
from qwen_resnorm_fp4.validation import DeclineReason as R
from helpers.inputs import make_inputs, op_args

ops = torch.ops.qwen_fp4
B, S, D = 2, 5, 128


def _with(inp, gate, scale, shift):
    return dict(inp, gate=gate, scale=scale, shift=shift)


def _outputs(inp):
    """Both ops' outputs on CPU (the reference), as one tuple."""
    return ops.resnorm(*op_args(inp, "resnorm")) + ops.resnorm_quant(*op_args(inp, "resnorm_quant"))


def _equal(a, b):
    return all(torch.equal(u, v) for u, v in zip(a, b))


@pytest.mark.parametrize("param_dtype", (torch.bfloat16, torch.float32), ids=("bf16", "fp32"))
@pytest.mark.parametrize("options", (False, True), ids=("plain", "bias_affine"))
def test_chunk_views_equal_contiguous_copies(param_dtype, options):
    strided = make_inputs(B, S, D, "token", param_dtype, seed=3, bias=options, affine=options, strided=True)
    contiguous = make_inputs(B, S, D, "token", param_dtype, seed=3, bias=options, affine=options)
    assert strided["gate"].stride() == (S * 6 * D, 6 * D, 1) and not strided["gate"].is_contiguous()
    for name in ("gate", "scale", "shift"):
        assert torch.equal(strided[name], contiguous[name])
    assert _equal(_outputs(strided), _outputs(contiguous))


def test_token_rows_form_equals_flattened_and_general_strides():
    """[B, S, D], its [M, D] flattening, and a [B, S, D] view whose two leading dimensions are not one row
    index (a [B, 6, S, D] slice) give the same bytes."""
    inp = make_inputs(B, S, D, "token", torch.bfloat16, seed=5)
    base = _outputs(inp)
    flat = _with(inp, *(inp[n].reshape(B * S, D) for n in ("gate", "scale", "shift")))
    assert _equal(_outputs(flat), base)
    blocks = torch.stack([inp["gate"], inp["scale"], inp["shift"]] * 2, dim=1)  # [B, 6, S, D]
    general = _with(inp, blocks[:, 0], blocks[:, 1], blocks[:, 2])
    assert general["gate"].stride() == (6 * S * D, D, 1)
    assert _equal(_outputs(general), base)


def test_identical_token_rows_equal_shared_and_per_batch():
    shared = make_inputs(B, S, D, "shared", torch.bfloat16, seed=7)
    per_token = _with(shared, *(shared[n].expand(B, S, D) for n in ("gate", "scale", "shift")))
    assert _equal(_outputs(per_token), _outputs(shared))

    batch = make_inputs(B, S, D, "batch", torch.bfloat16, seed=8)
    rows = [batch[n] for n in ("gate", "scale", "shift")]
    expanded = _with(batch, *(p[:, None].expand(B, S, D) for p in rows))  # stride 0 over S
    materialized = _with(batch, *(p[:, None].expand(B, S, D).contiguous() for p in rows))
    unsqueezed = _with(batch, *(p[:, None] for p in rows))  # [B, 1, D]: per batch
    want = _outputs(batch)
    for form in (expanded, materialized, unsqueezed):
        assert _equal(_outputs(form), want)


def test_per_token_rows_matter():
    inp = make_inputs(B, S, D, "token", torch.bfloat16, seed=9)
    swapped = _with(inp, *(inp[n].flip(1) for n in ("gate", "scale", "shift")))
    y, r = ops.resnorm(*op_args(inp, "resnorm"))
    y2, r2 = ops.resnorm(*op_args(swapped, "resnorm"))
    assert not torch.equal(r, r2) and not torch.equal(y, y2)


def test_wrappers_serve_chunk_views():
    inp = make_inputs(B, S, D, "token", torch.bfloat16, seed=10, strided=True)
    args = (inp["residual"], inp["x"], inp["bias"], inp["gate"], inp["scale"], inp["shift"])
    assert _equal(q.resnorm(*args, inp["eps"]), ops.resnorm(*op_args(inp, "resnorm")))
    assert _equal(q.resnorm_quant(*args, inp["global_scale"], inp["eps"], True),
                  ops.resnorm_quant(*op_args(inp, "resnorm_quant")))


# ----------------------------------------------------------------------------------------------------
# The rules
# ----------------------------------------------------------------------------------------------------


def _problem(inp):
    return validation.resnorm_problem(inp["residual"], inp["x"], inp["bias"], inp["gate"], inp["scale"],
                                      inp["shift"], inp["eps"], inp["weight"], inp["norm_bias"], inp["modulate_index"])


@pytest.mark.parametrize("case, pattern", (
    ("rows_mismatch", r"per-token gate/scale/shift \[B, S, D\] need B \* S = x's rows \(10\), got shape \(2, 4, 128\)"),
    ("four_dims", r"gate must be \[D\], \[B, D\] or \[B, S, D\] with D=128, got shape \(2, 5, 1, 128\)"),
    ("scale_differs", r"gate is \(2, 5, 128\) and scale is \(10, 128\)"),
    ("with_index", r"with modulate_index of shape \(2, 5\), gate/scale/shift must be \[2B, D\]"),
))
def test_shape_rules_name_the_argument(case, pattern):
    inp = make_inputs(B, S, D, "token", torch.bfloat16, seed=1)
    g, sc, sh = inp["gate"], inp["scale"], inp["shift"]
    bad = {
        "rows_mismatch": lambda: _with(inp, g[:, :4], sc[:, :4], sh[:, :4]),
        "four_dims": lambda: _with(inp, g[:, :, None], sc[:, :, None], sh[:, :, None]),
        "scale_differs": lambda: _with(inp, g, sc.reshape(B * S, D), sh),
        "with_index": lambda: dict(inp, modulate_index=torch.zeros(B, S, dtype=torch.int32)),
    }[case]()
    problem = _problem(bad)
    assert problem is not None and problem.reason is R.UNSUPPORTED_MODULATION
    with pytest.raises(ValueError, match=pattern):
        validation.require(problem)
    with pytest.raises(ValueError, match=pattern):  # the CPU op applies the same rules
        ops.resnorm(*op_args(bad, "resnorm"))


def test_layout_rule_accepts_chunk_views_and_broadcasts():
    inp = make_inputs(B, S, D, "token", torch.float32, seed=2, strided=True)
    for name in ("gate", "scale", "shift"):
        assert validation.modulation_layout_problem(name, inp[name]) is None
        assert validation.modulation_in_place(inp[name], has_data=True)
    assert validation.modulation_layout_problem("gate", torch.ones(D).expand(B, S, D)) is None
    assert validation.modulation_layout_problem("gate", torch.ones(B, 1, D)[:, :, :]) is None
    assert validation.modulation_layout_problem("gate", torch.ones(1, 7 * D + 3)[:, :D]) is None  # one row


@pytest.mark.parametrize("case, pattern", (
    ("last_stride", r"gate must have stride 1 in its last dimension, got strides \(1, 10\); pass gate.contiguous\(\)"),
    ("row_stride_bf16", r"gate's rows must start at 16-byte boundaries: its strides \(644, 1\) \(elements of 2 "
                        r"bytes\) are not multiples of 16 bytes; pass gate.contiguous\(\)"),
    ("token_stride_fp32", r"gate's rows must start at 16-byte boundaries: its strides \(1610, 322, 1\) \(elements "
                          r"of 4 bytes\)"),
))
def test_layout_rule_names_the_argument(case, pattern):
    t = {
        "last_stride": lambda: torch.zeros(D, B * S, dtype=torch.bfloat16).t(),
        "row_stride_bf16": lambda: torch.zeros(B * S, 5 * D + 4, dtype=torch.bfloat16)[:, :D],
        "token_stride_fp32": lambda: torch.zeros(B, S, 2 * D + 66)[..., :D],
    }[case]()
    problem = validation.modulation_layout_problem("gate", t)
    assert problem is not None and problem.reason is R.NON_CONTIGUOUS
    with pytest.raises(ValueError, match=pattern):
        validation.require(problem)
    assert not validation.modulation_in_place(t, has_data=True)


def test_misaligned_start_is_not_read_in_place():
    buf = torch.zeros(B * S * 6 * D + 1, dtype=torch.bfloat16)
    view = buf[1:].view(B, S, 6 * D)[..., :D]  # row strides fine, start 2 bytes past a 16-byte boundary
    assert validation.modulation_layout_problem("gate", view) is None
    assert view.data_ptr() % 16 != 0
    assert not validation.modulation_in_place(view, has_data=True)
    assert validation.modulation_in_place(view, has_data=False)  # a traced tensor: the op checks at run time


def test_wrapper_operands_keep_views_and_copy_the_rest():
    inp = make_inputs(B, S, D, "token", torch.bfloat16, seed=4, strided=True)
    view = inp["gate"]
    assert operands.modulation_operand(view, operands.aligned) is view  # read in place: no copy
    odd = torch.zeros(B, S, 5 * D + 4, dtype=torch.bfloat16)[..., :D]
    copy = operands.modulation_operand(odd, operands.aligned)
    assert copy.is_contiguous() and copy.data_ptr() != odd.data_ptr() and torch.equal(copy, odd)
    buf = torch.zeros(B * S * 6 * D + 1, dtype=torch.bfloat16)
    shifted = buf[1:].view(B, S, 6 * D)[..., :D]
    moved = operands.modulation_operand(shifted, operands.aligned)
    assert moved.data_ptr() % 16 == 0 and torch.equal(moved, shifted)


def test_torch_compile_fullgraph_with_chunk_views():
    inp = make_inputs(B, S, D, "token", torch.bfloat16, seed=6)
    temb = torch.randn(B, S, 6 * D).to(torch.bfloat16)

    def block(residual, x, temb, g):
        shift, scale, gate = temb.chunk(6, dim=2)[:3]
        return q.resnorm_quant(residual, x, None, gate, scale, shift, g, 1e-6, True)

    args = (inp["residual"], inp["x"], temb, inp["global_scale"])
    compiled = torch.compile(block, fullgraph=True, backend="aot_eager")
    assert _equal(compiled(*args), block(*args))
