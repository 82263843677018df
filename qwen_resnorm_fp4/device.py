"""What the CUDA devices of this process are and which of them the compiled kernels serve, asked once per
device and cached. Each answer is a constant for torch.compile (``torch.compiler.assume_constant_result``),
so a compiled caller does not guard on it.

A machine without a usable CUDA setup has no devices here: the questions answer "none" and never raise.
"""

from __future__ import annotations

from typing import Dict, Optional, Tuple

import torch

from . import _library

#: The oldest GPU the compiled code serves (sm_90).
MIN_CAPABILITY = (9, 0)

_capabilities: Dict[int, Optional[Tuple[int, int]]] = {}
_kernel_serves: Dict[int, bool] = {}


def capability(index: int) -> Optional[Tuple[int, int]]:
    """The compute capability of CUDA device ``index`` (-1: the current one), or None where CUDA is not
    usable (no GPU, a CPU build of torch, a driver that fails to initialise)."""
    try:
        if index < 0:
            if not torch.cuda.is_available():
                return None
            index = torch.cuda.current_device()
        if index in _capabilities:
            return _capabilities[index]
        cap = tuple(torch.cuda.get_device_capability(index)) if torch.cuda.is_available() else None
    except (RuntimeError, AssertionError):  # torch.cuda's errors for a broken or absent CUDA setup
        cap = None
    _capabilities[index] = cap
    return cap


@torch.compiler.assume_constant_result
def capability_major(index: int) -> int:
    """The compute capability major of CUDA device ``index`` (-1: the current one); 0 without CUDA."""
    cap = capability(index)
    return 0 if cap is None else cap[0]


@torch.compiler.assume_constant_result
def kernel_serves_cuda_device(index: int) -> bool:
    """True when the compiled library is loaded (loading it registers its CUDA kernels) and CUDA device
    ``index`` (>= 0) is sm_90 or newer."""
    hit = _kernel_serves.get(index)
    if hit is None:
        cap = capability(index) if _library.cuda_available() else None
        hit = _kernel_serves[index] = cap is not None and cap >= MIN_CAPABILITY
    return hit


def forget() -> None:
    """Drop the cached answers (the next question asks torch.cuda again)."""
    _capabilities.clear()
    _kernel_serves.clear()


__all__ = ["MIN_CAPABILITY", "capability", "capability_major", "kernel_serves_cuda_device", "forget"]
