"""What inductor generated, kept for a diff: two compilations that should give the same bytes and do not.

- ``numerics_settings()``: the process's switches that change GPU numerics (TF32, reduced-precision
  reductions, cuDNN, deterministic algorithms, the SDPA backends), by name.
- ``deterministic_compilation(**options)``: the inductor configuration of one fresh compilation in its
  deterministic mode, entered once per compilation.
- ``deterministic_flags(codes)``: how many Triton kernels of a compilation were generated in inductor's
  deterministic mode and how many not (their ``inductor_meta`` says).
- ``write_compilations(codes, out)``: each compilation's generated code (``<name>_<n>.py``, from
  ``torch._inductor.utils.run_and_get_code``) and those settings (``settings.txt``) into the directory ``out``,
  emptied first, so that it holds one comparison's files.
"""

from __future__ import annotations

import os
import shutil
from typing import Any, Dict, List

import torch


def numerics_settings() -> Dict[str, Any]:
    """The switches of this process that change what GPU kernels compute."""
    matmul, cudnn, cuda = torch.backends.cuda.matmul, torch.backends.cudnn, torch.backends.cuda
    return {"allow_tf32": matmul.allow_tf32, "float32_matmul_precision": torch.get_float32_matmul_precision(),
            "allow_bf16_reduced_precision_reduction": matmul.allow_bf16_reduced_precision_reduction,
            "allow_fp16_reduced_precision_reduction": matmul.allow_fp16_reduced_precision_reduction,
            "cudnn.allow_tf32": cudnn.allow_tf32, "cudnn.deterministic": cudnn.deterministic,
            "cudnn.benchmark": cudnn.benchmark,
            "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
            "sdp backends (flash, mem_efficient, math, cudnn)": (
                cuda.flash_sdp_enabled(), cuda.mem_efficient_sdp_enabled(), cuda.math_sdp_enabled(),
                cuda.cudnn_sdp_enabled())}


def deterministic_compilation(**options: Any) -> Any:
    """``torch._inductor.config.patch``: deterministic mode (no timing-based choice that changes numerics),
    caches off (the compilation makes its own choices, none read from an earlier one's) and ``options``. Enter it
    once per compilation: dynamo ends each frame with ``torch.use_deterministic_algorithms(<the process's
    setting>)``, which also sets inductor's deterministic flag, so one patch around two compilations would leave
    the second without it."""
    import torch._inductor.config as inductor_config

    return inductor_config.patch(deterministic=True, force_disable_caches=True, **options)


def deterministic_flags(codes: List[str]) -> Dict[bool, int]:
    """How many Triton kernels of ``codes`` (one compilation's generated sources) say ``'deterministic': True``
    and how many ``False`` in their ``inductor_meta``: a compilation in inductor's deterministic mode has only
    the first."""
    text = "".join(codes)
    return {flag: text.count(f"'deterministic': {flag}") for flag in (True, False)}


def write_compilations(codes: Dict[str, List[str]], out: str) -> str:
    """``codes`` (name -> the compilation's generated sources) as ``out/<name>_<n>.py``, and
    :func:`numerics_settings` as ``out/settings.txt``; ``out`` is emptied first. Returns ``out``."""
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    for name, texts in codes.items():
        for n, text in enumerate(texts):
            with open(os.path.join(out, f"{name}_{n}.py"), "w") as f:
                f.write(text)
    with open(os.path.join(out, "settings.txt"), "w") as f:
        f.write("".join(f"{k}: {v}\n" for k, v in numerics_settings().items()))
    return out
