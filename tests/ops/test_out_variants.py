"""The out-variants on CPU (resnorm_quant_out, resnorm_out, nvfp4_quantize_out): the functional ops' bytes
written into the caller's outputs, the in-place residual update, every refusal (before anything is written),
fakes, opcheck and torch.compile(fullgraph=True)."""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import qwen_resnorm_fp4 as q
from helpers.out_variants import (BROKEN_OUTPUTS, OUTPUTS, assert_bytes_equal, assert_each_output_refused, call_out_op,
                                  call_out_wrapper, filled_outputs, full_inputs, functional, on_device, out_op_args,
                                  output_bytes, overlap_pairs, with_overlap)

ops = torch.ops.qwen_fp4
OPS = tuple(OUTPUTS)
CALLERS = {"op": call_out_op, "wrapper": call_out_wrapper}



# ---------------------------------------------------------------------------------------------------
# The functional ops' bytes
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("rows,cols,form,fast", [(1, 64, "shared", True), (6, 128, "indexed_int64", False),
                                                 (130, 192, "batch", True), (0, 64, "shared", False)])
@pytest.mark.parametrize("caller", CALLERS)
def test_out_variant_writes_the_functional_bytes(op, rows, cols, form, fast, caller):
    inp = full_inputs(rows, cols, form=form, seed=rows + cols)
    want = functional(op, inp, fast)
    outs = filled_outputs(op, inp)
    returned = CALLERS[caller](op, inp, outs, fast)
    for name, w in zip(OUTPUTS[op], want):
        assert_bytes_equal(outs[name], w, name)
    if caller == "wrapper":
        assert all(r is outs[name] for r, name in zip(returned, OUTPUTS[op]))


@pytest.mark.parametrize("op", ("resnorm_quant", "nvfp4_quantize"))
def test_float8_scales_hold_the_same_bytes(op):
    inp = full_inputs(10, 128, seed=5)
    want = functional(op, inp)
    outs = filled_outputs(op, inp, scale_dtype=torch.float8_e4m3fn)
    call_out_op(op, inp, outs)
    assert outs["scales"].dtype == torch.float8_e4m3fn
    assert_bytes_equal(outs["scales"], want[1], "scales")


@pytest.mark.parametrize("op", ("resnorm_quant", "resnorm"))
@pytest.mark.parametrize("caller", CALLERS)
@pytest.mark.parametrize("view", (False, True), ids=("same_tensor", "view_of_it"))
def test_in_place_residual(op, caller, view):
    inp = full_inputs(130, 128, seed=9)
    want = functional(op, inp)
    outs = filled_outputs(op, inp)
    residual = inp["residual"].clone()
    inp["residual"] = residual
    outs["residual_out"] = residual.view(residual.shape) if view else residual
    CALLERS[caller](op, inp, outs)
    for name, w in zip(OUTPUTS[op], want):
        assert_bytes_equal(outs[name], w, name)
    assert_bytes_equal(residual, want[-1], "residual updated in place")


def test_empty_output_helpers():
    x = torch.zeros(2, 65, 192, dtype=torch.bfloat16)
    packed, scales, r = q.empty_resnorm_quant_outputs(x)
    assert packed.shape == (130, 96) and packed.dtype == torch.uint8
    assert scales.shape == (256, 12) and scales.dtype == torch.uint8
    assert r.shape == x.shape and r.dtype == torch.bfloat16
    assert q.empty_quantize_outputs(x, torch.float8_e4m3fn)[1].dtype == torch.float8_e4m3fn
    y, r2 = q.empty_resnorm_outputs(x)
    assert y.shape == r2.shape == x.shape and y.data_ptr() != r2.data_ptr()


# ---------------------------------------------------------------------------------------------------
# Refusals: each raises naming the argument, and nothing is written
# ---------------------------------------------------------------------------------------------------


# Python's rules: TypeError for a dtype, ValueError otherwise; the only other device here is meta.
STATIC_BREAKS = {kind: (make, TypeError if kind == "dtype" else ValueError, words)
                 for kind, (make, words) in BROKEN_OUTPUTS.items()}
STATIC_BREAKS["device"] = (lambda t: on_device(t, "meta"), ValueError, "is on meta")


def _assert_untouched(before, outs):
    for name, b in before.items():
        assert torch.equal(outs[name].view(torch.uint8), b), f"{name} was written by a refused call"


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("break_", STATIC_BREAKS)
@pytest.mark.parametrize("caller", CALLERS)
def test_static_refusals_name_the_output(op, break_, caller):
    make, error, words = STATIC_BREAKS[break_]
    assert_each_output_refused(op, full_inputs(6, 64, seed=1), make, error, words, CALLERS[caller])


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("output_first", (True, False), ids=("output_first", "other_first"))
@pytest.mark.parametrize("caller", CALLERS)
def test_overlap_refusals(op, output_first, caller):
    base = full_inputs(6, 64, seed=2)
    for out_name, other in overlap_pairs(op):
        inp, outs, arena = with_overlap(op, base, filled_outputs(op, base), out_name, other, output_first)
        arena_before = arena.clone()
        before = output_bytes(outs)
        with pytest.raises(ValueError, match=rf"{out_name} overlaps (the input )?{other}\b"):
            CALLERS[caller](op, inp, outs)
        assert torch.equal(arena, arena_before), (out_name, other)
        _assert_untouched(before, outs)


@pytest.mark.parametrize("op", ("resnorm_quant", "resnorm"))
@pytest.mark.parametrize("caller", CALLERS)
def test_residual_out_at_residual_with_other_strides_is_refused(op, caller):
    inp = full_inputs(6, 64, seed=3)
    wide = torch.zeros(*inp["residual"].shape[:-1], 128, dtype=torch.bfloat16)
    wide[..., :64] = inp["residual"]
    inp["residual"] = wide[..., :64]  # non-contiguous: rows 256 bytes apart
    outs = filled_outputs(op, inp)
    outs["residual_out"] = wide.view(-1)[: inp["x"].numel()].view(inp["x"].shape)  # same pointer, contiguous
    wide_before = wide.clone()
    with pytest.raises(ValueError, match=r"residual_out overlaps the input residual in memory \(residual_out may be "
                                         r"residual itself, not part of it\)"):
        CALLERS[caller](op, inp, outs)
    assert torch.equal(wide, wide_before)


@pytest.mark.parametrize("op", OPS)
def test_outputs_being_one_tensor_is_refused(op):
    inp = full_inputs(6, 128, seed=4)
    outs = filled_outputs(op, inp)
    first, second = OUTPUTS[op][:2]
    if outs[first].dtype == outs[second].dtype and outs[first].shape == outs[second].shape:
        outs[second] = outs[first]
    else:  # different layouts: one buffer viewed both ways
        buf = torch.empty(max(t.numel() * t.element_size() for t in outs.values()), dtype=torch.uint8)
        for name in (first, second):
            t = outs[name]
            outs[name] = buf[: t.numel() * t.element_size()].view(t.dtype).view(t.shape)
    with pytest.raises(ValueError, match=rf"{second} overlaps {first}"):
        call_out_op(op, inp, outs)


@pytest.mark.parametrize("op", ("resnorm_quant", "nvfp4_quantize"))
@pytest.mark.parametrize("code", (1, 3, 5, 17, 23))
@pytest.mark.parametrize("fast", (True, False))
def test_4over6_code_writes_the_functional_bytes(op, code, fast):
    inp = full_inputs(6, 64, seed=5)
    outs = filled_outputs(op, inp)
    call_out_op(op, inp, outs, fast=fast, code=code)
    expected = functional(op, inp, fast=fast, code=code)
    assert_bytes_equal(outs["packed"], expected[0], "packed")
    assert_bytes_equal(outs["scales"].view(torch.uint8), expected[1], "scales")
    assert not torch.equal(expected[0], functional(op, inp, fast=fast)[0]) or \
        not torch.equal(expected[1], functional(op, inp, fast=fast)[1]), "4over6 changed nothing: a weak case"


@pytest.mark.parametrize("op", ("resnorm_quant", "nvfp4_quantize"))
@pytest.mark.parametrize("code", (2, 64, -1))
def test_invalid_4over6_code_is_refused(op, code):
    inp = full_inputs(6, 64, seed=5)
    outs = filled_outputs(op, inp)
    before = output_bytes(outs)
    with pytest.raises(ValueError, match="nvfp4_4over6_code"):
        call_out_op(op, inp, outs, code=code)
    _assert_untouched(before, outs)


@pytest.mark.parametrize("op", OPS)
def test_input_rules_still_apply(op):
    inp = full_inputs(6, 64, seed=6)
    outs = filled_outputs(op, inp)
    bad = dict(inp, global_scale=torch.tensor([1.0, 2.0]))
    if op == "resnorm":
        bad = dict(inp, eps=-1.0)
    with pytest.raises(ValueError, match="global_scale|eps"):
        call_out_op(op, bad, outs)


# ---------------------------------------------------------------------------------------------------
# Fakes, opcheck, torch.compile
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("op", OPS)
def test_fake_returns_nothing_and_checks_shapes(op):
    inp = full_inputs(6, 64, seed=7)
    outs = filled_outputs(op, inp)
    with FakeTensorMode(allow_non_fake_inputs=False) as mode:
        f_inp = {k: mode.from_tensor(v) if isinstance(v, torch.Tensor) else v for k, v in inp.items()}
        f_outs = {k: mode.from_tensor(v) for k, v in outs.items()}
        assert getattr(ops, op + "_out")(*out_op_args(op, f_inp, f_outs)) is None
        name = OUTPUTS[op][0]
        f_outs[name] = mode.from_tensor(BROKEN_OUTPUTS["shape"][0](outs[name]))
        with pytest.raises(ValueError, match=rf"{name} must have shape"):
            getattr(ops, op + "_out")(*out_op_args(op, f_inp, f_outs))


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("form", ("batch", "indexed_bool"))
def test_opcheck(op, form):
    inp = full_inputs(6, 64, seed=8, form=form, param_dtype=torch.float32)
    outs = filled_outputs(op, inp)
    torch.library.opcheck(getattr(ops, op + "_out").default, out_op_args(op, inp, outs))


def _compiled_in_place(op: str, use_wrapper: bool, backend: str):
    def step(residual, x, bias, gate, scale, shift, global_scale, modulate_index, *outs):
        inp = dict(residual=residual, x=x, bias=bias, gate=gate, scale=scale, shift=shift,
                   global_scale=global_scale, eps=1e-6, weight=None, norm_bias=None, modulate_index=modulate_index)
        given = dict(zip(OUTPUTS[op][:-1], outs), residual_out=residual)
        (call_out_wrapper if use_wrapper else call_out_op)(op, inp, given)
        return residual * 1  # a read of the updated residual inside the graph (exact: keeps -0.0)

    return torch.compile(step, fullgraph=True, backend=backend)


@pytest.mark.parametrize("op", ("resnorm_quant", "resnorm"))
@pytest.mark.parametrize("use_wrapper", (False, True), ids=("op", "wrapper"))
@pytest.mark.parametrize("backend", ("aot_eager", "inductor"))
def test_compile_in_place_fullgraph(op, use_wrapper, backend):
    torch._dynamo.reset()
    inp = full_inputs(80, 128, seed=10, affine=False)
    want = functional(op, inp)
    residual = inp["residual"].clone()
    outs = filled_outputs(op, inp)
    extra = [outs[name] for name in OUTPUTS[op][:-1]]
    compiled = _compiled_in_place(op, use_wrapper, backend)
    read_back = compiled(residual, inp["x"], inp["bias"], inp["gate"], inp["scale"], inp["shift"],
                         inp["global_scale"], inp["modulate_index"], *extra)
    for name, w in zip(OUTPUTS[op][:-1], want):
        assert_bytes_equal(outs[name], w, name)
    assert_bytes_equal(residual, want[-1], "residual updated in place")
    assert_bytes_equal(read_back, want[-1], "the graph's read of the residual")
    # a second step continues from the updated residual, as a model's next block does
    want2 = functional(op, dict(inp, residual=residual.clone()))
    compiled(residual, inp["x"], inp["bias"], inp["gate"], inp["scale"], inp["shift"], inp["global_scale"],
             inp["modulate_index"], *extra)
    assert_bytes_equal(residual, want2[-1], "second step")


@pytest.mark.parametrize("backend", ("aot_eager", "inductor"))
def test_compile_nvfp4_quantize_out_fullgraph(backend):
    torch._dynamo.reset()
    inp = full_inputs(40, 128, seed=11)
    want = functional("nvfp4_quantize", inp)
    outs = filled_outputs("nvfp4_quantize", inp)

    def f(y, gs, packed, scales):
        q.nvfp4_quantize_out(y, gs, True, packed=packed, scales=scales)

    torch.compile(f, fullgraph=True, backend=backend)(inp["y"], inp["global_scale"], outs["packed"], outs["scales"])
    assert_bytes_equal(outs["packed"], want[0], "packed")
    assert_bytes_equal(outs["scales"], want[1], "scales")
