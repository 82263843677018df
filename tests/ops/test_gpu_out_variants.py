"""The out-variants on CUDA (skipped without a GPU and the compiled library): byte-equal to the functional
ops, the in-place residual update (rows <= SMs, where the functional fused op takes the two-CTA split
kernel, and many rows), the C++ refusals (nothing written), CUDA-graph capture and replay on static
buffers in place, torch.compile(fullgraph=True) in place, and outputs pre-filled with 0xFF."""

import pytest
import torch

import qwen_resnorm_fp4 as q
from helpers.out_variants import (BROKEN_OUTPUTS, OUTPUTS, assert_bytes_equal, assert_each_output_refused, call_out_op,
                                  call_out_wrapper, filled_outputs, full_inputs, functional, on_device, overlap_pairs,
                                  with_overlap)
from helpers.tiers import sweep
from helpers.reliability import padding_scale_bytes

pytestmark = pytest.mark.gpu

OPS = tuple(OUTPUTS)
DIMS = (64, 3072, 5120, 4096)
ROWS = (1, 17, 129, 2304)  # 129 <= SMs: the functional fused op's split kernel; 2304: the many-rows shapes
# The default run's subset (the rest: the exhaustive sweep): a generic and a tuned width, the split kernel and
# the many-rows shapes.
DEFAULT_DIMS = (64, 3072)
DEFAULT_ROWS = (17, 2304)


def gpu_inputs(rows, cols, plain, seed=0):
    """Plain parameters (bf16 [B, D], no bias or affine: what DiT blocks pass) or every optional argument."""
    if plain:
        return full_inputs(rows, cols, "cuda", seed, form="batch", bias=False, affine=False)
    return full_inputs(rows, cols, "cuda", seed, form="indexed_int64", bias=True, affine=True,
                       param_dtype=torch.float32)



@pytest.mark.parametrize("op", OPS)
@sweep("cols", DIMS, DEFAULT_DIMS)
@sweep("rows", ROWS, DEFAULT_ROWS)
@pytest.mark.parametrize("plain", (True, False), ids=("plain", "full"))
@pytest.mark.parametrize("fast", (True, False), ids=("fast", "exact"))
def test_out_variant_equals_functional(op, cols, rows, plain, fast):
    inp = gpu_inputs(rows, cols, plain, seed=rows * 7 + cols)
    want = functional(op, inp, fast)
    outs = filled_outputs(op, inp)
    call_out_op(op, inp, outs, fast)
    for name, w in zip(OUTPUTS[op], want):
        assert_bytes_equal(outs[name], w, f"{op} {name}")


@pytest.mark.parametrize("op", ("resnorm_quant", "resnorm"))
@sweep("cols", DIMS, DEFAULT_DIMS)
@sweep("rows", ROWS, DEFAULT_ROWS)
@pytest.mark.parametrize("plain", (True, False), ids=("plain", "full"))
def test_in_place_residual_equals_functional(op, cols, rows, plain):
    inp = gpu_inputs(rows, cols, plain, seed=rows * 3 + cols)
    want = functional(op, inp)
    residual = inp["residual"].clone()
    outs = filled_outputs(op, inp)
    outs["residual_out"] = residual
    call_out_wrapper(op, dict(inp, residual=residual), outs)
    for name, w in zip(OUTPUTS[op], want):
        assert_bytes_equal(outs[name], w, f"{op} {name}")
    assert_bytes_equal(residual, want[-1], "residual updated in place")


@pytest.mark.parametrize("cols", (3072, 5120))
@pytest.mark.parametrize("scale_dtype", (torch.uint8, torch.float8_e4m3fn), ids=("uint8", "float8"))
def test_dirty_outputs_padding_scales_zero(cols, scale_dtype):
    rows = 17
    inp = gpu_inputs(rows, cols, plain=True, seed=cols)
    want = functional("resnorm_quant", inp)
    for op in ("resnorm_quant", "nvfp4_quantize"):
        outs = filled_outputs(op, inp, scale_dtype=scale_dtype)
        for t in outs.values():
            t.view(torch.uint8).fill_(0xFF)
        if op == "nvfp4_quantize":
            inp = dict(inp, y=functional("resnorm", inp)[0])
            want = functional(op, inp)
        call_out_op(op, inp, outs)
        scales = outs["scales"].view(torch.uint8)
        assert torch.all(padding_scale_bytes(scales, rows, cols) == 0), f"{op}: padding scale rows not zeroed"
        assert_bytes_equal(outs["packed"], want[0], f"{op} packed")
        assert_bytes_equal(outs["scales"], want[1], f"{op} scales")


# C++ refusals: RuntimeError naming the argument, before any launch.
STATIC_BREAKS = dict(BROKEN_OUTPUTS, device=(lambda t: on_device(t, "cpu"), "must be a CUDA tensor"))


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("break_", STATIC_BREAKS)
def test_cuda_static_refusals(op, break_):
    make, words = STATIC_BREAKS[break_]
    assert_each_output_refused(op, gpu_inputs(6, 64, plain=False, seed=1), make, RuntimeError, words)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("output_first", (True, False), ids=("output_first", "other_first"))
def test_cuda_overlap_refusals(op, output_first):
    base = gpu_inputs(6, 64, plain=False, seed=2)
    for out_name, other in overlap_pairs(op):
        inp, outs, arena = with_overlap(op, base, filled_outputs(op, base), out_name, other, output_first)
        arena_before = arena.clone()
        with pytest.raises(RuntimeError, match=rf"{out_name} overlaps (the input )?{other}\b"):
            call_out_op(op, inp, outs)
        torch.cuda.synchronize()
        assert torch.equal(arena, arena_before), (out_name, other)


@pytest.mark.parametrize("fast", (True, False))
def test_cuda_4over6_code(fast):
    inp = gpu_inputs(6, 3072, plain=True, seed=3)
    for op in ("resnorm_quant", "nvfp4_quantize"):
        outs = filled_outputs(op, inp)
        call_out_op(op, inp, outs, fast=fast, code=21)  # 4over6, MSE, the fp16 error form
        expected = functional(op, inp, fast=fast, code=21)
        assert torch.equal(outs["packed"], expected[0]) and torch.equal(outs["scales"].view(torch.uint8), expected[1])
        outs = filled_outputs(op, inp)
        before = [t.clone() for t in outs.values()]
        with pytest.raises(RuntimeError, match="nvfp4_4over6_code"):
            call_out_op(op, inp, outs, code=2)
        torch.cuda.synchronize()
        assert all(torch.equal(a, b) for a, b in zip(before, outs.values()))


def _reference_steps(inp, steps):
    """The functional op applied ``steps`` times, each step's residual_out the next step's residual."""
    results, residual = [], inp["residual"]
    for _ in range(steps):
        packed, scales, residual = functional("resnorm_quant", dict(inp, residual=residual))
        results.append((packed, scales, residual))
    return results


@pytest.mark.parametrize("cols,rows", ((3072, 129), (3072, 2304), (5120, 17)))
def test_cuda_graph_static_buffers_in_place(cols, rows):
    inp = gpu_inputs(rows, cols, plain=True, seed=cols + rows)
    want = _reference_steps(inp, 3)
    residual = inp["residual"].clone()  # the static residual stream, updated in place
    packed, scales, _ = q.empty_resnorm_quant_outputs(inp["x"])
    static = dict(inp, residual=residual)

    def step():
        call_out_wrapper("resnorm_quant", static, dict(packed=packed, scales=scales, residual_out=residual))

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()  # warm-up outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    residual.copy_(inp["residual"])
    for k, (w_packed, w_scales, w_residual) in enumerate(want):
        packed.fill_(0xFF)
        scales.fill_(0xFF)
        graph.replay()
        torch.cuda.synchronize()
        assert_bytes_equal(packed, w_packed, f"replay {k} packed")
        assert_bytes_equal(scales, w_scales, f"replay {k} scales")
        assert_bytes_equal(residual, w_residual, f"replay {k} residual")


@pytest.mark.parametrize("cols,rows", ((3072, 129), (4096, 2304)))
def test_compile_fullgraph_in_place(cols, rows):
    torch._dynamo.reset()
    inp = gpu_inputs(rows, cols, plain=True, seed=cols * 5 + rows)
    want = _reference_steps(inp, 2)
    residual = inp["residual"].clone()
    packed, scales, _ = q.empty_resnorm_quant_outputs(inp["x"])

    def step(residual, x, gate, scale, shift, global_scale, packed, scales):
        q.resnorm_quant_out(residual, x, None, gate, scale, shift, global_scale, 1e-6, True, packed=packed,
                            scales=scales, residual_out=residual)
        return residual * 1  # a read of the updated residual inside the graph (exact: keeps -0.0)

    compiled = torch.compile(step, fullgraph=True, backend="inductor")
    for k, (w_packed, w_scales, w_residual) in enumerate(want):
        read_back = compiled(residual, inp["x"], inp["gate"], inp["scale"], inp["shift"], inp["global_scale"], packed,
                         scales)
        torch.cuda.synchronize()
        assert_bytes_equal(packed, w_packed, f"step {k} packed")
        assert_bytes_equal(scales, w_scales, f"step {k} scales")
        assert_bytes_equal(residual, w_residual, f"step {k} residual")
        assert_bytes_equal(read_back, w_residual, f"step {k}: the graph's read of the residual")
