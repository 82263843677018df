#!/usr/bin/env python
"""A converted diffusers Qwen-Image transformer against BF16 (docs/performance.md, "A converted Qwen-Image
transformer" and "FP8"). GPU only; needs diffusers.

    python benchmarks/bench_model.py --out DIR           # NVFP4 and FP8, "all" and "fc1"
    python benchmarks/bench_model.py --quick             # FP8, linears="all" only, 3 timed forwards
    python benchmarks/bench_model.py --peers --out DIR   # compiled: ours against BF16 and torchao FP8

A real-width ``QwenImageTransformer2DModel`` (24 heads of 128: width 3072, random weights, ``--layers`` blocks)
at 6889 and 10209 image tokens, without and with ``zero_cond_t`` (diffusers 0.42's edit mode: the image
tokens are a target and a condition image, and every block modulates the condition's tokens with the zero
timestep's parameters through ``modulate_index``), in one run per case:

- the BF16 model's forward, then, converted in place (:func:`qwen_resnorm_fp4.integrations.diffusers.
  convert_transformer`, calibrated on every case's inputs of the model) for each ``format`` ("nvfp4", "fp8")
  and ``linears`` ("all", "fc1"): the forward with ``mode="fused"`` and with ``mode="unfused"``
  (:func:`~qwen_resnorm_fp4.integrations.diffusers.set_mode`, the same quantized weights); after
  :func:`~qwen_resnorm_fp4.integrations.diffusers.restore_transformer`, the BF16 forward again (its drift);
- forward time: :func:`timing.flushed_per_call_us` (CUDA events, cold L2), the median of ``--reps``; the ratio
  to the BF16 forward, and FP8's fused time over NVFP4's;
- the relative error of the output against the BF16 model's (Frobenius).

Prints the measurements (forward times, their ratios, relative errors); the goals they are read against are
stated in docs/performance.md. Checks, each failing the run (exit status 1) when False or not made: fused ==
unfused output bit for bit; the fused forward ran every segment fused (``fused_path_stats``:
``segments_per_forward`` fused, no fallback); the restored model's output equals the BF16 output bit for bit.
Writes ``bench_model.{csv,md}``.
"""

from __future__ import annotations

import argparse
import copy
import math
import os
import sys
import time
import warnings
from typing import Any, Callable, ContextManager, Dict, List, Optional, Sequence, Tuple

import torch

import harness
import results
import timing

PROG = "bench_model"
DEFAULT_TOKENS = (6889, 10209)
FORMATS = ("nvfp4", "fp8")
LINEARS = ("all", "fc1")
ZERO_COND_T = {"off": (False,), "on": (True,), "both": (False, True)}
#: --quick: these formats and linears presets only.
QUICK_FORMATS, QUICK_LINEARS = ("fp8",), ("all",)
REQUIRED_CHECKS = ("fused_equals_unfused", "no_fallback", "restored_equals_bf16")
CSV_FIELDS = ["tokens", "zero_cond_t", "image_shapes", "batch", "format", "linears", "bf16_ms", "bf16_after_ms",
              "fused_ms", "unfused_ms", "fused_over_bf16", "unfused_over_bf16", "fp8_over_nvfp4", "rel_err_vs_bf16",
              "fused_segments", "fallbacks", "decline_reasons", "fused_equals_unfused", "no_fallback",
              "restored_equals_bf16"]


def image_shapes(tokens: int, zero_cond_t: bool) -> List[Tuple[int, int, int]]:
    """One sample's ``img_shapes`` for ``tokens`` latent tokens (after the 2x2 patchify): (1, h, w) with h the
    largest divisor of ``tokens`` not above its square root (6889 = 83 x 83, 10209 = 83 x 123, 4096 = 64 x 64);
    with ``zero_cond_t`` the same tokens as a target (1, h, w - w // 2) and a condition image (1, h, w // 2)."""
    if tokens < 1:
        raise ValueError(f"tokens must be >= 1, got {tokens}")
    h = max(d for d in range(1, math.isqrt(tokens) + 1) if tokens % d == 0)
    w = tokens // h
    if not zero_cond_t:
        return [(1, h, w)]
    if w < 2:
        raise ValueError(f"tokens={tokens} cannot be split into a target and a condition image (zero_cond_t)")
    return [(1, h, w - w // 2), (1, h, w // 2)]


#: ``--text-mask``: "pipeline" passes the text mask as diffusers' QwenImagePipeline does (None when every text
#: token is valid, so attention needs no mask); "always" passes it even then (the attention then takes a
#: masked SDPA kernel).
TEXT_MASKS = ("pipeline", "always")


def model_inputs(batch: int, shapes: List[Tuple[int, int, int]], text_len: int, seed: int,
                 text_mask: str = "pipeline", device: str = "cuda") -> Dict[str, Any]:
    """``model.forward`` keyword arguments of one case (random latents and text, a shorter second prompt);
    ``text_mask``: one of :data:`TEXT_MASKS`."""
    if text_mask not in TEXT_MASKS:
        raise ValueError(f"text_mask must be one of {', '.join(TEXT_MASKS)}, got {text_mask!r}")
    g = torch.Generator().manual_seed(seed)
    tokens = sum(f * h * w for f, h, w in shapes)
    mask = torch.ones(batch, text_len, dtype=torch.bool)
    if batch > 1:
        mask[1, text_len // 2:] = False  # a shorter negative prompt
    keep_mask = text_mask == "always" or not bool(mask.all())
    return dict(
        hidden_states=torch.randn(batch, tokens, 64, generator=g).bfloat16().to(device),
        encoder_hidden_states=torch.randn(batch, text_len, 3584, generator=g).bfloat16().to(device),
        encoder_hidden_states_mask=mask.to(device) if keep_mask else None,
        timestep=torch.rand(batch, generator=g).to(device),
        img_shapes=[shapes] * batch,
        return_dict=False,
    )


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| (Frobenius, fp32)."""
    return ((out.float() - ref.float()).norm() / ref.float().norm()).item()


def stats_fields(stats: Dict[str, Any], segments: int) -> Dict[str, Any]:
    """A fused forward's ``fused_path_stats`` as row fields: segments fused, fallbacks and their reasons, and
    ``no_fallback`` (every one of ``segments`` fused, none unfused or fallen back)."""
    reasons = stats.get("decline_reasons") or {}
    return {"fused_segments": stats.get("fused"), "fallbacks": stats.get("fallback"),
            "decline_reasons": "; ".join(f"{k}: {v}" for k, v in sorted(reasons.items())),
            "no_fallback": stats.get("fused") == segments and stats.get("fallback") == 0
            and stats.get("unfused") == 0}


def case_name(r: Dict[str, Any]) -> str:
    """A row's case, as the lines printed and the check failures name it."""
    return (f"{r['tokens']} tokens{' zero_cond_t' if r['zero_cond_t'] else ''} batch {r['batch']} "
            f"format={r['format']} linears={r['linears']}")


def add_fp8_over_nvfp4(rows: List[Dict[str, Any]]) -> None:
    """``fp8_over_nvfp4`` on each FP8 row: its fused time over the NVFP4 row's of the same case and linears."""
    key = lambda r: (r["tokens"], r["zero_cond_t"], r["batch"], r["linears"])  # noqa: E731
    nvfp4 = {key(r): r for r in rows if r["format"] == "nvfp4"}
    for r in rows:
        other = nvfp4.get(key(r)) if r["format"] == "fp8" else None
        r["fp8_over_nvfp4"] = r["fused_ms"] / other["fused_ms"] if other else float("nan")


def table_lines(rows: Sequence[Dict[str, Any]]) -> List[str]:
    """The markdown table, one line per case, format and linears."""
    columns = ("image tokens", "zero_cond_t", "batch", "format", "linears", "bf16 ms", "fused ms", "unfused ms",
               "fused / bf16", "fp8 / nvfp4 (fused)", "rel err vs bf16", "fused == unfused",
               "segments fused (fallbacks)")
    return results.markdown_table(columns, (
        (r["tokens"], "yes" if r["zero_cond_t"] else "no", r["batch"], r["format"], r["linears"],
         f"{r['bf16_ms']:.2f}", f"{r['fused_ms']:.2f}", f"{r['unfused_ms']:.2f}", f"{r['fused_over_bf16']:.2f}x",
         results.fmt(r.get("fp8_over_nvfp4"), ".2f"), f"{r['rel_err_vs_bf16']:.4f}",
         results.yes_no(r.get("fused_equals_unfused")), f"{r.get('fused_segments')} ({r.get('fallbacks')})")
        for r in rows))


def byte_check_failures(rows: Sequence[Dict[str, Any]]) -> List[str]:
    """Every case whose checks (:data:`REQUIRED_CHECKS`) failed or were not made."""
    return results.check_failures(rows, REQUIRED_CHECKS, case_name)


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description="diffusers Qwen-Image transformer: BF16 against the NVFP4 and "
                                "FP8 conversions, fused and unfused (GPU only). Writes bench_model.{csv,md}.")
    p.add_argument("--layers", type=harness.positive_int, default=4,
                   help="transformer blocks (default 4; Qwen-Image has 60)")
    p.add_argument("--tokens", type=harness.positive_int_list, default=None,
                   help="comma-separated image token counts (default 6889,10209)")
    p.add_argument("--zero-cond-t", choices=tuple(ZERO_COND_T), default="both",
                   help="without (off), with (on) or both (default) zero_cond_t")
    p.add_argument("--formats", type=harness.choice_list(FORMATS, "formats"), default=None,
                   help="comma-separated subset of nvfp4,fp8 (default both)")
    p.add_argument("--linears", type=harness.choice_list(LINEARS, "linears presets"), default=None,
                   help="comma-separated subset of all,fc1 (default both)")
    p.add_argument("--batches", type=harness.positive_int_list, default=[1], help="comma-separated batch sizes "
                   "(default 1)")
    p.add_argument("--text-len", type=harness.positive_int, default=128, help="text tokens (default 128)")
    p.add_argument("--text-mask", choices=TEXT_MASKS, default="pipeline",
                   help="pipeline (default): no text mask where every text token is valid, as diffusers' "
                        "QwenImagePipeline passes it; always: the all-valid mask too (a masked attention kernel)")
    p.add_argument("--reps", type=harness.positive_int, default=10, help="timed forwards per case (default 10)")
    p.add_argument("--warmup", type=harness.positive_int, default=3, help="untimed forwards first (default 3)")
    p.add_argument("--quick", action="store_true",
                   help='format="fp8", linears="all" only, 3 timed forwards after 2')
    p.add_argument("--peers", action="store_true",
                   help="instead: ours compiled against BF16 eager / compiled and torchao FP8 compiled (batch 1; "
                        "writes bench_model_peers.{csv,md}; needs torchao)")
    p.add_argument("--variants", type=harness.choice_list(PEER_NAMES, "variants"), default=None,
                   help="with --peers: comma-separated subset of " + ",".join(PEER_NAMES) + " (default all)")
    p.add_argument("--attention-backend", default=None, metavar="NAME",
                   help="diffusers' attention backend for every variant (model.set_attention_backend, e.g. "
                        "_native_cudnn, _native_flash; default: diffusers' own choice)")
    p.add_argument("--profile", action="store_true",
                   help="with --peers: also each variant's GPU time per kernel kind in one profiled forward "
                        "(attention, GEMM, ours, inductor's, other), when its first kernel started and how long "
                        "the GPU waited for the host in it (the profiler's own overhead included; its Chrome "
                        "trace in --out), and its host time and synchronizing calls")
    harness.add_out_argument(p)
    return p


def argument_error(tokens: Sequence[int], zero_cond_t: Sequence[bool]) -> Optional[str]:
    """The error for a token count the cases cannot be made of, or None."""
    for t in tokens:
        for z in zero_cond_t:
            try:
                image_shapes(t, z)
            except ValueError as exc:
                return f"--tokens: {exc}"
    return None


def build_model(layers: int, zero_cond_t: bool, attention_backend: Optional[str] = None):
    """The real-width model on the GPU in bf16, random weights from seed 0 (the same for both zero_cond_t);
    ``attention_backend``: diffusers' ``set_attention_backend`` name for every variant (None: its default)."""
    from diffusers import QwenImageTransformer2DModel

    torch.manual_seed(0)
    with torch.device("cuda"):
        model = QwenImageTransformer2DModel(num_layers=layers, attention_head_dim=128, num_attention_heads=24,
                                            joint_attention_dim=3584, axes_dims_rope=(16, 56, 56),
                                            zero_cond_t=zero_cond_t)
    if attention_backend is not None:
        model.set_attention_backend(attention_backend)
    return model.to(torch.bfloat16).eval()


def measure_model(zero_cond_t: bool, tokens_list: Sequence[int], batches: Sequence[int], formats: Sequence[str],
                  linears_list: Sequence[str], layers: int, text_len: int, reps: int, warmup: int,
                  flush: torch.Tensor, log=print, text_mask: str = "pipeline",
                  attention_backend: Optional[str] = None) -> List[Dict[str, Any]]:
    """Every case of one model (``zero_cond_t`` off or on): the BF16 forward; per format and linears, the
    converted model fused and unfused, its error and checks; the restored model's forward again. One row
    per (tokens, batch, format, linears)."""
    from qwen_resnorm_fp4.integrations import diffusers as qd

    model = build_model(layers, zero_cond_t, attention_backend)

    def forward_ms(inp: Dict[str, Any]) -> float:
        return timing.flushed_per_call_us(lambda: model(**inp), reps, warmup, flush) / 1e3

    rows: List[Dict[str, Any]] = []
    with torch.inference_mode():
        cases = [(t, b, image_shapes(t, zero_cond_t)) for t in tokens_list for b in batches]
        inputs = {(t, b): model_inputs(b, shapes, text_len, seed=t + b, text_mask=text_mask) for t, b, shapes in cases}
        bf16_ms = {c: forward_ms(inp) for c, inp in inputs.items()}
        bf16_out = {c: model(**inp)[0] for c, inp in inputs.items()}
        for fmt in formats:
            for linears in linears_list:
                qd.convert_transformer(model, mode="fused", format=fmt, linears=linears,
                                       calibration_inputs=list(inputs.values()))
                segments = qd.conversion_info(model).segments_per_forward
                for t, b, shapes in cases:
                    inp = inputs[(t, b)]
                    qd.set_mode(model, "fused")
                    fused_ms = forward_ms(inp)
                    qd.fused_path_stats(model, reset=True)
                    fused = model(**inp)[0]
                    stats = qd.fused_path_stats(model, reset=True)
                    qd.set_mode(model, "unfused")
                    unfused_ms = forward_ms(inp)
                    unfused = model(**inp)[0]
                    row = {"tokens": t, "zero_cond_t": zero_cond_t, "image_shapes": str(shapes), "batch": b,
                           "format": fmt, "linears": linears, "bf16_ms": bf16_ms[(t, b)], "fused_ms": fused_ms,
                           "unfused_ms": unfused_ms, "fused_over_bf16": fused_ms / bf16_ms[(t, b)],
                           "unfused_over_bf16": unfused_ms / bf16_ms[(t, b)],
                           "rel_err_vs_bf16": rel_err(fused, bf16_out[(t, b)]),
                           "fused_equals_unfused": results.outputs_equal(fused, unfused),
                           **stats_fields(stats, segments)}
                    rows.append(row)
                    log(f"{case_name(row)}: bf16 {row['bf16_ms']:.2f} ms, fused {fused_ms:.2f} ms "
                        f"({row['fused_over_bf16']:.3f}x), unfused {unfused_ms:.2f} ms, rel err "
                        f"{row['rel_err_vs_bf16']:.4f}, fused == unfused {row['fused_equals_unfused']}, "
                        f"segments fused {row['fused_segments']}/{segments}"
                        + (f" (declined: {row['decline_reasons']})" if row["fallbacks"] else ""))
                    del fused, unfused
                qd.restore_transformer(model)
        # The restored model: the BF16 bytes again, and its time (the drift over the run).
        after = {c: (forward_ms(inp), results.outputs_equal(model(**inp)[0], bf16_out[c]))
                 for c, inp in inputs.items()}
    for r in rows:
        r["bf16_after_ms"], r["restored_equals_bf16"] = after[(r["tokens"], r["batch"])]
    return rows


# ------------------------------------------------------------------------------------------------------------
# --peers: the converted model against what a user would run instead, compiled
# ------------------------------------------------------------------------------------------------------------

#: The variants of ``--peers``, in run order: (name, what it is). Peers: BF16 eager, compiled whole and by
#: regions (what separates the two is the code outside the blocks), torchao's dynamic FP8 (per row, per
#: tensor) on the same Linears compiled; ours (format="fp8", linears="all",
#: mode="fused") eager, compiled whole (fullgraph), by regions (diffusers' compile_repeated_blocks), and
#: compiled whole with CUDA graphs ("reduce-overhead"), with "max-autotune" and with inductor keeping eager's
#: bf16 roundings between the ops it fuses (its default drops them: how much of compiled against eager that
#: is); ours in NVFP4 compiled whole.
PEER_VARIANTS = (
    ("bf16_eager", "BF16, eager"),
    ("bf16_compiled", "BF16, torch.compile(model)"),
    ("bf16_regional", "BF16, model.compile_repeated_blocks(fullgraph=True) (diffusers' regional compilation)"),
    ("torchao_fp8_row_compiled", "torchao Float8DynamicActivationFloat8WeightConfig(PerRow()), compiled"),
    ("torchao_fp8_tensor_compiled", "torchao Float8DynamicActivationFloat8WeightConfig(PerTensor()), compiled"),
    ("ours_eager", 'ours fp8 "all" fused, eager'),
    ("ours_compiled", 'ours fp8 "all" fused, torch.compile(model, fullgraph=True)'),
    ("ours_regional", 'ours fp8 "all" fused, model.compile_repeated_blocks(fullgraph=True)'),
    ("ours_reduce_overhead", 'ours fp8 "all" fused, torch.compile(fullgraph=True, mode="reduce-overhead")'),
    ("ours_max_autotune", 'ours fp8 "all" fused, torch.compile(fullgraph=True, mode="max-autotune")'),
    ("ours_compiled_eager_casts", 'ours fp8 "all" fused, torch.compile(fullgraph=True, '
     'options={"emulate_precision_casts": True}): the bf16 roundings of eager kept between fused ops'),
    ("ours_reduce_overhead_eager_casts", 'ours fp8 "all" fused, torch.compile(fullgraph=True, '
     'options={"emulate_precision_casts": True, "triton.cudagraphs": True}): eager\'s bf16 roundings, CUDA graphs'),
    ("ours_nvfp4_compiled", 'ours nvfp4 "all" fused, torch.compile(model, fullgraph=True)'),
)
PEER_NAMES = tuple(n for n, _ in PEER_VARIANTS)
#: ``--profile``: the kinds of GPU kernels, each with the marks of its kernels' names, matched in this order
#: after inductor's own kernels (named ``triton_*``: its GEMM templates ``triton_tem_*`` are "gemm", the rest
#: "inductor", whatever op names they carry); attention before GEMM (a CUTLASS attention kernel's name says
#: "cutlass" too); a kernel matching none is "other".
KERNEL_KINDS = (
    ("attention", ("flash", "fmha", "attention", "sdpa")),
    ("gemm", ("gemm", "cutlass", "nvjet", "xmma", "cublas", "splitk")),
    ("ours", ("qwen_fp4::",)),
    ("inductor", ()),
)
KIND_NAMES = tuple(k for k, _ in KERNEL_KINDS) + ("other",)
PEER_FIELDS = ["variant", "tokens", "zero_cond_t", "ms", "over_bf16_eager", "over_torchao_row", "queued_ms",
               "queued_over_bf16_eager", "queued_over_torchao_row", "compile_s",
               "graphs", "rel_err_vs_bf16", "rel_err_vs_fp32", "fused_equals_unfused", "fused_equals_unfused_inductor",
               "compiled_paths", *(f"{k}_ms" for k in KIND_NAMES), "kernels", "top_attention", "first_kernel_ms",
               "gpu_idle_ms", "top_gaps", "host_ms", "syncs", "first_sync"]


def kernel_kind(name: str) -> str:
    """The :data:`KERNEL_KINDS` kind of a GPU kernel, by its name."""
    if name.startswith("triton_"):
        return "gemm" if name.startswith("triton_tem_") else "inductor"
    low = name.lower()
    return next((kind for kind, marks in KERNEL_KINDS if any(m in low for m in marks)), "other")


def kernel_summary(kernels: Sequence[Tuple[str, float]], top: int = 4) -> Dict[str, Any]:
    """The GPU time of ``kernels`` ((name, ms) of each launch) by kind (``<kind>_ms``; copies and fills are
    "other"), how many there were (``kernels``), the attention kernel that took the most time, with its ms
    (``top_attention``: which backend and kernel the attention ran), and, for every kind but attention, its
    ``top`` kernels by total time, with their ms and launches (``top_kernels``: where a kind's time goes)."""
    row: Dict[str, Any] = {f"{k}_ms": 0.0 for k in KIND_NAMES}
    total_ms: Dict[str, float] = {}
    launches: Dict[str, int] = {}
    for name, ms in kernels:
        row[f"{kernel_kind(name)}_ms"] += ms
        total_ms[name] = total_ms.get(name, 0.0) + ms
        launches[name] = launches.get(name, 0) + 1
    row["kernels"] = len(kernels)
    ranked = sorted(total_ms, key=total_ms.get, reverse=True)  # stable: ties keep their first launch's order
    attention = [n for n in ranked if kernel_kind(n) == "attention"]
    row["top_attention"] = f"{attention[0][:80]} ({total_ms[attention[0]]:.2f} ms)" if attention else ""
    parts = []
    for kind in (k for k in KIND_NAMES if k != "attention"):  # attention's is top_attention
        names = [n for n in ranked if kernel_kind(n) == kind][:top]
        if names:
            parts.append(f"{kind}: " + "; ".join(f"{n[:60]} {total_ms[n]:.2f} ms x{launches[n]}" for n in names))
    row["top_kernels"] = " | ".join(parts)
    return row


def timeline_summary(call_start_us: float, kernels: Sequence[Tuple[str, float, float]], top: int = 3) -> Dict[str, Any]:
    """Where the GPU waited in one call: ``first_kernel_ms``, from the call's start on the host to its first
    kernel's start on the GPU (guards, wrappers, launches: the host's work before the GPU has any); ``gpu_idle_ms``,
    the time between the first kernel's start and the last one's end in which no kernel ran (the GPU waited for
    the host); ``top_gaps``, the ``top`` longest such waits with the kernel each preceded. ``kernels``: (name,
    start us, duration us) of each launch, on the clock of ``call_start_us``."""
    ordered = sorted(kernels, key=lambda k: k[1])
    gaps: List[Tuple[float, str]] = []
    busy_until = None
    for name, start, duration in ordered:
        if busy_until is not None and start > busy_until:
            gaps.append((start - busy_until, name))
        busy_until = start + duration if busy_until is None else max(busy_until, start + duration)
    ranked = sorted(gaps, key=lambda g: g[0], reverse=True)[:top]
    return {"first_kernel_ms": (ordered[0][1] - call_start_us) / 1e3 if ordered else float("nan"),
            "gpu_idle_ms": sum(g for g, _ in gaps) / 1e3,
            "top_gaps": "; ".join(f"{g / 1e3:.3f} ms before {name[:60]}" for g, name in ranked)}


#: The profiled call's range (host and GPU sides) in :func:`kernel_breakdown`.
_FORWARD_MARK = "bench_model.forward"


def kernel_breakdown(fn: Callable[[], Any], trace_path: Optional[str] = None) -> Dict[str, Any]:
    """:func:`kernel_summary` and :func:`timeline_summary` of the GPU kernels of one call of ``fn``, under
    torch.profiler (host and GPU activity: the host's times carry the profiler's own overhead, e.g. its
    activity-buffer allocation before the first kernel, the kernels' do not); ``trace_path``: also that call's
    Chrome trace there."""
    from torch.profiler import ProfilerActivity, profile, record_function

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        with record_function(_FORWARD_MARK):
            fn()
        torch.cuda.synchronize()
    if trace_path is not None:
        prof.export_chrome_trace(trace_path)
    events = prof.events()
    call_start = next(e.time_range.start for e in events
                      if e.name == _FORWARD_MARK and e.device_type == torch.autograd.DeviceType.CPU)
    # the GPU side of the marker is a range over the call's kernels, not a kernel
    kernels = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA and e.name != _FORWARD_MARK]
    return {**kernel_summary([(e.name, e.device_time / 1e3) for e in kernels]),
            **timeline_summary(call_start, [(e.name, e.time_range.start, e.time_range.elapsed_us()) for e in kernels])}


def host_figures(fn: Callable[[], Any]) -> Dict[str, Any]:
    """The host side of one call of ``fn``: ``host_ms``, the wall time until it returns (no synchronization
    after it: where this is near the forward time, the forward is bound by the host), and ``syncs``, how many
    synchronizing CUDA calls it made (``torch.cuda.set_sync_debug_mode("warn")``), with ``first_sync``, where
    the first was made."""
    torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    host_ms = (time.perf_counter() - start) * 1e3
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    syncs = [w for w in caught if "synchroniz" in str(w.message)]
    return {"host_ms": host_ms, "syncs": len(syncs),
            "first_sync": f"{syncs[0].filename}:{syncs[0].lineno}" if syncs else ""}


def fp32_outputs(model: torch.nn.Module, inputs: Dict[int, Dict[str, Any]]) -> Dict[int, torch.Tensor]:
    """The outputs of an fp32 copy of the BF16 model (same weights, fp32 activations, no TF32, diffusers'
    default attention backend: flash and cuDNN attention take no fp32) per token count: the error every variant
    is also measured against, BF16 eager included: inductor keeps intermediates in fp32 where eager rounds them
    to bf16, so a compiled variant's distance from BF16 eager alone does not say which of the two is further
    from the model's exact output."""
    twin = copy.deepcopy(model).float()
    twin.reset_attention_backend()
    outs = {}
    precision = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")  # no TF32
    try:
        with torch.no_grad():
            for t, inp in inputs.items():
                wide = {k: v.float() if isinstance(v, torch.Tensor) and v.is_floating_point() else v
                        for k, v in inp.items()}
                outs[t] = twin(**wide)[0]
    finally:
        torch.set_float32_matmul_precision(precision)
    del twin
    torch.cuda.empty_cache()
    return outs


def _torchao_model(model: torch.nn.Module, names: Sequence[str], granularity: str) -> torch.nn.Module:
    """A copy of the BF16 model with torchao's dynamic FP8 (activation and weight) on the Linears ``names``."""
    from torchao.quantization import Float8DynamicActivationFloat8WeightConfig, PerRow, PerTensor, quantize_

    twin = copy.deepcopy(model)
    wanted = set(names)
    config = Float8DynamicActivationFloat8WeightConfig(granularity=PerRow() if granularity == "row" else PerTensor())
    quantize_(twin, config, filter_fn=lambda m, fqn: fqn in wanted and isinstance(m, torch.nn.Linear))
    return twin


def _ours_model(model: torch.nn.Module, fmt: str, calibration: List[Dict[str, Any]]) -> torch.nn.Module:
    """A converted copy of the BF16 model (format ``fmt``, linears="all", mode="fused")."""
    from qwen_resnorm_fp4.integrations import diffusers as qd

    twin = copy.deepcopy(model)
    return qd.convert_transformer(twin, format=fmt, linears="all", mode="fused", calibration_inputs=calibration,
                                  keep_original=False)


def _peer_callable(variant: str, model: torch.nn.Module) -> Callable[..., Any]:
    """How the variant runs the model: eager, compiled whole, or by regions (compiled in place)."""
    if variant.endswith("_eager"):
        return model
    if variant.endswith("_regional"):
        model.compile_repeated_blocks(fullgraph=True)
        return model
    if variant.endswith("_eager_casts"):  # mode= excludes options=: "triton.cudagraphs" is reduce-overhead's
        cudagraphs = {"triton.cudagraphs": True} if "reduce_overhead" in variant else {}
        return torch.compile(model, fullgraph=True, options={"emulate_precision_casts": True, **cudagraphs})
    if variant.startswith("ours"):
        mode = {"ours_reduce_overhead": "reduce-overhead", "ours_max_autotune": "max-autotune"}.get(variant)
        return torch.compile(model, fullgraph=True, mode=mode)
    return torch.compile(model)  # the peers as a user compiles them


def fresh_compile_caches() -> ContextManager[None]:
    """Empty inductor and Triton caches for one variant (``torch._inductor.utils.fresh_cache``, in a temporary
    directory removed on exit): its compile time is a cold compilation's, whatever ran before it on the machine."""
    from torch._inductor.utils import fresh_cache

    return fresh_cache()


def _compiled_fused_equals_unfused(model: torch.nn.Module, inp: Dict[str, Any], backend: str) -> bool:
    """Fused == unfused bit for bit under torch.compile(fullgraph=True): with ``backend="aot_eager"``, the
    graph's own ops as traced; with "inductor", in its deterministic mode (``torch._inductor.config.deterministic``:
    its default autotuning picks reduction orders by timing, so two default compilations may differ in last
    bits), one fresh compilation per mode (``force_disable_caches``: no kernel or autotuning choice read from an
    earlier compilation's caches)."""
    import torch._dynamo as dynamo
    import torch._inductor.config as inductor_config
    from qwen_resnorm_fp4.integrations import diffusers as qd

    outs = []
    for mode in ("fused", "unfused"):
        # one patch per compilation: dynamo ends each frame with torch.use_deterministic_algorithms(<the
        # process's setting>), which also resets inductor's deterministic flag
        with inductor_config.patch(deterministic=True, force_disable_caches=True):
            dynamo.reset()
            qd.set_mode(model, mode)
            outs.append(torch.compile(model, fullgraph=True, backend=backend)(**inp)[0].clone())
    qd.set_mode(model, "fused")
    dynamo.reset()
    return results.outputs_equal(outs[0], outs[1])


def peer_row_line(row: Dict[str, Any]) -> str:
    """One measured variant and token count as the run's log prints it."""
    line = (f"{'zct ' if row['zero_cond_t'] else ''}{row['tokens']} tokens {row['variant']}: {row['ms']:.2f} ms "
            f"(queued {row['queued_ms']:.2f}), compile {row['compile_s']:.1f} s, graphs {row['graphs']}, "
            f"rel err {row['rel_err_vs_bf16']:.4f} (vs fp32 {row['rel_err_vs_fp32']:.4f})")
    if row.get("compiled_paths"):
        line += f", compiled paths {row['compiled_paths']}"
    if "kernels" in row:
        line += ", kernels " + ", ".join(f"{k} {row[k + '_ms']:.2f}" for k in KIND_NAMES) + f" ms ({row['kernels']})"
        if row.get("top_attention"):
            line += f", attention kernel {row['top_attention']}"
        if row.get("top_kernels"):
            line += f", top kernels {row['top_kernels']}"
    if "gpu_idle_ms" in row:
        line += (f", first kernel after {row['first_kernel_ms']:.2f} ms, GPU idle {row['gpu_idle_ms']:.2f} ms"
                 + (f" (longest: {row['top_gaps']})" if row["top_gaps"] else ""))
    if "host_ms" in row:
        line += f", host {row['host_ms']:.2f} ms, {row['syncs']} syncs {row['first_sync']}".rstrip()
    return line


def measure_peers(zero_cond_t: bool, tokens_list: Sequence[int], variants: Sequence[str], layers: int,
                  text_len: int, reps: int, warmup: int, flush: torch.Tensor, log=print, text_mask: str = "pipeline",
                  profile: bool = False, attention_backend: Optional[str] = None, trace_dir: Optional[str] = None,
                  on_variant: Optional[Callable[[List[Dict[str, Any]]], None]] = None) -> List[Dict[str, Any]]:
    """Every variant of one model (``zero_cond_t`` off or on) at every token count, one variant at a time
    (dynamo reset between variants, so no variant inherits another's graphs or recompile budget). Per
    variant and token count: the forward time from an idle GPU (:func:`timing.flushed_per_call_us`, median of
    ``reps``) and with the queue pre-filled (``queued_ms``, :func:`timing.queued_flushed_per_call_us`), the
    compile time (the first call's wall time less one timed forward, in a fresh inductor cache of the variant's
    own: :func:`fresh_compile_caches`), the graphs dynamo compiled for it
    (one per shape, or a second, dynamic one), the relative errors against the BF16 eager output and against
    the fp32 model's (:func:`fp32_outputs`); for ours compiled, the segments' compiled paths, and for ours
    compiled whole, fused == unfused under compile (:func:`_compiled_fused_equals_unfused`: aot_eager at every
    token count, inductor at the first); with ``profile``, :func:`kernel_breakdown` and :func:`host_figures` of
    one forward each (``trace_dir``: the profiled forward's Chrome trace there,
    ``trace_[zct_]<tokens>_<variant>.json``).
    ``on_variant``: called with the rows so far after each variant (a run stopped midway keeps what it
    measured)."""
    import torch._dynamo as dynamo
    from qwen_resnorm_fp4.integrations import diffusers as qd

    if trace_dir is not None:  # the profiler's trace export fails silently into a missing directory
        os.makedirs(trace_dir, exist_ok=True)
    model = build_model(layers, zero_cond_t, attention_backend)
    inputs = {t: model_inputs(1, image_shapes(t, zero_cond_t), text_len, seed=t, text_mask=text_mask)
              for t in tokens_list}
    timer = timing.EventTimer()
    with torch.no_grad():
        reference = {t: model(**inp)[0] for t, inp in inputs.items()}
        exact = fp32_outputs(model, inputs)
    names = None
    rows: List[Dict[str, Any]] = []
    for variant in variants:
        dynamo.reset()
        dynamo.utils.counters.clear()
        with fresh_compile_caches():  # a cold compilation: no kernel or choice from an earlier variant
            if variant.startswith("ours"):
                fmt = "nvfp4" if "nvfp4" in variant else "fp8"
                subject = _ours_model(model, fmt, list(inputs.values()))
            elif variant.startswith("torchao"):
                if names is None:
                    names = qd.linear_names(model, "all", "fp8")
                subject = _torchao_model(model, names, "row" if "_row_" in variant else "tensor")
            elif variant == "bf16_regional":  # compiled in place: a copy, so the other variants keep the eager blocks
                subject = copy.deepcopy(model)
            else:
                subject = model
            run = _peer_callable(variant, subject)
            for t, inp in inputs.items():
                with torch.no_grad():
                    torch.cuda.synchronize()
                    start = time.perf_counter()
                    out = run(**inp)[0].clone()  # a CUDA-graph output is overwritten by the next replay
                    torch.cuda.synchronize()
                    first_s = time.perf_counter() - start
                    ms = timing.flushed_per_call_us(lambda run=run, inp=inp: run(**inp), reps, warmup, flush) / 1e3
                    queued_ms = timing.queued_flushed_per_call_us(lambda run=run, inp=inp: run(**inp), reps, 0,
                                                                  flush, timer) / 1e3
                    row = {"variant": variant, "tokens": t, "zero_cond_t": zero_cond_t, "ms": ms,
                           "queued_ms": queued_ms,
                           "compile_s": 0.0 if variant.endswith("_eager") else max(first_s - ms / 1e3, 0.0),
                           "graphs": int(dynamo.utils.counters["stats"]["unique_graphs"]),
                           "rel_err_vs_bf16": rel_err(out, reference[t]), "rel_err_vs_fp32": rel_err(out, exact[t])}
                    if variant.startswith("ours") and variant != "ours_eager":
                        paths = qd.fused_path_stats(subject)["compiled"]
                        row["compiled_paths"] = "; ".join(f"{k}: {'/'.join(v)}" for k, v in paths.items())
                        row["compiled_all_fused"] = bool(paths) and all(v == ["fused"] for v in paths.values())
                    trace = (f"{trace_dir}/trace_{'zct_' if zero_cond_t else ''}{t}_{variant}.json"
                             if trace_dir else None)
                    profiles = (("kernel_breakdown", lambda fn, trace=trace: kernel_breakdown(fn, trace)),
                                ("host_figures", host_figures)) if profile else ()
                    for name, figures in profiles:
                        try:  # a profile is a figure, not a check: one that fails is said and left out
                            row.update(figures(lambda run=run, inp=inp: run(**inp)))
                        except Exception as exc:  # noqa: BLE001
                            log(f"{variant} {t} tokens: no {name} ({type(exc).__name__}: {exc})")
                rows.append(row)
                log(peer_row_line(row))
            if variant == "ours_compiled":  # after the timed and noted graphs: these traces note "unfused"
                # aot_eager at every token count; inductor's two deterministic compilations at the first (the
                # kernels' bytes per shape are the test suite's; this is the compiled graph's check)
                for i, r in enumerate(rows[-len(inputs):]):
                    checks = (("aot_eager", "fused_equals_unfused"), ("inductor", "fused_equals_unfused_inductor"))
                    with torch.no_grad():
                        for backend, field in checks[:2 if i == 0 else 1]:
                            try:  # a check that cannot run fails the run, after the other variants are measured
                                r[field] = _compiled_fused_equals_unfused(subject, inputs[r["tokens"]], backend)
                            except Exception as exc:  # noqa: BLE001 - any failure: reported as the check not made
                                r[field] = None
                                r.setdefault("check_errors", []).append(f"{backend}: {type(exc).__name__}: {exc}")
                    log(f"{'zct ' if zero_cond_t else ''}{r['tokens']} tokens {variant}: fused == unfused under "
                        f"compile: aot_eager {r['fused_equals_unfused']}, inductor (deterministic) "
                        f"{r.get('fused_equals_unfused_inductor', 'not checked at this token count')}")
        del run, subject
        torch.cuda.empty_cache()
        add_peer_ratios(rows)
        if on_variant is not None:
            on_variant(rows)
    dynamo.reset()
    return rows


def add_peer_ratios(rows: Sequence[Dict[str, Any]]) -> None:
    """Each row's time over BF16 eager's and over torchao per-row compiled's at its token count (rows of one
    zero_cond_t; nan where that peer was not measured)."""
    for measure, prefix in (("ms", ""), ("queued_ms", "queued_")):
        times = {(r["tokens"], r["variant"]): r.get(measure) for r in rows}
        for r in rows:
            for field, peer in (("over_bf16_eager", "bf16_eager"), ("over_torchao_row", "torchao_fp8_row_compiled")):
                base = times.get((r["tokens"], peer))
                r[prefix + field] = r[measure] / base if base and r.get(measure) else float("nan")


def peers_table_lines(rows: Sequence[Dict[str, Any]]) -> List[str]:
    """The ``--peers`` markdown table, one line per variant, token count and zero_cond_t."""
    columns = ("image tokens", "zero_cond_t", "variant", "ms", "x BF16 eager", "x torchao row compiled",
               "queued ms", "queued x BF16 eager", "queued x torchao row compiled",
               "compile s", "graphs", "rel err vs BF16 eager", "rel err vs fp32",
               "fused == unfused (aot_eager / inductor)",
               "GPU ms: " + " / ".join(KIND_NAMES) + " (kernels)", "host ms (syncs)")
    return results.markdown_table(columns, (
        (r["tokens"], "yes" if r["zero_cond_t"] else "no", r["variant"], f"{r['ms']:.2f}",
         results.fmt(r.get("over_bf16_eager"), ".3f"), results.fmt(r.get("over_torchao_row"), ".3f"),
         results.fmt(r.get("queued_ms"), ".2f"), results.fmt(r.get("queued_over_bf16_eager"), ".3f"),
         results.fmt(r.get("queued_over_torchao_row"), ".3f"),
         f"{r['compile_s']:.1f}", r["graphs"], f"{r['rel_err_vs_bf16']:.4f}",
         results.fmt(r.get("rel_err_vs_fp32"), ".4f"),
         f"{results.yes_no(r['fused_equals_unfused'])} / "
         + (results.yes_no(r["fused_equals_unfused_inductor"]) if "fused_equals_unfused_inductor" in r
            else "not checked") if "fused_equals_unfused" in r else "",
         " / ".join(f"{r[k + '_ms']:.2f}" for k in KIND_NAMES) + f" ({r['kernels']})" if "kernels" in r else "",
         f"{r['host_ms']:.2f} ({r['syncs']})" if "host_ms" in r else "")
        for r in rows))


def peer_problems(row: Dict[str, Any]) -> List[str]:
    """A ``--peers`` row's failed checks: fused != unfused under compile (aot_eager, or inductor in its
    deterministic mode) or that check not made (its error), or a compiled segment of ours not fused."""
    problems = [f"fused != unfused under compile ({backend})"
                for field, backend in (("fused_equals_unfused", "aot_eager"),
                                       ("fused_equals_unfused_inductor", "inductor, deterministic"))
                if row.get(field) is False]
    if row.get("compiled_all_fused") is False:
        problems.append(f"compiled paths {row['compiled_paths']}")
    problems += [f"fused == unfused not checked ({error})" for error in row.get("check_errors", ())]
    return problems


def missing_peer_package(variants: Sequence[str]) -> Optional[str]:
    """The error for torchao variants asked for without torchao installed (before anything is measured), or
    None."""
    import importlib.util

    wanted = [v for v in variants if v.startswith("torchao")]
    if wanted and importlib.util.find_spec("torchao") is None:
        return (f"--variants {','.join(wanted)} need torchao (pip install 'qwen-resnorm-fp4[bench]', or leave them "
                "out with --variants)")
    return None


def peers_main(args: argparse.Namespace) -> int:
    """``--peers``: :func:`measure_peers` for each zero_cond_t; writes bench_model_peers.{csv,md}. Fails (exit
    status 1) on any :func:`peer_problems`."""
    tokens_list = args.tokens or list(DEFAULT_TOKENS)
    zero_cond = ZERO_COND_T[args.zero_cond_t]
    error = argument_error(tokens_list, zero_cond)
    variants = args.variants or list(PEER_NAMES)
    if error is None:
        error = missing_peer_package(variants)
    if error is not None:
        print(f"{PROG}: {error}", file=sys.stderr)
        return 2
    if (rc := harness.refuse_without_gpu(PROG)) is not None:
        return rc
    harness.compile_for_many_shapes()
    reps, warmup = args.reps, args.warmup
    header = harness.run_header() + [
        f"QwenImageTransformer2DModel, {args.layers} blocks, 24 heads x 128 (width 3072), random weights, batch 1, "
        f"{args.text_len} text tokens, text mask: {args.text_mask}, attention backend: "
        f"{args.attention_backend or 'diffusers default'}; forward time, CUDA events, median of {reps} "
        f"after {warmup} (cold L2), from an idle GPU (ms: the host's work before the first kernel counted) and "
        "with the GPU queue pre-filled ahead of each forward (queued ms: as in a loop whose previous step keeps "
        "the GPU busy; a loop runs at the larger of it and the host's time); "
        "compile s: the first call's wall time less one forward, with empty compile caches of the variant's own; "
        "graphs: dynamo's graphs for the variant so far; "
        "rel err: Frobenius, against the BF16 eager output and against an fp32 copy of the model (no TF32, "
        "diffusers' default attention backend)",
        *(f"{n}: {d}" for n, d in PEER_VARIANTS if n in variants)]
    print("\n".join(header))
    flush = timing.l2_flush_buffer()

    def report(rows: List[Dict[str, Any]]) -> List[str]:
        lines = peers_table_lines(rows)
        results.write_report(args.out, f"{PROG}_peers", rows, [f"# {PROG} --peers", ""]
                             + [f"- {h}" for h in header] + [""] + lines, PEER_FIELDS)
        return lines

    rows: List[Dict[str, Any]] = []
    for zct in zero_cond:
        rows += measure_peers(zct, tokens_list, variants, args.layers, args.text_len, reps, warmup, flush,
                              log=lambda line: print(line, flush=True), text_mask=args.text_mask,
                              profile=args.profile, attention_backend=args.attention_backend,
                              trace_dir=args.out if args.profile else None,
                              # done: the rows of the zero_cond_t settings before this one, as they are now
                              on_variant=lambda so_far, done=list(rows): report(done + so_far))
        torch.cuda.empty_cache()
    print("\n".join(report(rows)))
    failures = [f"{r['tokens']} tokens{' zct' if r['zero_cond_t'] else ''} {r['variant']}: {problem}"
                for r in rows for problem in peer_problems(r)]
    return results.exit_status(failures, "the converted model under torch.compile")


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    if args.peers:
        return peers_main(args)
    tokens_list = args.tokens or list(DEFAULT_TOKENS)
    zero_cond = ZERO_COND_T[args.zero_cond_t]
    formats = args.formats or list(QUICK_FORMATS if args.quick else FORMATS)
    linears_list = args.linears or list(QUICK_LINEARS if args.quick else LINEARS)
    reps, warmup = (3, 2) if args.quick else (args.reps, args.warmup)
    error = argument_error(tokens_list, zero_cond)  # arguments first: a wrong one is reported on any machine
    if error is not None:
        print(f"{PROG}: {error}", file=sys.stderr)
        return 2
    if (rc := harness.refuse_without_gpu(PROG)) is not None:
        return rc

    header = harness.run_header() + [
        f"QwenImageTransformer2DModel, {args.layers} blocks, 24 heads x 128 (width 3072), random weights, "
        f"{args.text_len} text tokens, text mask: {args.text_mask}, attention backend: "
        f"{args.attention_backend or 'diffusers default'}; forward time, CUDA events, median of {reps} "
        f"after {warmup} (cold L2); "
        "each conversion calibrated on every case's inputs of its model; rel err: Frobenius, against the BF16 "
        "model's output"]
    print("\n".join(header))
    flush = timing.l2_flush_buffer()

    rows: List[Dict[str, Any]] = []
    for zct in zero_cond:
        rows += measure_model(zct, tokens_list, args.batches, formats, linears_list, args.layers, args.text_len,
                              reps, warmup, flush, log=lambda line: print(line, flush=True),
                              text_mask=args.text_mask, attention_backend=args.attention_backend)
        torch.cuda.empty_cache()  # the model of this zero_cond_t is gone: free its memory for the next
    add_fp8_over_nvfp4(rows)
    lines = table_lines(rows)
    print("\n".join(lines))
    md = [f"# {PROG}", ""] + [f"- {h}" for h in header] + [""] + lines
    results.write_report(args.out, PROG, rows, md, CSV_FIELDS)
    return results.exit_status(byte_check_failures(rows), "converted model checks")


if __name__ == "__main__":
    sys.exit(main())
