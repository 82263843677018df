"""GEMM and end-to-end benchmarks of the NVFP4 linear paths (GPU only).

``python -m qwen_resnorm_fp4 bench-gemm``: :func:`~qwen_resnorm_fp4.gemm.apply_nvfp4_gemm_prequantized` at
Qwen-Image's FC1 (K = 3072, N = 12288) and FC2 (K = 12288, N = 3072) shapes for M in {256, 4096, 13778}, against
the BF16 GEMM of the same shape in the same run (``torch.mm`` on bf16, and ``F.linear`` with the bias). The
tensor-core path is timed with the weight dequantized per call and with the layer's cached bf16 weight;
the reference path at the first shape (every shape with ``--with-reference``); FlashInfer where it serves.
Each timed call follows a write of a buffer larger than L2 (cold L2); CUDA events; the median of ``--reps``.
Every shape also checks that the dequantized bf16 operands equal the fp32 reference dequantization bit for
bit and prints the tensor-core output's relative error against the reference path.

``python -m qwen_resnorm_fp4 bench-model``: a real-width diffusers ``QwenImageTransformer2DModel`` (random
weights, ``--layers`` blocks, width 3072) at 1328x1328 (6889 image tokens) and 1024x1024 (4096), batch 1 and
2: forward time of the BF16 model and of the converted model fused and unfused, for ``linears="fc1"`` and
``linears="all"``; the fused and unfused outputs must be byte-identical (exit status 1 otherwise).

Both print a markdown table and write a CSV into ``--out``.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence

import torch

Tensor = torch.Tensor

FC1 = (3072, 12288)  # (K, N)
FC2 = (12288, 3072)
DEFAULT_ROWS = (256, 4096, 13778)
#: Bytes written before each timed call so that it starts with a cold L2 (the H200's L2 is 50 MB).
L2_FLUSH_BYTES = 256 * 1024 * 1024
#: The targets of the tensor-core path against the BF16 GEMM (ratio of medians).
TARGET_LARGE_M, TARGET_SMALL_M = 1.10, 1.5


def time_ms(fn: Callable[[], Any], reps: int, warmup: int, flush: Tensor) -> float:
    """Median time of ``fn`` in ms by CUDA events, each call after writing ``flush`` (cold L2)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        flush.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def write_csv(rows: List[Dict[str, Any]], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    print(f"wrote {path}")


def _device_line() -> str:
    return (f"{torch.cuda.get_device_name()} (capability {'.'.join(map(str, torch.cuda.get_device_capability()))}), "
            f"torch {torch.__version__}, CUDA {torch.version.cuda}")


def _need_gpu(what: str) -> Optional[int]:
    from . import _library

    if not torch.cuda.is_available():
        print(f"{what}: needs a CUDA GPU", file=sys.stderr)
        return 2
    if not _library.cuda_available():
        print(f"{what}: the compiled library is not loaded ({_library.status()})", file=sys.stderr)
        return 2
    return None


# ----------------------------------------------------------------------------------------------------
# bench-gemm
# ----------------------------------------------------------------------------------------------------


def bench_gemm_shape(m: int, k: int, n: int, reps: int, warmup: int, with_reference: bool,
                     flush: Tensor) -> Dict[str, Any]:
    from . import reference
    from .api import nvfp4_quantize
    from .api import dequantize_to_bf16
    from .gemm import apply_nvfp4_gemm_prequantized, flashinfer_serves
    from .linear import NVFP4Linear

    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(m + k)
    lin = torch.nn.Linear(k, n, device=dev, dtype=torch.bfloat16)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(n, k, generator=g, device=dev) * k ** -0.5)
        lin.bias.copy_(torch.randn(n, generator=g, device=dev) * 0.1)
    x = torch.randn(m, k, generator=g, device=dev).bfloat16()
    layer = NVFP4Linear.from_linear(lin, x.float().abs().amax(), gemm_backend="tensor_core")
    packed, scales = nvfp4_quantize(x, layer.input_global_scale)

    # exactness of the operands: bf16 dequantization == the fp32 reference without global scale, bit for bit
    one = torch.ones(1, device=dev)
    exact = all(
        torch.equal(dequantize_to_bf16(p, s).float().view(torch.int32),
                    reference.dequantize_nvfp4(p, s, one, p.shape[0]).view(torch.int32))
        for p, s in ((packed, scales), (layer.weight_packed, layer.weight_scales)))

    def tc() -> Tensor:
        return apply_nvfp4_gemm_prequantized(layer, packed, scales, backend="tensor_core")

    w_bf16 = lin.weight.detach()
    row: Dict[str, Any] = {"M": m, "K": k, "N": n}
    row["tensor_core_ms"] = time_ms(tc, reps, warmup, flush)
    row["bf16_mm_ms"] = time_ms(lambda: torch.mm(x, w_bf16.t()), reps, warmup, flush)
    row["bf16_linear_ms"] = time_ms(lambda: torch.nn.functional.linear(x, w_bf16, lin.bias), reps, warmup, flush)
    layer.cache_dequantized_weight = True
    row["tensor_core_cached_ms"] = time_ms(tc, reps, warmup, flush)
    out_tc = tc()
    layer.cache_dequantized_weight = False
    row["ratio"] = row["tensor_core_ms"] / row["bf16_mm_ms"]
    row["ratio_cached"] = row["tensor_core_cached_ms"] / row["bf16_mm_ms"]
    ref = apply_nvfp4_gemm_prequantized(layer, packed, scales, torch.float32, backend="reference")
    row["rel_err_vs_reference"] = ((out_tc.float() - ref).norm() / ref.norm()).item()
    del ref
    row["reference_ms"] = (time_ms(lambda: apply_nvfp4_gemm_prequantized(layer, packed, scales, backend="reference"),
                                   max(3, reps // 5), 1, flush) if with_reference else None)
    row["flashinfer_ms"] = (time_ms(lambda: apply_nvfp4_gemm_prequantized(layer, packed, scales, backend="auto"),
                                    reps, warmup, flush) if flashinfer_serves(dev) else None)
    row["operands_exact"] = exact
    return row


def _fmt(v: Optional[float], digits: int = 3) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def gemm_table(rows: List[Dict[str, Any]]) -> str:
    lines = ["| M x K x N | tensor_core ms | tensor_core cached ms | bf16 mm ms | bf16 linear ms | ratio | "
             "ratio cached | target | reference ms | FlashInfer ms | rel err vs reference | operands exact |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        target = TARGET_LARGE_M if r["M"] >= 4096 else TARGET_SMALL_M
        lines.append(
            f"| {r['M']} x {r['K']} x {r['N']} | {_fmt(r['tensor_core_ms'])} | {_fmt(r['tensor_core_cached_ms'])} | "
            f"{_fmt(r['bf16_mm_ms'])} | {_fmt(r['bf16_linear_ms'])} | {r['ratio']:.2f}x | {r['ratio_cached']:.2f}x | "
            f"<= {target:.2f}x: {'met' if r['ratio'] <= target else 'missed'} per call, "
            f"{'met' if r['ratio_cached'] <= target else 'missed'} cached | {_fmt(r['reference_ms'])} | "
            f"{_fmt(r['flashinfer_ms'])} | {r['rel_err_vs_reference']:.2e} | {'yes' if r['operands_exact'] else 'NO'} |")
    return "\n".join(lines)


def bench_gemm_main(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m qwen_resnorm_fp4 bench-gemm",
                                description="NVFP4 GEMM paths against the BF16 GEMM (GPU only)")
    p.add_argument("--rows", type=int, nargs="+", default=list(DEFAULT_ROWS), help="M values (default 256 4096 13778)")
    p.add_argument("--reps", type=int, default=30, help="timed calls per case (median)")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--with-reference", action="store_true", help="time the reference path at every shape "
                   "(default: at the first shape only)")
    p.add_argument("--out", type=Path, default=Path("benchmarks/results"), help="directory for bench_gemm.csv")
    args = p.parse_args(list(argv))
    if (rc := _need_gpu("bench-gemm")) is not None:
        return rc
    print(_device_line())
    print(f"cold L2 ({L2_FLUSH_BYTES >> 20} MiB written before each call), CUDA events, median of {args.reps}; "
          "bias in every NVFP4 call and in bf16 linear, none in bf16 mm; ratio = tensor_core / bf16 mm")
    flush = torch.empty(L2_FLUSH_BYTES, dtype=torch.uint8, device="cuda")
    rows = []
    for i, (k, n) in enumerate((FC1, FC2)):
        for j, m in enumerate(args.rows):
            rows.append(bench_gemm_shape(m, k, n, args.reps, args.warmup, args.with_reference or (i == 0 and j == 0),
                                         flush))
            torch.cuda.empty_cache()
    print(gemm_table(rows))
    write_csv(rows, args.out / "bench_gemm.csv")
    return 0 if all(r["operands_exact"] for r in rows) else 1


# ----------------------------------------------------------------------------------------------------
# bench-model
# ----------------------------------------------------------------------------------------------------

#: (name, latent tokens per side after the 2x2 patchify): 1328 / 8 / 2 = 83, 1024 / 8 / 2 = 64.
RESOLUTIONS = (("1328x1328", 83), ("1024x1024", 64))


def model_inputs(batch: int, side: int, text_len: int, seed: int) -> Dict[str, Any]:
    g = torch.Generator().manual_seed(seed)
    mask = torch.ones(batch, text_len, dtype=torch.bool)
    if batch > 1:
        mask[1, text_len // 2:] = False  # a shorter negative prompt
    return dict(
        hidden_states=torch.randn(batch, side * side, 64, generator=g).bfloat16().cuda(),
        encoder_hidden_states=torch.randn(batch, text_len, 3584, generator=g).bfloat16().cuda(),
        encoder_hidden_states_mask=mask.cuda(),
        timestep=torch.rand(batch, generator=g).cuda(),
        img_shapes=[[(1, side, side)]] * batch,
        return_dict=False,
    )


def _convert(qd: Any, model: torch.nn.Module, linears: str, calibration: Dict[str, Any]) -> Optional[str]:
    """Convert in place; returns None, or why ``linears`` could not be used."""
    try:
        qd.convert_qwen_image_transformer(model, mode="fused", calibration_inputs=calibration, linears=linears)
    except TypeError as e:
        if "linears" not in str(e):
            raise
        if linears != "fc1":
            return (f"convert_qwen_image_transformer has no linears= argument in this tree ({e}); "
                    f"linears={linears!r} skipped")
        qd.convert_qwen_image_transformer(model, mode="fused", calibration_inputs=calibration)  # FC1: the default
    return None


def bench_model_main(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m qwen_resnorm_fp4 bench-model",
                                description="diffusers Qwen-Image transformer: BF16 vs converted (GPU only)")
    p.add_argument("--layers", type=int, default=4, help="transformer blocks (default 4; Qwen-Image has 60)")
    p.add_argument("--text-len", type=int, default=128, help="text tokens (default 128)")
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="1024x1024, batch 1 only, 3 timed forwards")
    p.add_argument("--out", type=Path, default=Path("benchmarks/results"), help="directory for bench_model.csv")
    args = p.parse_args(list(argv))
    if (rc := _need_gpu("bench-model")) is not None:
        return rc
    from .integrations import diffusers as qd  # first: it makes diffusers importable next to a broken flashinfer

    from diffusers import QwenImageTransformer2DModel

    reps = 3 if args.quick else args.reps
    resolutions = RESOLUTIONS[1:] if args.quick else RESOLUTIONS
    batches = (1,) if args.quick else (1, 2)
    torch.manual_seed(0)
    model = QwenImageTransformer2DModel(num_layers=args.layers, attention_head_dim=128, num_attention_heads=24,
                                        joint_attention_dim=3584).to(device="cuda", dtype=torch.bfloat16).eval()
    print(_device_line())
    print(f"QwenImageTransformer2DModel, {args.layers} blocks, width 3072, random weights, {args.text_len} text "
          f"tokens; forward time, CUDA events, median of {reps} (cold L2); calibration on each case's own inputs")
    flush = torch.empty(L2_FLUSH_BYTES, dtype=torch.uint8, device="cuda")
    rows, ok = [], True
    with torch.inference_mode():
        for res_name, side in resolutions:
            for batch in batches:
                inp = model_inputs(batch, side, args.text_len, seed=batch)
                bf16_ms = time_ms(lambda: model(**inp), reps, args.warmup, flush)
                bf16_out = model(**inp)[0]
                for linears in ("fc1", "all"):
                    skipped = _convert(qd, model, linears, inp)
                    if skipped is not None:
                        print(skipped)
                        continue
                    fused_ms = time_ms(lambda: model(**inp), reps, args.warmup, flush)
                    fused = model(**inp)[0]
                    qd.set_qwen_image_mode(model, "unfused")
                    unfused_ms = time_ms(lambda: model(**inp), reps, args.warmup, flush)
                    unfused = model(**inp)[0]
                    qd.restore_qwen_image_transformer(model)
                    same = torch.equal(fused.view(torch.int16), unfused.view(torch.int16))
                    ok &= same
                    err = ((fused.float() - bf16_out.float()).norm() / bf16_out.float().norm()).item()
                    rows.append({"resolution": res_name, "image_tokens": side * side, "batch": batch,
                                 "linears": linears, "bf16_ms": bf16_ms, "fused_ms": fused_ms,
                                 "unfused_ms": unfused_ms, "fused_over_bf16": fused_ms / bf16_ms,
                                 "fused_equals_unfused": same, "rel_err_vs_bf16": err})
                    del fused, unfused
                del bf16_out, inp
                torch.cuda.empty_cache()
    lines = ["| resolution | batch | linears | bf16 ms | fused ms | unfused ms | fused / bf16 | fused == unfused | "
             "rel err vs bf16 |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['resolution']} ({r['image_tokens']} tokens) | {r['batch']} | {r['linears']} | "
                     f"{r['bf16_ms']:.2f} | {r['fused_ms']:.2f} | {r['unfused_ms']:.2f} | {r['fused_over_bf16']:.2f}x | "
                     f"{'yes' if r['fused_equals_unfused'] else 'NO'} | {r['rel_err_vs_bf16']:.3f} |")
    print("\n".join(lines))
    if rows:
        write_csv(rows, args.out / "bench_model.csv")
    if not ok:
        print("FAIL: fused and unfused outputs differ", file=sys.stderr)
    return 0 if ok and rows else 1


def main(argv: Sequence[str]) -> int:
    """``argv[0]`` is "bench-gemm" or "bench-model"; the rest are its options."""
    command, rest = argv[0], argv[1:]
    return bench_gemm_main(rest) if command == "bench-gemm" else bench_model_main(rest)


__all__ = ["bench_gemm_main", "bench_model_main", "main"]
