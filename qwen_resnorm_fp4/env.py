"""Environment switches, read at call time exactly as the production quantizer reads them (a switch is on
when its variable is exactly "1")."""

from __future__ import annotations

import os
from typing import Dict, Optional

#: Either one set to "1" disables fast math in FlashInfer's / TensorRT-LLM's fp4_quantize.
FAST_MATH_DISABLE_VARS = ("FLASHINFER_DISABLE_FP4_QUANT_FAST_MATH", "TRTLLM_DISABLE_FP4_QUANT_FAST_MATH")
#: "1" makes FlashInfer's quantizer use the 4over6 recipe, which this library does not implement.
FOUR_OVER_SIX_VAR = "FLASHINFER_NVFP4_4OVER6"
#: "1" turns the fused path off in try_fused_resnorm_quant.
DISABLE_VAR = "QWEN_FP4_DISABLE"

ALL_VARS = (DISABLE_VAR, *FAST_MATH_DISABLE_VARS, FOUR_OVER_SIX_VAR)


def flag_enabled(name: str) -> bool:
    """True when the variable is exactly "1" (the production quantizer's getBoolEnv rule), read now."""
    return os.environ.get(name) == "1"


def default_fast_math() -> bool:
    """Fast math unless FLASHINFER_/TRTLLM_DISABLE_FP4_QUANT_FAST_MATH is "1" (read now, on every call)."""
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
