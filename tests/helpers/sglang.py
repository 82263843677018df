"""What the SGLang drop-in tests share (tests/integrations/test_sglang_dropin.py, test_sglang_fp8_dropin.py)."""

from __future__ import annotations

import inspect


def leading_parameters(fn) -> tuple:
    """The names of ``fn``'s positional parameters, in order (SGLang's drop-ins are called positionally)."""
    params = inspect.signature(fn).parameters.values()
    return tuple(p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD))
