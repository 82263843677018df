"""What the Linear modules (linear.py: NVFP4Linear; linear_fp8.py: FP8Linear) share: the checks of their flags
and of the scalars they are made from (these read values, a host synchronisation: for building layers, never
for a forward), how they hold their tensors, and how ``module.to(dtype)`` leaves the format's dtypes alone."""

from __future__ import annotations

import math
from typing import ClassVar, Optional, Tuple, Union

import torch

Tensor = torch.Tensor


def frozen(t: Optional[Tensor]) -> Optional[torch.nn.Parameter]:
    """A layer's tensor as a parameter that takes no gradient (None stays None). Parameters, not buffers:
    torch.compile guards each buffer of a module it does not know against aliasing every other such tensor,
    on every compiled call (a cost quadratic in the number of converted layers); parameters it leaves out."""
    return None if t is None else torch.nn.Parameter(t, requires_grad=False)


class FrozenTensorsModule(torch.nn.Module):
    """A module whose tensors are parameters without gradients (:func:`frozen`): a plain tensor assigned to
    one of them is wrapped, as a buffer would have taken it; ``.to(dtype)``, ``.half()``, ... move the tensors
    named in ``KEPT_DTYPES`` but keep their dtypes (a cast would round or re-encode the format's bytes)."""

    #: The tensors whose dtype is the format's, whatever dtype the module is moved to.
    KEPT_DTYPES: ClassVar[Tuple[str, ...]] = ()

    def __setattr__(self, name: str, value: object) -> None:
        registered = self.__dict__.get("_parameters", {})  # none before nn.Module.__init__
        if isinstance(value, Tensor) and not isinstance(value, torch.nn.Parameter) and name in registered:
            value = frozen(value)
        super().__setattr__(name, value)

    def _apply(self, fn, recurse=True):
        # nn.Module._apply updates parameters in place (param.data = ...): keep views of the old storage
        old = {name: t.detach() for name in self.KEPT_DTYPES if (t := getattr(self, name)) is not None}
        super()._apply(fn, recurse)
        for name, before in old.items():
            t = getattr(self, name)
            if t.dtype != before.dtype:  # cast by fn: the old value, on fn's device
                setattr(self, name, frozen(before.to(t.device)))
        return self


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
