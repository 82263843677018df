"""Command line: ``python -m qwen_resnorm_fp4 [--version] info | demo | bench ...`` (console script
``qwen-resnorm-fp4``).

- ``info``: versions, whether the compiled library is loaded, the GPU targets built in, the GPU found and the
  kernel path it takes, the environment switches in force (``--json`` for machine-readable output).
- ``demo``: one Qwen-Image-shaped step (image and text streams), fused vs unfused byte-exact check,
  dequantization error, time per call. Exits 1 if fused and unfused are not byte-exact.
- ``bench``, ``bench-pdl``, ``bench-per-token``, ``bench-gemm``, ``bench-fp8``, ``bench-fp8-linear``,
  ``bench-model``: the benchmarks (GPU only).
  They are not part of the installed package: each runs a script of the source repository's ``benchmarks/``
  (:data:`BENCHMARKS`) with this interpreter and this package, found next to the package (a checkout) or
  through QWEN_FP4_BENCHMARKS; where there is none, it says how to get one and exits 2.

Every option is checked before anything is printed or run: a wrong one gives argparse's usage message and
exit status 2.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, Optional, Sequence, Tuple

import torch

from ._argtypes import positive_int
from .info import PATH_CPU, collect_info, kernel_path
from .validation import WIDTH_RULE, is_supported_width

# ----------------------------------------------------------------------------------------------------
# info
# ----------------------------------------------------------------------------------------------------


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
        f"compiled library: {info['library'] if info['library_loaded'] else 'not loaded: ' + info['library']}",
        f"GPU targets:      {(' '.join(archs) if archs else 'none (pure Python build)') if archs is not None else na}",
        f"FlashInfer:       {info['flashinfer'] or ('not used (no Blackwell targets)' if archs is not None else na)}",
        f"built with:       torch {info['build_torch'] or '?'}, CUDA {info['build_cuda'] or 'none'}, "
        f"from commit {info['build_commit'] or 'n/a'}",
    ]
    if info["blackwell_emulation"]:
        lines.append("build kind:       Blackwell EMULATION (software E2M1 on sm_90a; a test build, never ship it)")
    lines.append(f"kernel path:      QWEN_FP4_KERNEL_PATH={info['kernel_path_switch']} (auto, portable or blackwell)")
    if info["gpus"]:
        for g in info["gpus"]:
            lines.append(f"GPU {g['index']}:            {g['name']} (compute capability {g['capability']})")
            lines.append(f"  path:           {g['path']}")
    else:
        lines.append("GPU:              none found")
        lines.append(f"  path:           {info['path']}")
    lines.append(f"fast math:        {'on' if info['fast_math_default'] else 'off'} by default")
    lines.append(f"PDL:              {'on' if info['pdl'] else 'off'} (programmatic dependent launch; "
                 "QWEN_FP4_PDL=1 on, 0 off)")
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
    """One stream of the demo: fused vs unfused bytes, the dequantization error, the time per call."""
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
    dim = args.dim
    if not is_supported_width(dim):
        print(f"qwen_resnorm_fp4 demo: --dim must be {WIDTH_RULE}, got {dim}", file=sys.stderr)
        return 2
    say = (lambda *a, **k: None) if args.json else print  # --json: only the JSON document on stdout
    image_rows = args.rows_image
    if image_rows is None:
        image_rows = 4096 if device.type == "cuda" else CPU_DEFAULT_IMAGE_ROWS
        if device.type == "cpu":
            say(f"on CPU (pure-PyTorch reference): {image_rows} image rows instead of 4096 "
                "(pass --rows-image 4096 for the full size)")
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
# bench*: the benchmarks of a checkout
# ----------------------------------------------------------------------------------------------------

#: The benchmark commands and the scripts under the repository's benchmarks/ that they run.
BENCHMARKS = {"bench": "bench_fused.py", "bench-pdl": "bench_pdl.py", "bench-per-token": "bench_per_token.py",
              "bench-gemm": "bench_gemm.py", "bench-fp8": "bench_fp8.py", "bench-fp8-linear": "bench_fp8_linear.py",
              "bench-model": "bench_model.py"}
#: A checkout's benchmarks/ directory, for an installed package that does not sit in a checkout.
BENCHMARKS_DIR_VAR = "QWEN_FP4_BENCHMARKS"
_PACKAGE_DIR = Path(__file__).resolve().parent


def find_benchmarks() -> Tuple[Optional[Path], str]:
    """(the benchmarks/ directory to run, "") or (None, why there is none): QWEN_FP4_BENCHMARKS when set, else
    the benchmarks/ of the source checkout this package sits in."""
    marker = BENCHMARKS["bench"]
    env_dir = os.environ.get(BENCHMARKS_DIR_VAR)
    if env_dir:
        found = Path(env_dir).expanduser().resolve()
        if (found / marker).is_file():
            return found, ""
        return None, f"{BENCHMARKS_DIR_VAR}={env_dir} has no {marker}"
    checkout = _PACKAGE_DIR.parent / "benchmarks"
    if (checkout / marker).is_file() and (_PACKAGE_DIR.parent / "pyproject.toml").is_file():
        return checkout, ""
    return None, f"this qwen_resnorm_fp4 ({_PACKAGE_DIR}) is an installed package, not a source checkout"


def how_to_get_benchmarks(command: str, why: str) -> str:
    """The message for a benchmark command where no benchmarks/ directory was found."""
    script = BENCHMARKS[command]
    return (f"qwen_resnorm_fp4 {command}: the benchmarks are not part of the installed package, and none were found "
            f"({why}).\nThey live in benchmarks/ of the qwen-resnorm-fp4 source repository (also in its source "
            f"distribution). Get a checkout of it and run, from its root, with this package installed:\n"
            f"    python benchmarks/{script} --help\n"
            f"or point {BENCHMARKS_DIR_VAR} at that checkout's benchmarks/ directory and run this command again:\n"
            f"    {BENCHMARKS_DIR_VAR}=/path/to/qwen-resnorm-fp4/benchmarks "
            f"python -m qwen_resnorm_fp4 {command} --help")


def run_benchmark(command: str, argv: Sequence[str]) -> int:
    """Run the script of ``command`` with ``argv`` in a child process of this interpreter, importing this
    qwen_resnorm_fp4 (its directory first on PYTHONPATH); its exit status. Without a benchmarks/ directory: the
    how-to message, exit status 2."""
    directory, why = find_benchmarks()
    if directory is None:
        print(how_to_get_benchmarks(command, why), file=sys.stderr)
        return 2
    env = dict(os.environ)
    # The child finds this package as this process did, except through the current directory (sys.path[0]).
    if str(_PACKAGE_DIR.parent) not in {str(Path(p or ".").resolve()) for p in sys.path[1:]}:
        env["PYTHONPATH"] = os.pathsep.join([str(_PACKAGE_DIR.parent)] + [p for p in [env.get("PYTHONPATH")] if p])
    return subprocess.call([sys.executable, str(directory / BENCHMARKS[command]), *argv], env=env)


# ----------------------------------------------------------------------------------------------------
# entry point
# ----------------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    from . import __version__

    p = argparse.ArgumentParser(
        prog="python -m qwen_resnorm_fp4",
        description="qwen-resnorm-fp4: fused residual + LayerNorm + adaLN + NVFP4 quantization.")
    p.add_argument("--version", action="version", version=f"qwen_resnorm_fp4 {__version__}")
    sub = p.add_subparsers(dest="command", metavar="{info,demo," + ",".join(BENCHMARKS) + "}")
    sub.required = True
    pi = sub.add_parser("info", help="versions, build, library, GPU and kernel path, environment switches")
    pi.add_argument("--json", action="store_true", help="print JSON")
    pd = sub.add_parser("demo", help="a Qwen-Image-shaped step: fused vs unfused, error, time")
    pd.add_argument("--device", choices=["cpu", "cuda"], default=None,
                    help="default: cuda when a GPU and the compiled library are present, else cpu")
    pd.add_argument("--rows-image", type=positive_int, default=None,
                    help="image-stream rows (default 4096; 256 on CPU)")
    pd.add_argument("--rows-text", type=positive_int, default=17, help="text-stream rows (default 17)")
    pd.add_argument("--dim", type=int, default=3072, help=f"hidden size D, {WIDTH_RULE} (default 3072)")
    pd.add_argument("--reps", type=positive_int, default=None, help="timed calls (default 50 on GPU, 3 on CPU)")
    pd.add_argument("--json", action="store_true", help="print the results as JSON only")
    what = {"bench": "the fused op vs its peers", "bench-pdl": "a GEMM -> fused op pair, PDL on and off",
            "bench-per-token": "per-token modulation vs FlashInfer's DiT kernel",
            "bench-gemm": "NVFP4 GEMM paths vs BF16", "bench-fp8": "the FP8 ops vs their peers",
            "bench-fp8-linear": "FP8Linear vs BF16 Linear", "bench-model": "Qwen-Image transformer vs BF16"}
    for name, script in BENCHMARKS.items():
        sub.add_parser(name, add_help=False,
                       help=f"{what[name]} (GPU only; runs a checkout's benchmarks/{script}; {name} --help)")
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in BENCHMARKS:  # the benchmark owns its options
        return run_benchmark(argv[0], argv[1:])
    args = build_parser().parse_args(argv)
    if args.command == "info":
        return cmd_info(args)
    if args.command == "demo":
        return cmd_demo(args)
    return 2


if __name__ == "__main__":
    sys.exit(main())
