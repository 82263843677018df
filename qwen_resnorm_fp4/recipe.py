"""The NVFP4 block-scale recipe: the standard one or FlashInfer's 4over6 (docs/numerics.md, "The 4over6
recipe"), named by a config object and carried to the ops as ``nvfp4_4over6_code``.

The ``nvfp4_4over6=`` argument of the wrappers follows FlashInfer 0.7.4's ``fp4_quantize``:

- omitted: the ``FLASHINFER_NVFP4_4OVER6*`` environment variables, read at the call;
- ``None``: the standard recipe;
- an :class:`NVFP44Over6Config` (this module's, or FlashInfer's own: any object with ``e4m3_max``,
  ``err_mode`` and ``err_use_fast_math``): that 4over6 recipe.

The code is FlashInfer's packing (bit 0 on, bit 1 ``e4m3_max == 256``, bits 2-3 the error mode, 0 = MAE /
1 = MSE, bit 4 ``err_use_fast_math``): :data:`NVFP4_4OVER6_CODES` are the codes the ops take (the rule:
:func:`~qwen_resnorm_fp4.validation.nvfp4_4over6_code_problem`).
``e4m3_max`` does not change the kernels' bytes: it sets the global-scale rule ``e4m3_max * 6 / amax``
(:func:`global_scale_numerator`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Optional

from .constants import E2M1_MAX, E4M3_MAX, E4M3_MAX_4OVER6_256
from .env import (FOUR_OVER_SIX_E4M3_256_VAR, FOUR_OVER_SIX_ERR_FAST_MATH_VAR, FOUR_OVER_SIX_ERR_MODE_VAR,
                  FOUR_OVER_SIX_VAR, env_value, flag_enabled)

#: FlashInfer's packing of an NVFP44Over6Config into the ops' nvfp4_4over6_code (csrc/launch.h kNvfp4Recipe*).
NVFP4_4OVER6_ON = 1
NVFP4_4OVER6_E4M3_MAX_256 = 2
NVFP4_4OVER6_ERR_MODE_SHIFT = 2  # 2 bits: 0 = MAE, 1 = MSE
NVFP4_4OVER6_ERR_FAST_MATH = 16
NVFP4_4OVER6_KNOWN_BITS = 5
#: Every code the ops take: 0 (the standard recipe) and the eight 4over6 recipes.
NVFP4_4OVER6_CODES = frozenset([0] + [NVFP4_4OVER6_ON | e | (m << NVFP4_4OVER6_ERR_MODE_SHIFT) | f
                                      for e in (0, NVFP4_4OVER6_E4M3_MAX_256) for m in (0, 1)
                                      for f in (0, NVFP4_4OVER6_ERR_FAST_MATH)])

#: The error modes by their code (bits 2-3).
ERR_MODES = ("MAE", "MSE")
#: E4M3 maxima a recipe may name; E4M3_MAX is the format's own (the standard recipe's).
E4M3_MAXES = (int(E4M3_MAX), int(E4M3_MAX_4OVER6_256))
_E4M3_MAX, _E4M3_256 = E4M3_MAXES


class _Unset:
    """Type of :data:`UNSET`, the default of ``nvfp4_4over6=``: the argument was omitted."""

    def __repr__(self) -> str:
        return "<nvfp4_4over6 omitted: read FLASHINFER_NVFP4_4OVER6*>"

    def __reduce__(self) -> str:
        return "UNSET"


#: "nvfp4_4over6 omitted" (read the environment). Omit the argument rather than pass it.
UNSET: Any = _Unset()


def _err_mode_name(err_mode: object) -> str:
    """"MAE" or "MSE" from a name (any case), an int 0 / 1 or an IntEnum member (FlashInfer's)."""
    if isinstance(err_mode, str):
        name = err_mode.upper()
    elif isinstance(err_mode, int) and not isinstance(err_mode, bool) and 0 <= int(err_mode) < len(ERR_MODES):
        name = ERR_MODES[int(err_mode)]
    else:
        name = None
    if name not in ERR_MODES:
        raise ValueError(f"nvfp4_4over6: err_mode must be 'MAE' or 'MSE' (or 0 / 1), got {err_mode!r}")
    return name


@dataclass(frozen=True)
class NVFP44Over6Config:
    """A 4over6 recipe, with the fields of FlashInfer's ``NVFP44Over6Config``.

    Args:
        e4m3_max: 448 or 256, the largest block scale the global scale aims at: global scale =
            ``e4m3_max * 6 / amax`` (the block bytes for a given global scale do not depend on it).
        err_mode: "MAE" (sum of |error|) or "MSE" (sum of error^2) over the block picks its scale.
        err_use_fast_math: the error in FlashInfer's fp16 form, ``e2m1 * scale - y * global_scale``, instead of
            ``e2m1 * scale / global_scale - y``.
    """

    e4m3_max: int = _E4M3_MAX
    err_mode: str = "MAE"
    err_use_fast_math: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.e4m3_max, bool) or self.e4m3_max not in E4M3_MAXES:
            raise ValueError(f"nvfp4_4over6: e4m3_max must be 448 or 256, got {self.e4m3_max!r}")
        object.__setattr__(self, "e4m3_max", int(self.e4m3_max))
        object.__setattr__(self, "err_mode", _err_mode_name(self.err_mode))
        if not isinstance(self.err_use_fast_math, bool):
            raise TypeError(f"nvfp4_4over6: err_use_fast_math must be a bool, got "
                            f"{type(self.err_use_fast_math).__name__}")


def config_from(config: object) -> NVFP44Over6Config:
    """This module's config for ours or any object with FlashInfer's three fields (FlashInfer's own)."""
    if isinstance(config, NVFP44Over6Config):
        return config
    try:
        fields = (config.e4m3_max, config.err_mode, config.err_use_fast_math)
    except AttributeError:
        raise TypeError("nvfp4_4over6 must be an NVFP44Over6Config (qwen_resnorm_fp4.recipe or flashinfer's) or "
                        f"None, or omitted; got {type(config).__name__}") from None
    return NVFP44Over6Config(*fields)


def nvfp4_4over6_code(config: object) -> int:
    """The ops' ``nvfp4_4over6_code`` of a config (None: 0, the standard recipe)."""
    if config is None:
        return 0
    c = config_from(config)
    return (NVFP4_4OVER6_ON | (NVFP4_4OVER6_E4M3_MAX_256 if c.e4m3_max == _E4M3_256 else 0)
            | (ERR_MODES.index(c.err_mode) << NVFP4_4OVER6_ERR_MODE_SHIFT)
            | (NVFP4_4OVER6_ERR_FAST_MATH if c.err_use_fast_math else 0))


def _config_of(code: int) -> Optional[NVFP44Over6Config]:
    if code == 0:
        return None
    return NVFP44Over6Config(e4m3_max=_E4M3_256 if code & NVFP4_4OVER6_E4M3_MAX_256 else _E4M3_MAX,
                             err_mode=ERR_MODES[(code >> NVFP4_4OVER6_ERR_MODE_SHIFT) & 3],
                             err_use_fast_math=bool(code & NVFP4_4OVER6_ERR_FAST_MATH))


_CONFIGS: Dict[int, Optional[NVFP44Over6Config]] = {code: _config_of(code) for code in NVFP4_4OVER6_CODES}


def nvfp4_4over6_from_code(code: int) -> Optional[NVFP44Over6Config]:
    """The config of a code of :data:`NVFP4_4OVER6_CODES` (0: None); ValueError for any other value."""
    if type(code) is not int or code not in _CONFIGS:
        raise ValueError(f"nvfp4_4over6_code must be one of {sorted(NVFP4_4OVER6_CODES)}, got {code!r}")
    return _CONFIGS[code]


def nvfp4_4over6_from_env() -> Optional[NVFP44Over6Config]:
    """The recipe the environment names, as FlashInfer reads it: FLASHINFER_NVFP4_4OVER6 "1" turns it on;
    FLASHINFER_NVFP4_4OVER6_E4M3_USE_256 "1", FLASHINFER_NVFP4_4OVER6_ERR_MODE ("MAE" when unset),
    FLASHINFER_NVFP4_4OVER6_ERR_USE_FAST_MATH "1" are its fields. ValueError for another error mode."""
    if not flag_enabled(FOUR_OVER_SIX_VAR):
        return None
    err_mode = env_value(FOUR_OVER_SIX_ERR_MODE_VAR)
    return NVFP44Over6Config(e4m3_max=_E4M3_256 if flag_enabled(FOUR_OVER_SIX_E4M3_256_VAR) else _E4M3_MAX,
                             err_mode="MAE" if err_mode is None else err_mode,
                             err_use_fast_math=flag_enabled(FOUR_OVER_SIX_ERR_FAST_MATH_VAR))


def resolve_config(setting: object = UNSET) -> Optional[NVFP44Over6Config]:
    """The recipe a wrapper's ``nvfp4_4over6=`` argument names: omitted (:data:`UNSET`), the environment now;
    None, the standard recipe (None); a config, this module's equal of it."""
    if setting is UNSET:
        return nvfp4_4over6_from_env()
    return None if setting is None else config_from(setting)


def resolve_nvfp4_4over6(setting: object = UNSET) -> int:
    """The ``nvfp4_4over6_code`` of a wrapper's ``nvfp4_4over6=`` argument: omitted (:data:`UNSET`), the
    environment now; None, 0; a config, its code."""
    if setting is UNSET:
        if not flag_enabled(FOUR_OVER_SIX_VAR):  # the common call: one environment read
            return 0
        return nvfp4_4over6_code(nvfp4_4over6_from_env())
    return nvfp4_4over6_code(setting)


def global_scale_numerator(code: int) -> float:
    """``e4m3_max * 6`` of a recipe code: the numerator of its global-scale rule ``e4m3_max * 6 / amax``
    (448 * 6 for the standard recipe)."""
    e4m3_max = E4M3_MAX_4OVER6_256 if code & NVFP4_4OVER6_ON and code & NVFP4_4OVER6_E4M3_MAX_256 else E4M3_MAX
    return float(e4m3_max * E2M1_MAX)


__all__ = ["NVFP44Over6Config", "UNSET", "nvfp4_4over6_code", "nvfp4_4over6_from_code", "nvfp4_4over6_from_env",
           "resolve_config", "resolve_nvfp4_4over6", "global_scale_numerator", "config_from", "NVFP4_4OVER6_CODES",
           "NVFP4_4OVER6_ON", "NVFP4_4OVER6_E4M3_MAX_256", "NVFP4_4OVER6_ERR_MODE_SHIFT", "NVFP4_4OVER6_ERR_FAST_MATH",
           "NVFP4_4OVER6_KNOWN_BITS", "ERR_MODES", "E4M3_MAXES"]
