"""Finds and loads the compiled CUDA library, if this install has one."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import torch

_loaded: Optional[Path] = None
_load_error: Optional[str] = None


def load() -> None:
    """Load ``_C.*.so`` once. A pure-Python install (no CUDA toolkit at build time) has none: fine."""
    global _loaded, _load_error
    if _loaded is not None or _load_error is not None:
        return
    candidates = sorted(Path(__file__).parent.glob("_C.*so"))  # not _C_testing (qwen_resnorm_fp4.testing)
    if not candidates:
        _load_error = "not built (this install is pure Python: CPU reference only)"
        return
    try:
        torch.ops.load_library(str(candidates[0]))
        _loaded = candidates[0]
    except OSError as exc:  # e.g. a CUDA runtime that does not match the build
        _load_error = f"failed to load {candidates[0].name}: {exc}"


def cuda_available() -> bool:
    """True when the CUDA kernels are loaded (a GPU may still be absent)."""
    return _loaded is not None


@torch.compiler.assume_constant_result
def has_kernel(op: str, device_type: str) -> bool:
    """Whether ``torch.ops.qwen_fp4.<op>`` has an implementation for this device type ("cpu", "cuda"); a
    constant for torch.compile. Without the compiled library CUDA tensors have none (callers then use the
    reference)."""
    key = {"cpu": "CPU", "cuda": "CUDA"}.get(device_type)
    return key is not None and bool(torch._C._dispatch_has_kernel_for_dispatch_key(f"qwen_fp4::{op}", key))


def status() -> str:
    """One line: the loaded library or why there is none."""
    return f"loaded {_loaded.name}" if _loaded is not None else str(_load_error)
