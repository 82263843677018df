"""Environment switches, read at call time exactly as the production quantizer reads them."""

from __future__ import annotations

import os
from typing import Dict, Optional

import torch

#: Either one set to "1" disables fast math in FlashInfer's / TensorRT-LLM's fp4_quantize.
FAST_MATH_DISABLE_VARS = ("FLASHINFER_DISABLE_FP4_QUANT_FAST_MATH", "TRTLLM_DISABLE_FP4_QUANT_FAST_MATH")
#: "1" makes FlashInfer's quantizer use the 4over6 recipe, which this library does not implement.
FOUR_OVER_SIX_VAR = "FLASHINFER_NVFP4_4OVER6"
#: "1" turns the fused path off in try_fused_resnorm_quant.
DISABLE_VAR = "QWEN_FP4_DISABLE"

ALL_VARS = (DISABLE_VAR, *FAST_MATH_DISABLE_VARS, FOUR_OVER_SIX_VAR)


# These switches are read on every op call. os.environ.get of an unset variable raises and catches a
# KeyError inside os._Environ (about 0.7 us a name); os._Environ's own dict of encoded names and values
# answers the same question with one plain lookup. It is the live mapping (os.environ[...] = ...,
# monkeypatch.setenv and del all write through it), so the switches are still read at call time. An
# os.environ replaced by another object, and torch.compile's tracing (which would guard on that whole
# dict), take the plain path.
_ENVIRON = os.environ
try:
    _ENV_DATA = _ENVIRON._data
    _ENCODE_NAME = _ENVIRON.encodekey
    _ONE = _ENVIRON.encodevalue("1")
except AttributeError:  # pragma: no cover - an os.environ without these internals
    _ENV_DATA = None
_encoded_names: Dict[str, object] = {}


def _encoded_lookup() -> bool:
    """Whether os.environ's own dict may be read directly (see above)."""
    return _ENV_DATA is not None and os.environ is _ENVIRON and not torch.compiler.is_compiling()


def _encoded(name: str) -> object:
    key = _encoded_names.get(name)
    if key is None:
        key = _encoded_names[name] = _ENCODE_NAME(name)
    return key


def flag_enabled(name: str) -> bool:
    """True when the variable is exactly "1" (the production quantizer's getBoolEnv rule), read now."""
    if _encoded_lookup():
        return _ENV_DATA.get(_encoded(name)) == _ONE
    return os.environ.get(name) == "1"


def default_fast_math() -> bool:
    """Fast math unless FLASHINFER_/TRTLLM_DISABLE_FP4_QUANT_FAST_MATH is "1" (read now, on every call)."""
    if _encoded_lookup():
        get = _ENV_DATA.get
        return get(_encoded(FAST_MATH_DISABLE_VARS[0])) != _ONE and get(_encoded(FAST_MATH_DISABLE_VARS[1])) != _ONE
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
