"""Command line: ``python -m qwen_resnorm_fp4 info | demo | bench`` (console script ``qwen-resnorm-fp4``).

- ``info``: versions, the compiled library, the GPU targets built in, the GPU found and the kernel path it
  takes, the environment switches in force (``--json`` for machine-readable output).
- ``demo``: one Qwen-Image-shaped step (image and text streams), fused vs unfused byte-exact check,
  dequantization error, time per call. Exits 1 if fused and unfused are not byte-exact.
- ``bench``: the benchmark (GPU only, see :mod:`qwen_resnorm_fp4.bench`).
- ``bench-gemm``, ``bench-model``: the NVFP4 GEMM paths and a diffusers Qwen-Image transformer against BF16
  (GPU only, see :mod:`qwen_resnorm_fp4.bench_gemm`).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from typing import Dict, List, Optional, Sequence, Tuple

import torch

PATH_BLACKWELL = "Blackwell (FlashInfer conversion)"
PATH_PORTABLE = "portable (software E2M1, = cuda_fp4.h)"
PATH_PORTABLE_JIT = "portable (software E2M1, = cuda_fp4.h; compute_90 PTX JIT)"
PATH_CPU = "CPU reference"


# ----------------------------------------------------------------------------------------------------
# info
# ----------------------------------------------------------------------------------------------------


def build_info() -> Dict[str, object]:
    """What setup.py recorded at build time (None fields in a source tree that was never built)."""
    try:
        from . import _build_info as b
    except ImportError:
        return {"cuda_archs": None, "flashinfer": None, "build_torch": None, "build_cuda": None, "build_commit": None}
    return {
        "cuda_archs": list(getattr(b, "CUDA_ARCHS", []) or []),
        "flashinfer": getattr(b, "FLASHINFER", None),
        "build_torch": getattr(b, "BUILD_TORCH", None),
        "build_cuda": getattr(b, "BUILD_CUDA", None),
        "build_commit": getattr(b, "BUILD_COMMIT", None),  # the checkout's commit at build time
    }


def _parse_arch(arch: str) -> Optional[Tuple[bool, int, int, str]]:
    """'100f' -> (False, 10, 0, 'f'); 'compute_90' -> (True, 9, 0, ''); None if unparseable."""
    a = arch.strip().lower()
    ptx = a.startswith("compute_")
    a = a.replace("compute_", "").replace("sm_", "")
    digits = "".join(c for c in a if c.isdigit())
    suffix = a[len(digits):]
    if len(digits) < 2:
        return None
    num = int(digits)
    return ptx, num // 10, num % 10, suffix


def _cubin_runs_on(major: int, minor: int, am: int, an: int, suffix: str) -> bool:
    if suffix == "a":  # architecture-specific: that exact chip only
        return (major, minor) == (am, an)
    # family-specific ('f', e.g. sm_100f = 10.0 and 10.3; sm_120f = 12.0 and 12.1) or plain: same major, newer minor
    return major == am and minor >= an


def kernel_path(capability: Optional[Tuple[int, int]], archs: Optional[List[str]] = None,
                library_loaded: Optional[bool] = None) -> str:
    """Which implementation the ops take on a GPU of this compute capability (None: no GPU)."""
    from . import _library

    if library_loaded is None:
        library_loaded = _library.cuda_available()
    if archs is None:
        archs = build_info()["cuda_archs"] or []
    if capability is None:
        return f"{PATH_CPU} (no GPU)" if library_loaded else PATH_CPU
    if not library_loaded:
        return f"{PATH_CPU} (the compiled library is not loaded: CUDA tensors are not supported)"
    major, minor = capability
    parsed = [p for p in (_parse_arch(a) for a in archs) if p is not None]
    cubins = [(am, an, sfx) for ptx, am, an, sfx in parsed if not ptx and _cubin_runs_on(major, minor, am, an, sfx)]
    if major >= 10 and any(am >= 10 for am, _, _ in cubins):
        return PATH_BLACKWELL
    if cubins:
        return PATH_PORTABLE
    if any(ptx and (am, an) <= (major, minor) for ptx, am, an, _ in parsed):
        return PATH_PORTABLE_JIT
    return (f"none: this build ({' '.join(archs) or 'no GPU targets'}) has no kernel for sm_{major}{minor}; "
            "CUDA tensors will fail, CPU tensors use the reference")


def collect_info() -> Dict[str, object]:
    from . import __version__, _library
    from .env import default_fast_math, switches_in_force

    bi = build_info()
    gpus = []
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            cap = torch.cuda.get_device_capability(i)
            gpus.append({"index": i, "name": torch.cuda.get_device_name(i),
                         "capability": f"{cap[0]}.{cap[1]}", "path": kernel_path(cap)})
    return {
        "version": __version__,
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "library_loaded": _library.cuda_available(),
        "library": _library.status(),
        "cuda_archs": bi["cuda_archs"],
        "flashinfer": bi["flashinfer"],
        "build_torch": bi["build_torch"],
        "build_cuda": bi["build_cuda"],
        "build_commit": bi["build_commit"],
        "gpus": gpus,
        "path": gpus[0]["path"] if gpus else kernel_path(None),
        "fast_math_default": default_fast_math(),
        "switches": switches_in_force(),
    }


def cmd_info(args: argparse.Namespace) -> int:
    info = collect_info()
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    na = "unknown (no build info: a source tree that was never built)"
    archs = info["cuda_archs"]
    lines = [
        f"qwen_resnorm_fp4 {info['version']}",
        f"torch:            {info['torch']} (CUDA {info['torch_cuda'] or 'none: CPU build'})",
        f"compiled library: {info['library']}",
        f"GPU targets:      {(' '.join(archs) if archs else 'none (pure Python build)') if archs is not None else na}",
        f"FlashInfer:       {info['flashinfer'] or ('not used (no Blackwell targets)' if archs is not None else na)}",
        f"built with:       torch {info['build_torch'] or '?'}, CUDA {info['build_cuda'] or 'none'}, "
        f"from commit {info['build_commit'] or 'n/a'}",
    ]
    if info["gpus"]:
        for g in info["gpus"]:
            lines.append(f"GPU {g['index']}:            {g['name']} (compute capability {g['capability']})")
            lines.append(f"  path:           {g['path']}")
    else:
        lines.append("GPU:              none found")
        lines.append(f"  path:           {info['path']}")
    lines.append(f"fast math:        {'on' if info['fast_math_default'] else 'off'} by default")
    sw = info["switches"]
    lines.append("switches:         " + (", ".join(f"{k}={v}" for k, v in sw.items()) if sw else "none set"))
    print("\n".join(lines))
    return 0


# ----------------------------------------------------------------------------------------------------
# demo
# ----------------------------------------------------------------------------------------------------

CPU_DEFAULT_IMAGE_ROWS = 256


def _time_us(fn, device: torch.device, reps: int, warmup: int) -> float:
    for _ in range(warmup):
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        times = []
        for _ in range(reps):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            fn()
            e.record()
            e.synchronize()
            times.append(s.elapsed_time(e) * 1e3)
        return statistics.median(times)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(times)


def demo_stream(name: str, rows: int, dim: int, device: torch.device, seed: int, reps: int) -> Dict[str, object]:
    from . import api
    from .linear import FP4_AMAX_SCALE

    gen = torch.Generator().manual_seed(seed)
    bf = torch.bfloat16
    residual = (torch.randn(1, rows, dim, generator=gen) * 4).to(device=device, dtype=bf)
    x = torch.randn(1, rows, dim, generator=gen).to(device=device, dtype=bf)
    gate = (torch.randn(1, dim, generator=gen) * 0.5).to(device=device, dtype=bf)
    scale = (torch.randn(1, dim, generator=gen) * 0.1).to(device=device, dtype=bf)
    shift = (torch.randn(1, dim, generator=gen) * 0.1).to(device=device, dtype=bf)

    y, r_unfused = api.resnorm(residual, x, None, gate, scale, shift)
    amax = y.float().abs().amax().clamp(min=1e-12)
    gs = (FP4_AMAX_SCALE / amax).reshape(1).to(torch.float32)
    p_unfused, s_unfused = api.nvfp4_quantize(y, gs)
    p_fused, s_fused, r_fused = api.resnorm_quant(residual, x, None, gate, scale, shift, gs)
    exact = {
        "packed": bool(torch.equal(p_fused, p_unfused)),
        "scales": bool(torch.equal(s_fused, s_unfused)),
        "residual_out": bool(torch.equal(r_fused, r_unfused)),
    }
    deq = api.dequantize_nvfp4(p_fused, s_fused, gs, rows=rows)
    yf = y.float().reshape(rows, dim)
    err = deq - yf
    max_abs = err.abs().max().item()
    rel_rms = (err.pow(2).mean().sqrt() / yf.pow(2).mean().sqrt().clamp(min=1e-30)).item()

    warmup = 5 if device.type == "cuda" else 1
    fused_us = _time_us(lambda: api.resnorm_quant(residual, x, None, gate, scale, shift, gs), device, reps, warmup)

    def unfused():
        yy, _ = api.resnorm(residual, x, None, gate, scale, shift)
        return api.nvfp4_quantize(yy, gs)

    unfused_us = _time_us(unfused, device, reps, warmup)
    return {"stream": name, "shape": [1, rows, dim], "global_scale": gs.item(), "byte_exact": all(exact.values()),
            "exact": exact, "dequant_max_abs": max_abs, "dequant_rel_rms": rel_rms, "y_amax": amax.item(),
            "fused_us": fused_us, "unfused_us": unfused_us}


def cmd_demo(args: argparse.Namespace) -> int:
    from . import _library
    from .api import WIDTH_RULE, is_supported_width

    gpu_ok = torch.cuda.is_available() and _library.cuda_available()
    if args.device is None:
        device = torch.device("cuda" if gpu_ok else "cpu")
    else:
        device = torch.device(args.device)
        if device.type == "cuda" and not gpu_ok:
            why = "no CUDA GPU is available" if not torch.cuda.is_available() else \
                f"the compiled library is not loaded ({_library.status()})"
            print(f"qwen_resnorm_fp4 demo: --device cuda asked for, but {why}", file=sys.stderr)
            return 2
    say = (lambda *a, **k: None) if args.json else print  # --json: only the JSON document on stdout
    image_rows = args.rows_image
    if image_rows is None:
        image_rows = 4096 if device.type == "cuda" else CPU_DEFAULT_IMAGE_ROWS
        if device.type == "cpu":
            say(f"on CPU (pure-PyTorch reference): {image_rows} image rows instead of 4096 "
                  "(pass --rows-image 4096 for the full size)")
    dim = args.dim
    if not is_supported_width(dim):
        print(f"qwen_resnorm_fp4 demo: --dim must be {WIDTH_RULE}, got {dim}", file=sys.stderr)
        return 2
    reps = args.reps if args.reps is not None else (50 if device.type == "cuda" else 3)
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    cap = torch.cuda.get_device_capability(device) if device.type == "cuda" else None
    say(f"device: {where}, path: {kernel_path(cap) if device.type == 'cuda' else PATH_CPU}")
    timing = "CUDA events, median, warm L2" if device.type == "cuda" else "perf_counter, median"
    say(f"Qwen-Image-shaped step, bf16, gate/scale/shift [1, D], no bias; time per call: {timing} of {reps}")

    results = []
    for i, (name, rows) in enumerate((("image", image_rows), ("text", args.rows_text))):
        r = demo_stream(name, rows, dim, device, seed=i, reps=reps)
        results.append(r)
        bad = [k for k, v in r["exact"].items() if not v]
        say(f"{name:5s} stream [1, {rows}, {dim}]: fused == unfused byte-exact: "
              f"{'yes' if not bad else 'NO (' + ', '.join(bad) + ' differ)'}; "
              f"global scale {r['global_scale']:.4g}; dequant error vs y: max abs {r['dequant_max_abs']:.4g}, "
              f"rel RMS {r['dequant_rel_rms']:.4f}")
        speed = r["unfused_us"] / r["fused_us"] if r["fused_us"] > 0 else math.nan
        say(f"      fused {r['fused_us']:.1f} us/call, unfused (resnorm + nvfp4_quantize) {r['unfused_us']:.1f} "
              f"us/call ({speed:.2f}x)")
    if args.json:
        print(json.dumps({"device": str(device), "path": kernel_path(cap) if cap else PATH_CPU,
                          "streams": results}, indent=2))
    if not all(r["byte_exact"] for r in results):
        print("FAIL: fused and unfused outputs are not byte-exact", file=sys.stderr)
        return 1
    return 0


# ----------------------------------------------------------------------------------------------------
# entry point
# ----------------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m qwen_resnorm_fp4",
                                description="qwen-resnorm-fp4: fused residual + LayerNorm + adaLN + NVFP4 quantization.")
    sub = p.add_subparsers(dest="command", metavar="{info,demo,bench,bench-gemm,bench-model}")
    sub.required = True
    pi = sub.add_parser("info", help="versions, build, GPU and kernel path, environment switches")
    pi.add_argument("--json", action="store_true", help="print JSON")
    pd = sub.add_parser("demo", help="a Qwen-Image-shaped step: fused vs unfused, error, time")
    pd.add_argument("--device", choices=["cpu", "cuda"], default=None,
                    help="default: cuda when a GPU and the compiled library are present, else cpu")
    pd.add_argument("--rows-image", type=int, default=None,
                    help="image-stream rows (default 4096; 256 on CPU)")
    pd.add_argument("--rows-text", type=int, default=17, help="text-stream rows (default 17)")
    pd.add_argument("--dim", type=int, default=3072, help="hidden size D (default 3072)")
    pd.add_argument("--reps", type=int, default=None, help="timed calls (default 50 on GPU, 3 on CPU)")
    pd.add_argument("--json", action="store_true", help="print the results as JSON only")
    sub.add_parser("bench", help="benchmark (GPU only): python -m qwen_resnorm_fp4 bench --help", add_help=False)
    for name, what in (("bench-gemm", "NVFP4 GEMM paths vs BF16"), ("bench-model", "Qwen-Image transformer vs BF16")):
        sub.add_parser(name, help=f"{what} (GPU only): python -m qwen_resnorm_fp4 {name} --help", add_help=False)
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "bench":  # the benchmark owns its options
        from . import bench

        return bench.main(argv[1:])
    if argv and argv[0] in ("bench-gemm", "bench-model"):  # likewise
        from . import bench_gemm

        return bench_gemm.main(argv)
    args = build_parser().parse_args(argv)
    if args.command == "info":
        return cmd_info(args)
    if args.command == "demo":
        if args.rows_image is not None and args.rows_image <= 0 or args.rows_text <= 0:
            print("qwen_resnorm_fp4 demo: row counts must be positive", file=sys.stderr)
            return 2
        return cmd_demo(args)
    return 2


if __name__ == "__main__":
    sys.exit(main())
