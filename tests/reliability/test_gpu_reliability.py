"""GPU reliability (all marked gpu; skipped without CUDA and the compiled library):

(a) more than 2^31 elements (x, residual: 700,000 x 3072 bf16, 4.3 GB each; marked slow): the fused op,
    resnorm and nvfp4_quantize run, fused == unfused over the whole tensor, and on row windows at the
    start, around element 2^30 (byte offset 2^31 of the bf16 tensors), around element 2^31 (byte offset
    2^32) and at the end: residual_out exact against the reference, packed and scales (read through the
    128x4 offsets) exact against the reference quantizer of the GPU's y, padding rows zero;
(b) repeated calls give identical bytes (10 calls);
(c) the ops launch on the caller's current stream, and four streams running them at once give the serial
    results;
(d) on a machine with two GPUs: tensors on cuda:1 give the bytes of the same computation on cuda:0, the
    outputs live on cuda:1, the kernels run there (profiler) on cuda:1's current stream, and the current
    device is unchanged — also when it is 0 while the inputs are on cuda:1.
"""

from __future__ import annotations

import pytest
import torch

import qwen_resnorm_fp4 as q
from qwen_resnorm_fp4 import reference
from helpers.reliability import (CUDA_OK, as_bits, block_inputs, extra_kwargs, first_difference, logical_scales,
                                 padding_scale_bytes, resnorm_args, same_bits)

pytestmark = pytest.mark.gpu

TWO_GPUS = CUDA_OK and torch.cuda.device_count() >= 2


def all_outputs(kw, G, fast, eps=1e-6):
    """Every output of the three ops for one input dict (same device as the inputs)."""
    packed, scales, r_out = q.resnorm_quant(*resnorm_args(kw), G, eps, fast, **extra_kwargs(kw))
    y, r_out2 = q.resnorm(*resnorm_args(kw), eps, **extra_kwargs(kw))
    packed_u, scales_u = q.nvfp4_quantize(y, G, fast)
    return dict(packed=packed, scales=scales, residual_out=r_out, y=y, residual_out_2=r_out2, packed_u=packed_u,
                scales_u=scales_u)


def assert_same_outputs(a, b, what):
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, f"{what}: {k} dtype/shape"
        assert torch.equal(as_bits(a[k]).cpu(), as_bits(b[k]).cpu()), f"{what}: {k}: {first_difference(a[k], b[k])}"


# ---------------------------------------------------------------------------------------------------
# (a) more than 2^31 elements
# ---------------------------------------------------------------------------------------------------

BIG_ROWS, BIG_COLS, BIG_BATCHES = 700_000, 3072, 4


def _windows():
    per = BIG_ROWS // BIG_BATCHES
    e30, e31 = (1 << 30) // BIG_COLS, (1 << 31) // BIG_COLS  # rows holding elements 2^30 and 2^31
    return [(0, 300), (e30 - 150, e30 + 150), (per - 150, per + 150), (e31 - 150, e31 + 150),
            (BIG_ROWS - 300, BIG_ROWS)]


def _check_window(a, b, kw, G, fast, packed, scales, r_out, y):
    """Rows a..b-1 against the reference: rows are independent, so the reference runs on the slice with
    one modulation row per token (the per-batch form with one row per batch)."""
    per = BIG_ROWS // BIG_BATCHES
    rows = torch.arange(a, b, device="cuda")
    batch = rows // per
    sl = lambda t: t.reshape(-1, BIG_COLS)[a:b]  # noqa: E731
    gate, scale, shift = kw["gate"][batch], kw["scale"][batch], kw["shift"][batch]
    _, r_ref = reference.resnorm(sl(kw["residual"]), sl(kw["x"]), kw["bias"], gate, scale, shift, 1e-6)
    where = f"rows {a}..{b - 1}"
    assert same_bits(sl(r_out), r_ref), f"{where}: residual_out vs reference: {first_difference(sl(r_out), r_ref)}"
    from qwen_resnorm_fp4.testing import gpu_rcp

    p_ref, s_ref = reference.nvfp4_quantize(sl(y), G, fast, rcp=gpu_rcp if fast else None)
    assert torch.equal(packed[a:b], p_ref), f"{where}: packed: {first_difference(packed[a:b], p_ref)}"
    got_sf = logical_scales(scales, b - a, BIG_COLS, first_row=a)
    want_sf = logical_scales(s_ref, b - a, BIG_COLS)
    assert torch.equal(got_sf, want_sf), f"{where}: scales: {first_difference(got_sf, want_sf)}"


@pytest.mark.slow
def test_more_than_2_31_elements():
    assert BIG_ROWS * BIG_COLS > 2 ** 31
    free, _ = torch.cuda.mem_get_info()
    if free < 48 * 2 ** 30:
        pytest.skip(f"needs ~48 GiB of free GPU memory, {free / 2 ** 30:.1f} GiB free")
    g = torch.Generator(device="cuda").manual_seed(2024)
    shape = (BIG_BATCHES, BIG_ROWS // BIG_BATCHES, BIG_COLS)
    kw = dict(x=torch.randn(shape, generator=g, device="cuda", dtype=torch.bfloat16),
              residual=torch.randn(shape, generator=g, device="cuda", dtype=torch.bfloat16).mul_(4),
              bias=(torch.randn(BIG_COLS, generator=g, device="cuda") * 0.1).bfloat16(),
              gate=(torch.randn(BIG_BATCHES, BIG_COLS, generator=g, device="cuda") * 0.5 + 0.5).bfloat16(),
              scale=(torch.randn(BIG_BATCHES, BIG_COLS, generator=g, device="cuda") * 0.3).bfloat16(),
              shift=(torch.randn(BIG_BATCHES, BIG_COLS, generator=g, device="cuda") * 0.3).bfloat16(),
              weight=None, norm_bias=None, modulate_index=None)
    G = torch.tensor([100.0], device="cuda")

    packed, scales, r_out = q.resnorm_quant(*resnorm_args(kw), G, 1e-6, True)
    assert packed.shape == (BIG_ROWS, BIG_COLS // 2) and scales.shape == (700_032, BIG_COLS // 16)
    assert r_out.shape == shape
    y, r_out2 = q.resnorm(*resnorm_args(kw), 1e-6)
    assert torch.equal(as_bits(r_out), as_bits(r_out2)), "residual_out: resnorm_quant != resnorm"
    del r_out2
    for a, b in _windows():
        _check_window(a, b, kw, G, True, packed, scales, r_out, y)
    assert not padding_scale_bytes(scales, BIG_ROWS, BIG_COLS).any()

    # the standalone quantizer at the same size: equal to the fused op (fast), and exact mode on the windows
    packed_u, scales_u = q.nvfp4_quantize(y, G, True)
    assert torch.equal(packed_u, packed) and torch.equal(scales_u, scales), "fused != nvfp4_quantize(resnorm)"
    del packed_u, scales_u, packed, scales
    packed_e, scales_e = q.nvfp4_quantize(y, G, False)
    for a, b in _windows():
        _check_window(a, b, kw, G, False, packed_e, scales_e, r_out, y)
    assert not padding_scale_bytes(scales_e, BIG_ROWS, BIG_COLS).any()
    torch.cuda.synchronize()


# ---------------------------------------------------------------------------------------------------
# (b) repeated calls
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("fast", (True, False), ids=("fast", "exact"))
@pytest.mark.parametrize("form", ("batch", "indexed"))
def test_repeated_calls_identical(form, fast):
    kw = block_inputs(2 * 2304, 3072, batches=2, form=form, affine=True, seed=21, device="cuda")
    G = torch.tensor([150.0], device="cuda")
    first = all_outputs(kw, G, fast)
    for i in range(10):
        assert_same_outputs(all_outputs(kw, G, fast), first, f"call {i + 2}")


# ---------------------------------------------------------------------------------------------------
# (c) streams
# ---------------------------------------------------------------------------------------------------


def _delayed_rewrite_then_run(stream, dst, src, kw, G, fast):
    """On ``stream``: spin ~tens of ms, overwrite x (dst) with src, then run the ops. If the ops launched on
    any other stream, they would read x before the rewrite."""
    with torch.cuda.stream(stream):
        torch.cuda._sleep(50_000_000)
        dst.copy_(src)
        return all_outputs(dict(kw, x=dst), G, fast)


@pytest.mark.parametrize("fast", (True, False), ids=("fast", "exact"))
def test_ops_run_on_the_current_stream(fast):
    kw = block_inputs(4 * 1024, 3072, batches=4, form="batch", seed=22, device="cuda")
    new_x = block_inputs(4 * 1024, 3072, batches=4, form="batch", seed=23, device="cuda")["x"]
    G = torch.tensor([100.0], device="cuda")
    want = all_outputs(dict(kw, x=new_x), G, fast)
    torch.cuda.synchronize()
    x_buf = kw["x"].clone()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    got = _delayed_rewrite_then_run(s, x_buf, new_x, kw, G, fast)
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    assert_same_outputs(got, want, "ops on a side stream after a delayed write")


@pytest.mark.parametrize("fast", (True, False), ids=("fast", "exact"))
def test_four_streams_concurrently(fast):
    n = 4
    inputs = [block_inputs(2 * 4096, 3072, batches=2, form=form, affine=bool(i % 2), seed=30 + i, device="cuda")
              for i, form in enumerate(("batch", "indexed", "shared", "batch"))]
    G = torch.tensor([120.0], device="cuda")
    serial = [all_outputs(kw, G, fast) for kw in inputs]
    torch.cuda.synchronize()

    main = torch.cuda.current_stream()
    streams = [torch.cuda.Stream() for _ in range(n)]
    results = [[] for _ in range(n)]
    for s in streams:
        s.wait_stream(main)  # the inputs were written on the main stream
    for _ in range(3):
        for i, s in enumerate(streams):  # interleaved launches: the streams' kernels overlap
            with torch.cuda.stream(s):
                for t in inputs[i].values():
                    if isinstance(t, torch.Tensor):
                        t.record_stream(s)  # used on s: not to be reused before s is done with it
                results[i].append(all_outputs(inputs[i], G, fast))
    for i, s in enumerate(streams):
        main.wait_stream(s)
        for outs in results[i]:
            for t in outs.values():
                t.record_stream(main)  # allocated on s, consumed on main
    torch.cuda.synchronize()
    for i in range(n):
        for rep, outs in enumerate(results[i]):
            assert_same_outputs(outs, serial[i], f"stream {i}, round {rep}")


# ---------------------------------------------------------------------------------------------------
# (d) two GPUs
# ---------------------------------------------------------------------------------------------------

two_gpus = pytest.mark.skipif(not TWO_GPUS, reason="needs two GPUs")


def _kernel_devices(fn):
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize(0)
        torch.cuda.synchronize(1)
    return {(e.name, getattr(e, "device_index", None)) for e in prof.events()
            if e.device_type == torch.autograd.DeviceType.CUDA}


@two_gpus
@pytest.mark.parametrize("fast", (True, False), ids=("fast", "exact"))
@pytest.mark.parametrize("form", ("batch", "indexed"))
def test_second_gpu_matches_first(form, fast):
    kw0 = block_inputs(2 * 1500, 3072, batches=2, form=form, affine=True, seed=40, device="cuda:0")
    kw1 = {k: (v.to("cuda:1") if isinstance(v, torch.Tensor) else v) for k, v in kw0.items()}
    G0, G1 = torch.tensor([90.0], device="cuda:0"), torch.tensor([90.0], device="cuda:1")
    torch.cuda.set_device(0)
    on0 = all_outputs(kw0, G0, fast)
    # current device 0, inputs on cuda:1
    on1 = all_outputs(kw1, G1, fast)
    assert torch.cuda.current_device() == 0, "an op changed the current device"
    for k, t in on1.items():
        assert t.device == torch.device("cuda:1"), f"{k} is on {t.device}"
    assert_same_outputs(on1, on0, "cuda:1 vs cuda:0 (current device 0)")
    # current device 1
    with torch.cuda.device(1):
        on1b = all_outputs(kw1, G1, fast)
        assert torch.cuda.current_device() == 1
    assert torch.cuda.current_device() == 0
    assert_same_outputs(on1b, on0, "cuda:1 vs cuda:0 (current device 1)")
    # the reference on cuda:1's own y (fast mode with the GPU's reciprocal)
    from qwen_resnorm_fp4.testing import gpu_rcp

    p_ref, s_ref = reference.nvfp4_quantize(on1["y"], G1, fast, rcp=gpu_rcp if fast else None)
    assert torch.equal(on1["packed"], p_ref) and torch.equal(on1["scales"], s_ref)


@two_gpus
def test_second_gpu_kernels_run_there():
    kw1 = block_inputs(2 * 1024, 3072, batches=2, seed=41, device="cuda:1")
    G1 = torch.tensor([90.0], device="cuda:1")
    torch.cuda.set_device(0)
    q.resnorm_quant(*resnorm_args(kw1), G1)  # warm-up
    found = _kernel_devices(lambda: q.resnorm_quant(*resnorm_args(kw1), G1))
    ours = {(n, d) for n, d in found if "resnorm" in n or "nvfp4" in n}
    assert ours, f"no kernel of ours in the profile: {found}"
    devices = {d for _, d in ours}
    if devices != {None}:  # FunctionEvent.device_index is there in current torch
        assert devices == {1}, f"kernels ran on {devices}"
    assert torch.cuda.current_device() == 0


@two_gpus
@pytest.mark.parametrize("fast", (True, False), ids=("fast", "exact"))
def test_second_gpu_uses_its_current_stream_while_device_0_is_current(fast):
    """cuda:1's current stream is a side stream, the current device is 0: the ops on cuda:1 tensors must
    launch on cuda:1's current stream (they read x only after a delayed write on that stream)."""
    kw1 = block_inputs(4 * 1024, 3072, batches=4, seed=42, device="cuda:1")
    new_x = block_inputs(4 * 1024, 3072, batches=4, seed=43, device="cuda:1")["x"]
    G1 = torch.tensor([100.0], device="cuda:1")
    with torch.cuda.device(1):
        want = all_outputs(dict(kw1, x=new_x), G1, fast)
        torch.cuda.synchronize()
        s1 = torch.cuda.Stream()
        s1.wait_stream(torch.cuda.current_stream())
    prev = torch.cuda.current_stream(1)
    x_buf = kw1["x"].clone()
    try:
        torch.cuda.set_device(1)
        torch.cuda.set_stream(s1)  # s1 becomes cuda:1's current stream
        assert torch.cuda.current_stream() == s1
        torch.cuda._sleep(50_000_000)  # on s1
        x_buf.copy_(new_x)  # on s1, after the sleep
        torch.cuda.set_device(0)  # back to device 0; cuda:1's current stream stays s1
        assert torch.cuda.current_device() == 0 and torch.cuda.current_stream(1) == s1
        got = all_outputs(dict(kw1, x=x_buf), G1, fast)
        assert torch.cuda.current_device() == 0
    finally:
        torch.cuda.set_device(1)
        torch.cuda.set_stream(prev)
        torch.cuda.set_device(0)
    torch.cuda.synchronize(1)
    assert_same_outputs(got, want, "cuda:1 side stream, current device 0")
