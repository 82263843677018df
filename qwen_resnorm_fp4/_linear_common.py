"""What the Linear modules (linear.py: NVFP4Linear; linear_fp8.py: FP8Linear) share when they are built: the
checks of their flags and of the scalars they are made from. These read values (a host synchronisation): for
building layers, never for a forward."""

from __future__ import annotations

import math
from typing import Union

import torch

Tensor = torch.Tensor


def check_bool(name: str, value: object) -> None:
    """TypeError naming ``name`` unless ``value`` is a bool (not merely truthy: 0 and 1 are refused)."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__}")


def positive_scalar(name: str, value: Union[float, Tensor], device: torch.device) -> Tensor:
    """fp32 [1] on ``device`` from a number or a one-element floating-point tensor; TypeError for another
    type, ValueError unless it is one finite, positive value."""
    if isinstance(value, bool) or not isinstance(value, (int, float, Tensor)):
        raise TypeError(f"{name} must be a number or a one-element tensor, got {type(value).__name__}")
    if isinstance(value, Tensor) and not value.is_floating_point():
        raise TypeError(f"{name} must be a floating-point number or tensor, got {value.dtype}")
    t = torch.as_tensor(value).detach()
    if t.numel() != 1:
        raise ValueError(f"{name} must have one element, got shape {tuple(t.shape)}")
    t = t.to(device=device, dtype=torch.float32).reshape(1)
    v = float(t.item())
    if not (math.isfinite(v) and v > 0):
        raise ValueError(f"{name} must be finite and positive, got {v}")
    return t
