"""The launch switches of the compiled CUDA kernels, decided here and pushed to the library, which never
reads the environment: the quantizing ops' kernel path ("auto", "portable" or "blackwell") and programmatic
dependent launch of the row kernels.

They start as QWEN_FP4_KERNEL_PATH and QWEN_FP4_PDL say when the package loads (defaults: env.py), and
:func:`set_launch_options` changes them for every later launch (a CUDA graph keeps the launches it
captured). An invalid QWEN_FP4_KERNEL_PATH does not stop the import: the quantizing CUDA ops raise, naming
the variable, until :func:`set_launch_options` picks a path.
"""

from __future__ import annotations

import threading
from typing import NamedTuple, Optional

import torch

from . import _library, ops
from .env import KERNEL_PATH_VAR, KERNEL_PATHS, kernel_path_from_env, pdl_from_env, env_value


class LaunchOptions(NamedTuple):
    """The launch switches in force."""

    #: One of env.KERNEL_PATHS, or the invalid value QWEN_FP4_KERNEL_PATH held at load (the ops then raise).
    kernel_path: str
    #: Whether the row kernels launch with programmatic dependent launch.
    pdl: bool


#: The compiled library's codes of the kernel paths (csrc/launch.h KernelPath); an invalid path is the last.
_KERNEL_PATH_CODES = {path: code for code, path in enumerate(KERNEL_PATHS)}
_INVALID_KERNEL_PATH = len(KERNEL_PATHS)

_lock = threading.Lock()


def _from_env() -> LaunchOptions:
    try:
        kernel_path = kernel_path_from_env()
    except ValueError:
        kernel_path = env_value(KERNEL_PATH_VAR)
    return LaunchOptions(kernel_path, pdl_from_env())


def _push(options: LaunchOptions) -> None:
    if _library.cuda_available():
        getattr(torch.ops, ops.NAMESPACE)._set_launch_options(
            _KERNEL_PATH_CODES.get(options.kernel_path, _INVALID_KERNEL_PATH), options.pdl)


_options = _from_env()
_push(_options)


def launch_options() -> LaunchOptions:
    """The launch switches in force."""
    return _options


def kernel_path_error(options: Optional[LaunchOptions] = None) -> Optional[str]:
    """Why the quantizing CUDA ops raise with these options (None: the ones in force), or None when the path
    is valid."""
    path = (options or _options).kernel_path
    if path in KERNEL_PATHS:
        return None
    return f"{KERNEL_PATH_VAR} must be one of {', '.join(KERNEL_PATHS)} (or unset), got {path!r}"


def set_launch_options(kernel_path: Optional[str] = None, pdl: Optional[bool] = None) -> LaunchOptions:
    """Set the launch switches of every later CUDA launch; None keeps a switch as it is. Returns the options
    in force before (pass them back to restore them).

    Args:
        kernel_path: "auto" (the Blackwell path where this build can run it, else portable), "portable" or
            "blackwell" (the quantizing ops raise where it is not usable).
        pdl: launch the row kernels with programmatic dependent launch.
    """
    global _options
    if kernel_path is not None:
        if not isinstance(kernel_path, str):
            raise TypeError(f"kernel_path must be a str or None, got {type(kernel_path).__name__}")
        if kernel_path not in KERNEL_PATHS:
            raise ValueError(f"kernel_path must be one of {', '.join(KERNEL_PATHS)}, got {kernel_path!r}")
    if pdl is not None and not isinstance(pdl, bool):
        raise TypeError(f"pdl must be a bool or None, got {type(pdl).__name__}")
    with _lock:
        before = _options
        new = LaunchOptions(before.kernel_path if kernel_path is None else kernel_path,
                            before.pdl if pdl is None else pdl)
        _push(new)
        _options = new
    return before


__all__ = ["LaunchOptions", "launch_options", "set_launch_options", "kernel_path_error"]
