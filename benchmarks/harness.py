"""What every benchmark entry point shares besides timing and writing: argument types, the common options,
the GPU check, the run header, and the byte model and inputs of the op under benchmark.

The benchmarks import the ``qwen_resnorm_fp4`` that Python finds (an editable install, ``PYTHONPATH=.`` in a
checkout with the in-place build, or an installed wheel); the header names which one.
"""

from __future__ import annotations

import argparse
import datetime
import math
import sys
from pathlib import Path
from typing import Callable, List, Optional, Sequence

import torch
from qwen_resnorm_fp4._argtypes import positive_int, positive_int_list  # noqa: F401 - the CLI's argument types
from qwen_resnorm_fp4.layout import packed_shape, scales_bytes
from qwen_resnorm_fp4.recipe import global_scale_numerator

#: The op's eps in every benchmark.
EPS = 1e-6


def choice_list(allowed: Sequence[str], what: str) -> Callable[[str], List[str]]:
    """argparse type: comma-separated values of ``allowed`` (``what`` names them in the error), at least one,
    duplicates dropped, in the order given."""
    def parse(text: str) -> List[str]:
        values = [v for v in text.replace(" ", "").split(",") if v]
        bad = [v for v in values if v not in allowed]
        if not values or bad:
            raise argparse.ArgumentTypeError(f"expected comma-separated {what} of {', '.join(allowed)}, got {text!r}")
        return list(dict.fromkeys(values))

    return parse


def compile_for_many_shapes(at_least: int = 64):
    """torch._dynamo with its recompile limit (``recompile_limit`` or, in older torch, ``cache_size_limit``)
    raised to ``at_least``: a benchmark compiles one peer per shape. Returns ``torch._dynamo``."""
    import torch._dynamo as dynamo  # "as": a bare "import torch._dynamo" would make torch a local name

    for knob in ("recompile_limit", "cache_size_limit"):
        if hasattr(dynamo.config, knob):
            setattr(dynamo.config, knob, max(getattr(dynamo.config, knob), at_least))
    return dynamo


def add_out_argument(parser: argparse.ArgumentParser) -> None:
    """``--out DIR`` (default benchmarks/results), the directory every benchmark writes into."""
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"),
                        help="output directory (default benchmarks/results)")


def gpu_unavailable_reason() -> Optional[str]:
    """Why the benchmark cannot run here (no GPU, or the package's compiled kernels not loaded), or None."""
    from qwen_resnorm_fp4.info import collect_info

    if not torch.cuda.is_available():
        return "no CUDA GPU is available"
    doc = collect_info()
    if not doc["library_loaded"]:
        return f"the compiled CUDA library of qwen_resnorm_fp4 is not loaded ({doc['library']})"
    return None


def refuse_without_gpu(prog: str) -> Optional[int]:
    """None where the benchmark can run, else 2 after saying why on stderr."""
    reason = gpu_unavailable_reason()
    if reason is None:
        return None
    print(f"{prog}: GPU only, and {reason}. Nothing to measure; run it on a machine with a CUDA GPU and a build "
          "of qwen_resnorm_fp4 with its kernels.", file=sys.stderr)
    return 2


def run_header() -> List[str]:
    """Lines that say what was measured: GPU and kernel path, versions, the package's build commit and
    where it was imported from, the date."""
    import qwen_resnorm_fp4
    from qwen_resnorm_fp4.env import default_fast_math
    from qwen_resnorm_fp4.info import collect_info, kernel_path

    doc = collect_info()
    cap = torch.cuda.get_device_capability(0)
    date = datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    return [
        f"GPU: {torch.cuda.get_device_name(0)} (sm_{cap[0]}{cap[1]}), kernel path: {kernel_path(cap)}",
        f"torch {torch.__version__}, CUDA {torch.version.cuda}, qwen_resnorm_fp4 {doc['version']} "
        f"(build commit {doc['build_commit'] or 'n/a'}, from {Path(qwen_resnorm_fp4.__file__).parent}), {date}",
        f"fast_math={default_fast_math()}, PDL {'on' if doc['pdl'] else 'off'}, switches: "
        + (", ".join(f"{k}={v}" for k, v in doc["switches"].items()) or "none set"),
    ]


def bytes_moved(rows: int, dim: int) -> int:
    """Bytes the fused op must move for ``rows`` rows of width ``dim``: residual and x read (bf16),
    residual_out written (bf16), packed E2M1 written (D/2 per row), E4M3 scales written for
    round_up(rows, 128) rows (D/16 per row). gate/scale/shift ([1, D]) are negligible and not counted.
    At D = 3072: 20,160 bytes per row (12,288 + 6,144 + 1,536 + 192)."""
    return 2 * dim * 2 * rows + dim * 2 * rows + math.prod(packed_shape(rows, dim)) + scales_bytes(rows, dim)


def global_scale_for(y: torch.Tensor) -> torch.Tensor:
    """The standard recipe's NVFP4 global scale of ``y``, 448 * 6 / max |y|: fp32 [1]."""
    return (global_scale_numerator(0) / y.float().abs().amax().clamp(min=1e-12)).reshape(1).float()
