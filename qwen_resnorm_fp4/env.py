"""Environment switches, read at call time exactly as the production quantizer reads them (a switch is on
when its variable is exactly "1").

They are read with the C library's ``getenv``, the process environment that FlashInfer's and TensorRT-LLM's
C++ read too. ``os.environ`` writes reach it (``os.environ[...] = ...`` calls ``putenv``, ``del`` calls
``unsetenv``), so a change made from Python takes effect at the next call. It costs a fifth of
``os.environ.get`` of an unset name, which raises and catches KeyError inside ``os._Environ``. Without a C
library to call (or under torch.compile tracing, which cannot trace a foreign call) ``os.environ`` is read.
"""

from __future__ import annotations

import ctypes
import os
from typing import Callable, Dict, Optional

import torch

#: Either one set to "1" disables fast math in FlashInfer's / TensorRT-LLM's fp4_quantize.
FAST_MATH_DISABLE_VARS = ("FLASHINFER_DISABLE_FP4_QUANT_FAST_MATH", "TRTLLM_DISABLE_FP4_QUANT_FAST_MATH")
#: "1" turns on the 4over6 recipe (FlashInfer's legacy switch; an omitted ``nvfp4_4over6=`` reads it), with
#: the three below as its fields (qwen_resnorm_fp4.recipe.nvfp4_4over6_from_env).
FOUR_OVER_SIX_VAR = "FLASHINFER_NVFP4_4OVER6"
#: "1": e4m3_max 256 (else 448).
FOUR_OVER_SIX_E4M3_256_VAR = "FLASHINFER_NVFP4_4OVER6_E4M3_USE_256"
#: "MAE" (the default when unset) or "MSE", any case.
FOUR_OVER_SIX_ERR_MODE_VAR = "FLASHINFER_NVFP4_4OVER6_ERR_MODE"
#: "1": the fp16 form of the block error.
FOUR_OVER_SIX_ERR_FAST_MATH_VAR = "FLASHINFER_NVFP4_4OVER6_ERR_USE_FAST_MATH"
FOUR_OVER_SIX_VARS = (FOUR_OVER_SIX_VAR, FOUR_OVER_SIX_E4M3_256_VAR, FOUR_OVER_SIX_ERR_MODE_VAR,
                      FOUR_OVER_SIX_ERR_FAST_MATH_VAR)
#: "1" turns the fused path off in try_fused_resnorm_quant.
DISABLE_VAR = "QWEN_FP4_DISABLE"
#: Programmatic dependent launch of the kernels: "0" off, "1" on, unset (or any other value): PDL_DEFAULT.
#: The compiled library reads it too (csrc/launch_portable.cu, pdl_enabled), with the same rule, at every call.
PDL_VAR = "QWEN_FP4_PDL"
#: What an unset QWEN_FP4_PDL means.
PDL_DEFAULT = False
#: The quantizing CUDA ops' kernel path, read by csrc/ops.cpp on every call: one of KERNEL_PATHS (unset: auto).
KERNEL_PATH_VAR = "QWEN_FP4_KERNEL_PATH"
#: auto: the Blackwell path where this build can run it, else portable; portable: always the portable path;
#: blackwell: always the Blackwell path (the op raises where it is not usable).
KERNEL_PATHS = ("auto", "portable", "blackwell")

ALL_VARS = (DISABLE_VAR, PDL_VAR, *FAST_MATH_DISABLE_VARS, *FOUR_OVER_SIX_VARS, KERNEL_PATH_VAR)


def _libc_getenv() -> Optional[Callable[[bytes], Optional[bytes]]]:
    """The C library's getenv(const char*) -> const char*, or None where it cannot be loaded."""
    try:
        getenv = ctypes.CDLL(None).getenv
    except (OSError, AttributeError, TypeError):
        return None
    getenv.argtypes = [ctypes.c_char_p]
    getenv.restype = ctypes.c_char_p
    return getenv


_GETENV = _libc_getenv()
_ENVIRON = os.environ
_is_compiling = torch.compiler.is_compiling
_FAST_MATH_KEYS = tuple(os.fsencode(v) for v in FAST_MATH_DISABLE_VARS)
_ONE = b"1"


def _libc_readable() -> bool:
    """getenv may be used: there is one, os.environ was not replaced, and Dynamo is not tracing."""
    return _GETENV is not None and os.environ is _ENVIRON and not _is_compiling()


def flag_enabled(name: str) -> bool:
    """True when the variable is exactly "1" (the production quantizer's getBoolEnv rule), read now."""
    if _libc_readable():
        return _GETENV(os.fsencode(name)) == _ONE
    return os.environ.get(name) == "1"


def env_value(name: str) -> Optional[str]:
    """The variable's value (None when unset), read now."""
    if _libc_readable():
        value = _GETENV(os.fsencode(name))
        return None if value is None else os.fsdecode(value)
    return os.environ.get(name)


def pdl_enabled() -> bool:
    """Whether the kernels launch with programmatic dependent launch, read now by the C++ rule:
    QWEN_FP4_PDL "0" off, "1" on, anything else (unset) PDL_DEFAULT."""
    value = env_value(PDL_VAR)
    if value == "0":
        return False
    if value == "1":
        return True
    return PDL_DEFAULT


def default_fast_math() -> bool:
    """Fast math unless FLASHINFER_/TRTLLM_DISABLE_FP4_QUANT_FAST_MATH is "1" (read now, on every call)."""
    if _libc_readable():
        getenv = _GETENV
        return getenv(_FAST_MATH_KEYS[0]) != _ONE and getenv(_FAST_MATH_KEYS[1]) != _ONE
    get = os.environ.get
    return get(FAST_MATH_DISABLE_VARS[0]) != "1" and get(FAST_MATH_DISABLE_VARS[1]) != "1"


def resolve_fast_math(fast_math: Optional[bool]) -> bool:
    """``None`` follows the environment; a bool is taken as given."""
    if fast_math is None:
        return default_fast_math()
    if not isinstance(fast_math, bool):
        raise TypeError(f"fast_math must be a bool or None, got {type(fast_math).__name__}")
    return fast_math


def switches_in_force() -> Dict[str, str]:
    """The switches that are set, with their values."""
    return {v: os.environ[v] for v in ALL_VARS if v in os.environ}


def kernel_path_choice() -> str:
    """QWEN_FP4_KERNEL_PATH as the CUDA ops read it now: "auto" when unset or empty, else its value, which
    must be one of KERNEL_PATHS (ValueError naming the variable otherwise, as the ops raise)."""
    value = os.environ.get(KERNEL_PATH_VAR) or "auto"
    if value not in KERNEL_PATHS:
        raise ValueError(f"{KERNEL_PATH_VAR} must be one of {', '.join(KERNEL_PATHS)} (or unset), got {value!r}")
    return value
