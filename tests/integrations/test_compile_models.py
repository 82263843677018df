"""Converted models under torch.compile (CPU, ``backend="aot_eager"``): compiled once per input shape, with
``fullgraph=True`` and with diffusers' regional compilation, for every model family, both formats and both
modes; the compiled output equals eager bit for bit, fused equals unfused, ``fused_path_stats`` reports what
the compiled graphs run; and what the conversion decided stays right after ``load_state_dict``.

``torch._dynamo.config.error_on_recompile`` turns any recompilation into an error, so "compiles once" is
asserted by running the compiled model several times."""

from __future__ import annotations

import functools
import os
from typing import Any, Callable, Dict, List, Tuple

import pytest
import torch

import qwen_resnorm_fp4.integrations.diffusers as qd
from qwen_resnorm_fp4.integrations._state import converted_blocks

from helpers.diffusers_models import (build_small, flux, format_model_sweep, make_inputs, needs_diffusers, qwen21,
                                      real_width_qwen_image, run, wan)
from helpers.inductor_code import deterministic_compilation, deterministic_flags, write_compilations
from helpers.reliability import first_difference, rel_err
from helpers.tiers import sweep

pytestmark = needs_diffusers

RUNS = 6


def qwen_image(zero_cond_t: bool):
    return build_small(zero_cond_t), [make_inputs(1, 7, zero_cond_t, small=True, seed=5)]


CASES: Dict[str, Callable[[], Any]] = {
    "qwen_image": lambda: qwen_image(False),
    "qwen_image_zero_cond_t": lambda: qwen_image(True),
    "qwen_image21": lambda: qwen21(2, 32, 2, True)[:2],
    "flux": lambda: flux(2, 32, 1)[:2],
    "wan21": lambda: wan(2, 32, 128, 2, False)[:2],
    "wan22_ti2v": lambda: wan(2, 32, 128, 2, True)[:2],  # a timestep per token: per-token modulation
}


def converted(case: str, fmt: str, mode: str = "fused"):
    model, inputs = CASES[case]()
    qd.convert_transformer(model, format=fmt, mode=mode, linears="all", calibration_inputs=inputs,
                           allow_cpu=True)
    return model, inputs[0]


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def compiled_runs(model, inp: Dict[str, Any], compiled: Callable, runs: int = RUNS) -> List[torch.Tensor]:
    """``runs`` forwards of ``compiled`` with recompilation an error, each output cloned as it comes (a CUDA
    graph's output is overwritten by its next replay, and reading it afterwards raises)."""
    outs = []
    with torch._dynamo.config.patch(error_on_recompile=True), torch.no_grad():
        for _ in range(runs):
            outs.append(compiled(**inp)[0].clone())
    return outs


def unfused_runs(model, inp: Dict[str, Any], compiled: Callable) -> List[torch.Tensor]:
    """The model switched to the unfused mode, then three forwards of ``compiled``: the first may recompile (the
    mode is a guard), the other two may not (:func:`compiled_runs`)."""
    qd.set_mode(model, "unfused")
    with torch.no_grad():
        first = compiled(**inp)[0].clone()
    return [first] + compiled_runs(model, inp, compiled, runs=2)


#: Qwen-Image 2.1's model forward (diffusers 0.42.1) breaks the graph outside its blocks (its rotary embedding
#: calls ``tolist()`` on the padding mask), converted or not: it compiles by regions.
WHOLE_MODEL_CASES = [c for c in CASES if c != "qwen_image21"]


def test_qwen_image21_bf16_model_has_its_own_graph_break():
    model, inputs = CASES["qwen_image21"]()
    with pytest.raises(torch._dynamo.exc.Unsupported, match="tolist"), torch.no_grad():
        torch.compile(model, fullgraph=True, backend="aot_eager")(**inputs[0])


def family_format_sweep(cases: List[str]):
    """Every family in both formats; by default every family in FP8 and Qwen-Image in NVFP4 too (the families
    share the segments and the formats share the families' forwards; each NVFP4 case costs seconds of the CPU
    reference)."""
    values = [(case, fmt) for case in cases for fmt in ("fp8", "nvfp4")]
    default = [(case, "fp8") for case in cases] + [("qwen_image", "nvfp4")]
    return sweep("case,fmt", values, default, ids=[f"{case}-{fmt}" for case, fmt in values])


@family_format_sweep(WHOLE_MODEL_CASES)
def test_fullgraph_compiles_once_equals_eager_and_unfused(case, fmt):
    """``torch.compile(model, fullgraph=True)`` (``aot_eager``: the ops as traced): one graph for repeated
    forwards, the eager bytes, no eager counter moved and every segment fused in the graph; then the unfused
    mode: one recompile (the mode is a guard), then none, and the same bytes."""
    model, inp = converted(case, fmt)
    eager = run(model, inp)
    eager_stats = qd.fused_path_stats(model, reset=True)
    assert eager_stats["fallback"] == 0 and eager_stats["fused"] > 0, eager_stats
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    for out in compiled_runs(model, inp, compiled):
        assert torch.equal(out, eager)
    stats = qd.fused_path_stats(model)
    # compiled calls count nothing; the traced graph's segments all run fused
    assert (stats["fused"], stats["unfused"], stats["fallback"]) == (0, 0, 0), stats
    segments = {k for blk in qd.fused_path_stats(model, per_block=True)["blocks"].values() for k in blk}
    assert stats["compiled"] == {k: ["fused"] for k in sorted(segments)}, stats["compiled"]

    unfused = unfused_runs(model, inp, compiled)
    assert all(torch.equal(eager, t) for t in unfused), "fused != unfused under torch.compile"
    assert qd.fused_path_stats(model)["compiled"]["img"] == ["fused", "unfused"]


@sweep("zero_cond_t", [False, True], [False], ids=["plain", "zero_cond_t"])
def test_inductor_fused_equals_unfused(zero_cond_t):
    """Inductor's own code for the glue (CPU here): the fused and the unfused graph, two compilations, the same
    bytes (inductor's GPU autotuning picks among reduction orders by timing: see the GPU test below)."""
    model, inp = converted("qwen_image_zero_cond_t" if zero_cond_t else "qwen_image", "fp8")
    outs = {}
    for mode in ("fused", "unfused"):
        torch._dynamo.reset()
        qd.set_mode(model, mode)
        outs[mode] = compiled_runs(model, inp, torch.compile(model, fullgraph=True), runs=2)
    assert all(torch.equal(outs["fused"][0], t) for t in outs["fused"] + outs["unfused"])


#: What the eager-casts test compiles with: inductor rounding to bf16 where eager rounds.
EAGER_CASTS = {"emulate_precision_casts": True}


@functools.cache
def unconverted_elements_off_eager() -> Tuple[int, int]:
    """(elements that differ, elements) between the unconverted small Qwen-Image compiled with
    :data:`EAGER_CASTS` and its eager output: this torch's own property, computed once per session."""
    bf16, inputs = CASES["qwen_image"]()
    torch._dynamo.reset()
    plain = compiled_runs(bf16, inputs[0], torch.compile(bf16, fullgraph=True, options=EAGER_CASTS), runs=1)[0]
    torch._dynamo.reset()
    return int((plain != run(bf16, inputs[0])).sum()), plain.numel()


@pytest.mark.parametrize("fmt", ["fp8", "nvfp4"])
@pytest.mark.exhaustive  # more CPU inductor compilations; CI runs them with the sweep's CPU cases
def test_inductor_with_eager_casts_equals_eager(fmt):
    """Inductor with ``emulate_precision_casts`` (bf16 intermediates rounded where eager rounds them, what the
    docs recommend for eager's numerics): the compiled converted model's bytes are its eager bytes (CPU), where
    this torch gives the unconverted model's eager bytes so (torch's own property, docs/diffusers.md): our ops,
    fakes and segments take nothing from the casts inductor emulates."""
    differ, numel = unconverted_elements_off_eager()
    if differ:
        pytest.skip(f"torch {torch.__version__}'s inductor with emulate_precision_casts gives the unconverted "
                    f"model {differ} of {numel} elements other than eager: no eager bytes to keep")
    model, inp = converted("qwen_image", fmt)
    eager = run(model, inp)
    compiled = torch.compile(model, fullgraph=True, options=EAGER_CASTS)
    out = compiled_runs(model, inp, compiled, runs=1)[0]
    assert torch.equal(out, eager), first_difference(out, eager)


@family_format_sweep(["qwen_image", "qwen_image21", "flux", "wan21", "wan22_ti2v"])
def test_regional_compilation_compiles_one_block(case, fmt):
    """diffusers' ``compile_repeated_blocks``: one graph serves every block (the blocks' per-layer scales are
    tensors, not constants), no graph break inside a block, and no recompile over repeated forwards; then the
    unfused mode: one more graph per block class with a segment (the mode is a guard), then none, and the same
    bytes."""
    model, inp = converted(case, fmt)
    eager = run(model, inp)
    counters = torch._dynamo.utils.counters
    counters.clear()
    model.compile_repeated_blocks(fullgraph=True, backend="aot_eager")
    for out in compiled_runs(model, inp, model):
        assert torch.equal(out, eager)
    assert not counters["graph_break"], dict(counters["graph_break"])
    block_classes = {type(m).__name__ for m in model.modules()} & set(model._repeated_blocks)
    assert counters["stats"]["unique_graphs"] == len(block_classes), (counters["stats"], block_classes)

    unfused = unfused_runs(model, inp, model)  # its first forward recompiles each block class with a segment
    assert all(torch.equal(eager, t) for t in unfused), "fused != unfused under regional compilation"
    assert not counters["graph_break"], dict(counters["graph_break"])
    converted_classes = {type(block).__name__ for _, block, state in converted_blocks(model) if state.stats}
    assert converted_classes and converted_classes <= block_classes, (converted_classes, block_classes)
    assert counters["stats"]["unique_graphs"] == len(block_classes) + len(converted_classes), (
        counters["stats"], block_classes, converted_classes)
    compiled = qd.fused_path_stats(model)["compiled"]
    assert compiled and all(paths == ["fused", "unfused"] for paths in compiled.values()), compiled


def test_conversions_of_one_class_share_the_compiled_blocks():
    """Two conversions of one model class (Wan 2.2's two transformers), and convert -> restore -> convert again:
    the blocks compiled for one serve the other, no recompile; both report the compiled paths."""
    first, inp = converted("qwen_image", "fp8")
    second, _ = converted("qwen_image", "fp8")
    first.compile_repeated_blocks(fullgraph=True, backend="aot_eager")
    second.compile_repeated_blocks(fullgraph=True, backend="aot_eager")
    compiled_runs(first, inp, first, runs=1)
    compiled_runs(second, inp, second, runs=2)  # error_on_recompile
    for _ in range(3):
        qd.restore_transformer(second)
        qd.convert_transformer(second, format="fp8", linears="all", calibration_inputs=[inp], allow_cpu=True)
        second.compile_repeated_blocks(fullgraph=True, backend="aot_eager")
        compiled_runs(second, inp, second, runs=1)
    assert qd.fused_path_stats(first)["compiled"]["img"] == ["fused"]


def test_converted_model_deepcopies_and_pickles():
    import copy
    import io

    model, inp = converted("qwen_image", "fp8")
    eager = run(model, inp)
    twin = copy.deepcopy(model)
    assert torch.equal(run(twin, inp), eager)
    qd.fused_path_stats(model, reset=True)
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    assert torch.equal(run(loaded, inp), eager)
    assert qd.fused_path_stats(loaded)["fused"] == qd.conversion_info(loaded).segments_per_forward
    qd.restore_transformer(loaded)
    compiled = torch.compile(twin, fullgraph=True, backend="aot_eager")
    compiled_runs(twin, inp, compiled, runs=2)
    assert qd.fused_path_stats(twin)["compiled"]["img"] == ["fused"]
    # the copy's hooks are its own: restoring the copy leaves the original's load checks in place
    qd.restore_transformer(twin)
    sd = model.state_dict()
    key = "transformer_blocks.0.img_mlp.net.0.proj.input_scale"
    sd[key] = torch.zeros_like(sd[key])
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        model.load_state_dict(sd)


@pytest.mark.parametrize("fmt", ["fp8", "nvfp4"])
def test_compiled_model_guards_no_layer_tensor_against_aliasing(fmt):
    """The quantized layers hold their tensors as parameters, which dynamo leaves out of its no-aliasing guard:
    that guard checks each of its tensors against all the others on every compiled call, so buffers would cost
    time quadratic in the number of converted layers (milliseconds a forward for a 60-block model)."""
    model, inp = converted("qwen_image", fmt)
    compiled_runs(model, inp, torch.compile(model, fullgraph=True, backend="aot_eager"), runs=1)
    (entry,) = torch._dynamo.eval_frame._debug_get_cache_entry_list(type(model).forward.__code__)
    sources = entry.guard_manager.no_tensor_aliasing_sources
    assert any("hidden_states" in s for s in sources), sources  # the guard holds the model's inputs
    assert not [s for s in sources if "transformer_blocks" in s], sources


@pytest.mark.parametrize("fmt", ["fp8", "nvfp4"])
@pytest.mark.parametrize("case", list(CASES))
def test_converted_model_dtype_stays_bf16(case, fmt):
    """diffusers' ``model.dtype`` is the first floating-point parameter's: the quantized layers' parameters
    (E4M3 is floating point) come after the model's own bf16 ones, so pipelines still cast inputs to bf16."""
    model, _ = converted(case, fmt)
    assert model.dtype == torch.bfloat16


def test_second_resolution_recompiles_at_most_once():
    model, _ = converted("qwen_image", "fp8")
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    small = make_inputs(1, 7, False, small=True, seed=5)
    large = make_inputs(1, 9, False, small=True, seed=6)  # another text length: another sequence length
    counters = torch._dynamo.utils.counters
    counters.clear()
    with torch.no_grad():
        compiled(**small)
        compiled(**large)
        frames = counters["stats"]["unique_graphs"]
        with torch._dynamo.config.patch(error_on_recompile=True):
            for inp in (small, large, small, large):
                a = compiled(**inp)[0]
                assert torch.equal(a, run(model, inp))
    assert frames <= 2, frames


def test_regional_dynamic_compilation_serves_every_resolution():
    """``compile_repeated_blocks(dynamic=True)``: the graphs of the first forward serve every later text length
    and image size, no recompile. That is two graphs, for the BF16 model too: the first block's input is a
    view, whose base dynamo guards on, the other blocks' are not. (Compiled whole, diffusers' model forward
    specializes on the text length and the image shapes: a new one recompiles, see above.)"""
    model, _ = converted("qwen_image", "fp8")
    inputs = [make_inputs(1, n, False, small=True, seed=n) for n in (7, 9, 12)]
    other_image = make_inputs(1, 7, False, small=True, seed=13)
    other_image.update(hidden_states=other_image["hidden_states"][:, :16], img_shapes=[[(1, 4, 4)]])
    inputs.append(other_image)
    eager = [run(model, inp) for inp in inputs]  # before compiling: compile_repeated_blocks works in place
    counters = torch._dynamo.utils.counters
    counters.clear()
    model.compile_repeated_blocks(fullgraph=True, backend="aot_eager", dynamic=True)
    with torch.no_grad():
        model(**inputs[0])
    first = counters["stats"]["unique_graphs"]
    assert first <= 2, first
    outs = compiled_runs_each(model, inputs, model)
    assert all(torch.equal(out, want) for out, want in zip(outs, eager))
    assert counters["stats"]["unique_graphs"] == first


def compiled_runs_each(model, inputs, compiled) -> List[torch.Tensor]:
    """One compiled forward per input (:func:`compiled_runs`: recompilation an error)."""
    return [compiled_runs(model, inp, compiled, runs=1)[0] for inp in inputs]


def test_compile_does_not_decline_and_stats_name_the_compiled_decline():
    """A fallback inside a compiled graph is reported: the segment's compiled path is the decline reason."""
    model, inp = converted("qwen_image", "fp8")
    qd.set_mode(model, "fused")
    for _, _block, state in converted_blocks(model):
        state.allow_cpu = False  # the CPU reference refused: every fused segment declines on CPU
    eager = run(model, inp)
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    out = compiled_runs(model, inp, compiled, runs=2)[0]
    assert torch.equal(out, eager)
    assert qd.fused_path_stats(model)["compiled"]["img"] == ["cpu_tensors"]


# ------------------------------------------------------------------------------------------------------------
# Loaded state
# ------------------------------------------------------------------------------------------------------------


def _bf16_layer_outputs(model, inp, name: str) -> Dict[str, torch.Tensor]:
    seen = {}
    handle = model.get_submodule(name).register_forward_hook(lambda m, a, o: seen.setdefault("out", o))
    try:
        run(model, inp)
    finally:
        handle.remove()
    return seen["out"]


def test_load_state_dict_with_differing_qkv_scales_rederives_the_shared_quantization():
    """A checkpoint whose to_k input_scale differs from to_q's: to_k must be fed its own quantization (it was
    fed to_q's, and its output was 4x off), fused and unfused, eager and compiled."""
    model, inp = converted("qwen_image", "fp8")
    name = "transformer_blocks.0.attn.to_k"
    layer = model.get_submodule(name)
    sd = model.state_dict()
    sd[f"{name}.input_scale"] = sd[f"{name}.input_scale"] * 4
    model.load_state_dict(sd)
    stats = qd.fused_path_stats(model, per_block=True, reset=True)
    assert "img.attn" not in stats["blocks"]["transformer_blocks.0"]
    assert "img.attn" in stats["blocks"]["transformer_blocks.1"]
    info = qd.conversion_info(model)
    assert info.input_amax[name] == pytest.approx(float(layer.input_scale) * 448.0)
    assert info.segments_per_forward == sum(len(b) for b in stats["blocks"].values())
    # to_k's output is what an FP8 layer computes from its own input quantization
    captured = {}
    hook_in = layer.register_forward_hook(lambda m, a, o: captured.update(x=a[0], out=o))
    fused = run(model, inp)
    hook_in.remove()
    x = captured["x"]
    assert x.dtype == torch.bfloat16, "to_k was fed another layer's E4M3 activation"
    assert torch.equal(captured["out"], layer(x))
    qd.set_mode(model, "unfused")
    assert torch.equal(run(model, inp), fused)
    qd.set_mode(model, "fused")
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    assert torch.equal(compiled_runs(model, inp, compiled, runs=2)[0], fused)
    # equal scales again: the shared quantization comes back
    sd[f"{name}.input_scale"] = model.get_submodule("transformer_blocks.0.attn.to_q").input_scale.clone()
    model.load_state_dict(sd)
    assert "img.attn" in qd.fused_path_stats(model, per_block=True)["blocks"]["transformer_blocks.0"]


@pytest.mark.parametrize("fmt", ["fp8", "nvfp4"])
def test_load_state_dict_refuses_differing_swiglu_scales_and_changes_nothing(fmt):
    model, inputs = qwen21(2, 32, 2, True)[:2]
    qd.convert_transformer(model, format=fmt, linears="fc1", calibration_inputs=inputs, allow_cpu=True)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    sd = model.state_dict()
    key = next(k for k in sd if k.endswith("gate_layer.input_scale") or k.endswith("gate_layer.input_global_scale"))
    sd = {k: (v * 2 if k == key else v + 1 if v.dtype == torch.bfloat16 and "transformer_blocks.0." in k else v)
          for k, v in sd.items()}
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        model.load_state_dict(sd)
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before), "a refused load changed the model"


@pytest.mark.parametrize("fmt", ["fp8", "nvfp4"])
def test_load_state_dict_onto_meta_and_assign(fmt):
    """Loading meta tensors (a model being materialized, ``assign=True``) is not a value to check."""
    model, _ = converted("qwen_image", fmt)
    sd = {k: v.to("meta") for k, v in model.state_dict().items()}
    model.load_state_dict(sd, assign=True)
    assert all(t.device.type == "meta" for t in model.state_dict().values())


def test_load_state_dict_updates_the_amax_of_blocks_without_the_segment():
    """FLUX.1's single-stream blocks (linears="all" only): their layers' recorded input amax follows a load."""
    model, inputs = CASES["flux"]()
    qd.convert_transformer(model, format="fp8", linears="all", calibration_inputs=inputs, allow_cpu=True)
    name = next(n for n in qd.conversion_info(model).input_amax if n.startswith("single_transformer_blocks."))
    sd = model.state_dict()
    sd[f"{name}.input_scale"] = sd[f"{name}.input_scale"] * 2
    model.load_state_dict(sd)
    assert qd.conversion_info(model).input_amax[name] == pytest.approx(float(sd[f"{name}.input_scale"]) * 448.0)


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), 1e-45])
def test_load_state_dict_refuses_a_bad_input_scale(bad):
    model, _ = converted("qwen_image", "fp8")
    sd = model.state_dict()
    key = "transformer_blocks.1.img_mlp.net.0.proj.input_scale"
    sd[key] = torch.full_like(sd[key], bad)
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        model.load_state_dict(sd)


# ------------------------------------------------------------------------------------------------------------
# GPU: inductor, real width
# ------------------------------------------------------------------------------------------------------------


@pytest.mark.gpu
@format_model_sweep()
def test_gpu_compiled_fused_equals_unfused(fmt, zero_cond_t):
    """The CUDA kernels as traced (``aot_eager``: the graph's own ops, no code generation): one graph for repeated
    forwards, every segment fused in it, the bytes of the traced code run eagerly, close to eager, and fused ==
    unfused bit for bit."""
    model, inputs = real_width_qwen_image(fmt, zero_cond_t)
    inp = inputs[0]
    eager = run(model, inp)
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    fused = compiled_runs(model, inp, compiled, runs=3)
    assert all(torch.equal(t, fused[0]) for t in fused)
    if fmt == "fp8":  # NVFP4's traced tensor-core GEMM sums with an fp32 output: last bits may differ from eager
        # the traced code run eagerly: its attention rotates on real pairs (integrations/_attention.py), which
        # may differ from the CUDA complex kernel in a last fp32 bit
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(torch.compiler, "is_compiling", lambda: True)
            traced_eager = run(model, inp)
        assert torch.equal(fused[0], traced_eager)
    assert rel_err(fused[0], eager) < 1e-2
    assert all(p == ["fused"] for p in qd.fused_path_stats(model)["compiled"].values())
    qd.set_mode(model, "unfused")
    with torch.no_grad():
        assert torch.equal(compiled(**inp)[0], fused[0]), "fused != unfused under torch.compile"


@pytest.mark.gpu
def test_gpu_inductor_deterministic_fused_equals_unfused(tmp_path):
    """Inductor with its deterministic mode (``torch._inductor.config.deterministic``: no timing-based choice
    that changes numerics): the fused and the unfused graph, two fresh compilations
    (``helpers.inductor_code.deterministic_compilation``, caches off), every kernel of both made in that mode,
    the same bytes. Where they differ, both compilations' generated code is written for a diff (into
    ``$QWEN_FP4_TEST_ARTIFACTS``, which scripts/gpu_check.sh sets, else the test's tmp_path), with the process's
    GPU numerics settings."""
    import torch._inductor.config as inductor_config
    from torch._inductor.utils import run_and_get_code

    if not hasattr(inductor_config, "deterministic"):
        pytest.skip(f"torch {torch.__version__}'s inductor has no deterministic mode")
    model, inputs = real_width_qwen_image("fp8", False)
    inp = inputs[0]
    outs, codes = {}, {}
    for mode in ("fused", "unfused"):
        with deterministic_compilation():
            torch._dynamo.reset()
            qd.set_mode(model, mode)
            compiled = torch.compile(model, fullgraph=True)
            first, codes[mode] = run_and_get_code(compiled_runs, model, inp, compiled, 1)
            outs[mode] = first + compiled_runs(model, inp, compiled, runs=1)
    for mode, runs in outs.items():  # each compilation repeats its own bytes, and was deterministic
        assert torch.equal(runs[0], runs[1]), f"two forwards of the {mode} compilation differ"
        flags = deterministic_flags(codes[mode])
        assert flags[True] and not flags[False], f"the {mode} compilation's kernels, by deterministic mode: {flags}"
    fused, unfused = outs["fused"][0], outs["unfused"][0]
    if not torch.equal(fused, unfused):
        artifacts = os.environ.get("QWEN_FP4_TEST_ARTIFACTS") or str(tmp_path)
        where = write_compilations(codes, os.path.join(artifacts, "inductor_fused_unfused"))
        pytest.fail(f"fused != unfused: {first_difference(fused, unfused)}; the code of both and the settings: "
                    f"{where}")
    assert qd.fused_path_stats(model)["compiled"]["img"] == ["fused", "unfused"]


#: mode name: (torch.compile keywords, the largest relative distance from eager). "eager-casts" is the README's
#: way to compile: inductor rounds between ops as eager does, so only its reduction orders stay its own.
INDUCTOR_MODES: Dict[str, Tuple[Dict[str, Any], float]] = {
    "default": ({}, 1e-2),
    "reduce-overhead": ({"mode": "reduce-overhead"}, 1e-2),
    "max-autotune": ({"mode": "max-autotune"}, 1e-2),
    "eager-casts": ({"options": {"emulate_precision_casts": True}}, 2e-3),
}
INDUCTOR_CASES = [(mode, fmt) for mode in INDUCTOR_MODES for fmt in ("fp8", "nvfp4")]


@pytest.mark.gpu
# by default each mode but max-autotune (it benchmarks candidate kernels while compiling) once, each format once
@sweep("mode_name,fmt", INDUCTOR_CASES, [("default", "nvfp4"), ("reduce-overhead", "fp8"), ("eager-casts", "fp8")],
       ids=[f"{mode}-{fmt}" for mode, fmt in INDUCTOR_CASES])
def test_gpu_inductor_compiles_once(mode_name, fmt):
    """Inductor, fullgraph, in each mode (default; "reduce-overhead": CUDA graphs; "max-autotune": autotuned
    GEMMs of the unconverted Linears, CUDA graphs; "eager-casts": ``emulate_precision_casts``): one graph for
    repeated forwards of one shape, every segment fused in it, the forwards the same bytes, close to eager (with
    eager's casts, closer). (Inductor's default autotuning picks reduction orders by timing, so two compilations
    may differ in last bits: bytes are compared within a compilation here; across modes, by ``aot_eager`` and by
    the deterministic mode above.)"""
    model, inputs = real_width_qwen_image(fmt, False)
    inp = inputs[0]
    eager = run(model, inp).float()
    kwargs, max_distance = INDUCTOR_MODES[mode_name]
    compiled = torch.compile(model, fullgraph=True, **kwargs)
    outs = compiled_runs(model, inp, compiled, runs=4)
    assert all(torch.equal(outs[0], t) for t in outs)
    distance = rel_err(outs[0], eager)
    assert distance < max_distance, f"{mode_name}: {distance:.2e} from eager"
    assert all(p == ["fused"] for p in qd.fused_path_stats(model)["compiled"].values())


def other_image_size(inp: Dict[str, Any], height: int, width: int, seed: int) -> Dict[str, Any]:
    """``inp`` with another latent image (1, height, width): another image token count, the same text."""
    g = torch.Generator().manual_seed(seed)
    hidden = inp["hidden_states"]
    latents = torch.randn(hidden.shape[0], height * width, hidden.shape[2], generator=g).to(hidden.dtype)
    return dict(inp, hidden_states=latents.to(hidden.device), img_shapes=[[(1, height, width)]] * hidden.shape[0])


@pytest.mark.gpu
def test_gpu_inductor_second_image_size_recompiles_at_most_once():
    """Inductor at real width, as bench_model.py --peers runs it (another image token count, the same text): the
    second size costs one recompilation, then neither size recompiles; every segment fused, and each size's
    compiled output close to eager."""
    model, inputs = real_width_qwen_image("fp8", False)
    sizes = [inputs[0], other_image_size(inputs[0], 64, 96, seed=3)]  # 4096 and 6144 image tokens
    eager = [run(model, inp).float() for inp in sizes]
    compiled = torch.compile(model, fullgraph=True)
    counters = torch._dynamo.utils.counters
    counters.clear()
    with torch.no_grad():
        for inp in sizes:
            compiled(**inp)
    graphs = counters["stats"]["unique_graphs"]
    assert graphs <= 2, f"{graphs} graphs for two image sizes (TORCH_LOGS=recompiles says why)"
    outs = compiled_runs_each(model, sizes + sizes, compiled)  # error_on_recompile: a recompile raises its reason
    for out, want in zip(outs, eager + eager):
        assert rel_err(out, want) < 1e-2
    assert all(p == ["fused"] for p in qd.fused_path_stats(model)["compiled"].values())
