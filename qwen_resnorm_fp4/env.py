"""Environment switches, read from ``os.environ`` (a switch is on when its variable is exactly "1", the
production quantizer's rule).

``os.environ.get`` of an unset name costs a raised and caught KeyError, and the wrappers read two or three
switches on every call; so where ``os.environ`` is CPython's own mapping (not replaced, not being traced by
torch.compile) its encoded dict is read directly: the same values, as ``os.environ[...] =`` and ``del``
keep it, at a tenth of the cost.

The fast-math, 4over6 and disable switches are read at every call, so a change made from Python takes
effect at the next call (under torch.compile: at the next trace). The launch switches of the compiled
kernels (QWEN_FP4_KERNEL_PATH, QWEN_FP4_PDL) are read once, when the package loads the library
(:mod:`qwen_resnorm_fp4.launch`), and changed at run time with
:func:`qwen_resnorm_fp4.set_launch_options`; their defaults are written here and nowhere else.
"""

from __future__ import annotations

import os
from typing import Dict, Optional

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
#: "1" turns the fused paths off (every try_fused_* gate declines).
DISABLE_VAR = "QWEN_FP4_DISABLE"
#: Programmatic dependent launch of the kernels at package load: "0" off, "1" on, unset (or any other
#: value): PDL_DEFAULT.
PDL_VAR = "QWEN_FP4_PDL"
#: What an unset QWEN_FP4_PDL means: off, since after a GEMM (the fused op's predecessor in a model) PDL
#: does not pay (docs/performance.md).
PDL_DEFAULT = False
#: The quantizing CUDA ops' kernel path at package load: one of KERNEL_PATHS (unset or empty: the default).
KERNEL_PATH_VAR = "QWEN_FP4_KERNEL_PATH"
#: auto: the Blackwell path where this build can run it, else portable; portable: always the portable path;
#: blackwell: always the Blackwell path (the op raises where it is not usable).
KERNEL_PATHS = ("auto", "portable", "blackwell")
#: What an unset QWEN_FP4_KERNEL_PATH means.
KERNEL_PATH_DEFAULT = "auto"

ALL_VARS = (DISABLE_VAR, PDL_VAR, *FAST_MATH_DISABLE_VARS, *FOUR_OVER_SIX_VARS, KERNEL_PATH_VAR)


_ENVIRON = os.environ
# os._Environ's mapping of encoded names to encoded values (None where os.environ is another kind of mapping).
_ENCODED = getattr(_ENVIRON, "_data", None)
_ENCODED_ONE = _ENVIRON.encodevalue("1") if _ENCODED is not None else None
_ENCODED_NAMES: Dict[str, object] = {}
_is_compiling = torch.compiler.is_compiling


def _encoded_lookup() -> bool:
    """Whether os.environ may be read through its encoded dict now."""
    return _ENCODED is not None and os.environ is _ENVIRON and not _is_compiling()


def _encoded_name(name: str) -> object:
    key = _ENCODED_NAMES.get(name)
    if key is None:
        key = _ENCODED_NAMES[name] = _ENVIRON.encodekey(name)
    return key


def flag_enabled(name: str) -> bool:
    """True when the variable is exactly "1" (the production quantizer's getBoolEnv rule), read now."""
    if _encoded_lookup():
        return _ENCODED.get(_encoded_name(name)) == _ENCODED_ONE
    return os.environ.get(name) == "1"


def env_value(name: str) -> Optional[str]:
    """The variable's value (None when unset), read now."""
    return os.environ.get(name)


def default_fast_math() -> bool:
    """Fast math unless FLASHINFER_/TRTLLM_DISABLE_FP4_QUANT_FAST_MATH is "1" (read now, on every call)."""
    return not (flag_enabled(FAST_MATH_DISABLE_VARS[0]) or flag_enabled(FAST_MATH_DISABLE_VARS[1]))


def resolve_fast_math(fast_math: Optional[bool]) -> bool:
    """``None`` follows the environment; a bool is taken as given (TypeError for anything else)."""
    if fast_math is None:
        return default_fast_math()
    if fast_math is True or fast_math is False:
        return fast_math
    raise TypeError(f"fast_math must be a bool or None, got {type(fast_math).__name__}")


def switches_in_force() -> Dict[str, str]:
    """The switches that are set, with their values."""
    return {v: os.environ[v] for v in ALL_VARS if v in os.environ}


def pdl_from_env() -> bool:
    """What QWEN_FP4_PDL says now: "0" off, "1" on, anything else (unset) PDL_DEFAULT."""
    value = os.environ.get(PDL_VAR)
    if value == "0":
        return False
    if value == "1":
        return True
    return PDL_DEFAULT


def kernel_path_from_env() -> str:
    """What QWEN_FP4_KERNEL_PATH says now: KERNEL_PATH_DEFAULT when unset or empty, else its value, which
    must be one of KERNEL_PATHS (ValueError naming the variable otherwise)."""
    value = os.environ.get(KERNEL_PATH_VAR) or KERNEL_PATH_DEFAULT
    if value not in KERNEL_PATHS:
        raise ValueError(f"{KERNEL_PATH_VAR} must be one of {', '.join(KERNEL_PATHS)} (or unset), got {value!r}")
    return value
