"""FlashInfer's DiT LayerNorm kernel as a benchmark peer, built at benchmark time.

FlashInfer 0.7.4's ``fused_dit_gate_residual_layernorm_scale_shift`` (WAN 2.2: gate/scale/shift per token,
read with row stride 6*D from ``temb.chunk(6, dim=2)``; D = 3072 only; NVFP4 output only on SM100+, so the
benchmark uses its BF16 output) is header-only: flashinfer/norm/fused_dit_layernorm.cuh. flashinfer_dit.cu
(next to this file) calls its launcher; :func:`load` compiles that with torch.utils.cpp_extension against
the installed header, or says why it cannot.

Its numerics differ from this library's contract (docs/numerics.md): :data:`NUMERICS_NOTE`.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path
from types import ModuleType
from typing import List, Optional, Tuple

#: The header's path under an include root.
HEADER = Path("flashinfer") / "norm" / "fused_dit_layernorm.cuh"
#: The one width the kernel is built for.
DIM = 3072
SOURCE = Path(__file__).with_name("flashinfer_dit.cu")
EXTENSION_NAME = "qwen_fp4_peer_flashinfer_dit"
#: How FlashInfer's kernel differs from this library's numerics contract: a speed peer, not a byte peer.
NUMERICS_NOTE = ("FlashInfer's DiT kernel is a speed peer, not byte-compatible with this library: its row "
                 "statistics are taken over the fp32 residual sum before its bf16 rounding (the contract: over "
                 "the stored bf16 r), in one pass (E[r^2] - mu^2, clamped at 0; the contract: two passes), the "
                 "normalized value is not rounded to bf16 before the modulation, and it adds (1 + (scale + "
                 "scale_bias)) with the bias first; before SM100 the compiler may contract its arithmetic")


def include_roots() -> List[Path]:
    """Where FlashInfer's header may be, in order: QWEN_FP4_FLASHINFER_DIR (the build's variable: a FlashInfer
    source tree, or an include root), a checkout under the repository's third_party/flashinfer, the installed
    flashinfer-python package's data/include (found without importing FlashInfer)."""
    roots: List[Path] = []
    env = os.environ.get("QWEN_FP4_FLASHINFER_DIR")
    if env:
        base = Path(env)
        roots += [base / "include", base, base / "data" / "include", base / "flashinfer" / "data" / "include"]
    roots.append(Path(__file__).resolve().parents[2] / "third_party" / "flashinfer" / "include")  # benchmarks/peers/..
    try:
        spec = importlib.util.find_spec("flashinfer")
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.submodule_search_locations:
        roots.append(Path(list(spec.submodule_search_locations)[0]) / "data" / "include")
    return roots


def find_include_root() -> Optional[Path]:
    """The first of :func:`include_roots` that holds the header, or None."""
    return next((r for r in include_roots() if (r / HEADER).is_file()), None)


def nvcc_path() -> Optional[str]:
    """nvcc of the CUDA toolkit torch.utils.cpp_extension would use, or None."""
    from torch.utils import cpp_extension

    home = cpp_extension.CUDA_HOME
    if home:
        nvcc = Path(home) / "bin" / "nvcc"
        if nvcc.is_file():
            return str(nvcc)
    return shutil.which("nvcc")


def unavailable_reason() -> Optional[str]:
    """Why the peer cannot be built here (no GPU, no header, no nvcc), or None."""
    import torch

    if not torch.cuda.is_available():
        return "no CUDA GPU is available"
    if find_include_root() is None:
        tried = ", ".join(str(r) for r in include_roots())
        return (f"FlashInfer's header {HEADER} was not found (tried {tried}); install flashinfer-python or set "
                "QWEN_FP4_FLASHINFER_DIR")
    if nvcc_path() is None:
        return "nvcc was not found (set CUDA_HOME to a CUDA toolkit)"
    return None


def load(verbose: bool = False) -> Tuple[Optional[ModuleType], str]:
    """(the compiled extension, where its header came from), or (None, why not). The build is cached by
    torch.utils.cpp_extension (TORCH_EXTENSIONS_DIR); a failed build is a reason, not an exception."""
    reason = unavailable_reason()
    if reason is not None:
        return None, reason
    from torch.utils import cpp_extension

    root = find_include_root()
    undef = ["-U__CUDA_NO_HALF_OPERATORS__", "-U__CUDA_NO_HALF_CONVERSIONS__",
             "-U__CUDA_NO_BFLOAT16_CONVERSIONS__", "-U__CUDA_NO_HALF2_OPERATORS__"]
    try:
        module = cpp_extension.load(name=EXTENSION_NAME, sources=[str(SOURCE)], extra_include_paths=[str(root)],
                                    extra_cuda_cflags=["-O3", *undef], verbose=verbose)
    except (RuntimeError, OSError, ImportError) as exc:  # a peer that fails to build is reported, not fatal
        return None, f"building {SOURCE.name} against {root} failed: {type(exc).__name__}: {str(exc)[-500:]}"
    return module, f"built from {root / HEADER}"
