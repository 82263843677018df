"""What this install is: the build setup.py recorded, whether the compiled library is loaded, and which
kernel path a GPU takes (used by the command line's ``info`` and by the benchmark's header)."""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import torch

from . import _library, launch
from .env import default_fast_math, switches_in_force

PATH_BLACKWELL = "Blackwell (FlashInfer conversion)"
PATH_BLACKWELL_EMULATED = ("Blackwell (FlashInfer conversion, its E2M1 instructions emulated in software on sm_90: "
                           "an emulation build, never shipped)")
PATH_PORTABLE = "portable (software E2M1, = cuda_fp4.h)"
PATH_PORTABLE_JIT = "portable (software E2M1, = cuda_fp4.h; compute_90 PTX JIT)"
PATH_CPU = "CPU reference"
#: The compiled library is loaded but its build info is missing: its GPU targets are not known here.
PATH_UNRECORDED = ("unknown: the compiled library is loaded but its build wrote no _build_info.py (its GPU targets "
                   "are not recorded); the CUDA ops say at the call whether they serve this GPU")


def package_version() -> str:
    """The version setup.py wrote into the package, or "0+source" in a source tree that was never built."""
    try:
        from ._version import __version__
    except ImportError:
        return "0+source"
    return __version__


def build_info() -> Dict[str, object]:
    """What setup.py recorded at build time (None fields in a source tree that was never built)."""
    try:
        from . import _build_info as b
    except ImportError:
        return {"cuda_archs": None, "flashinfer": None, "build_torch": None, "build_cuda": None, "build_commit": None,
                "blackwell_emulation": False}
    return {
        "cuda_archs": list(getattr(b, "CUDA_ARCHS", []) or []),
        "flashinfer": getattr(b, "FLASHINFER", None),
        "build_torch": getattr(b, "BUILD_TORCH", None),
        "build_cuda": getattr(b, "BUILD_CUDA", None),
        "build_commit": getattr(b, "BUILD_COMMIT", None),  # the checkout's commit at build time
        "blackwell_emulation": bool(getattr(b, "BLACKWELL_EMULATION", False)),  # QWEN_FP4_EMULATE_BLACKWELL=1
    }


def _parse_arch(arch: str) -> Optional[Tuple[bool, int, int, str]]:
    """'100f' -> (False, 10, 0, 'f'); 'compute_90' -> (True, 9, 0, ''); None if unparseable."""
    a = arch.strip().lower()
    ptx = a.startswith("compute_")
    a = a.replace("compute_", "").replace("sm_", "")
    digits = "".join(c for c in a if c.isdigit())
    suffix = a[len(digits):]
    if len(digits) < 2:
        return None
    num = int(digits)
    return ptx, num // 10, num % 10, suffix


def _cubin_runs_on(major: int, minor: int, am: int, an: int, suffix: str) -> bool:
    if suffix == "a":  # architecture-specific: that exact chip only
        return (major, minor) == (am, an)
    # family-specific ('f', e.g. sm_100f = 10.0 and 10.3; sm_120f = 12.0 and 12.1) or plain: same major, newer minor
    return major == am and minor >= an


def kernel_path(capability: Optional[Tuple[int, int]], archs: Optional[List[str]] = None,
                library_loaded: Optional[bool] = None, choice: Optional[str] = None,
                emulation: Optional[bool] = None) -> str:
    """Which implementation the quantizing ops take on a GPU of this compute capability (None: no GPU), as
    csrc/ops.cpp chooses it: choice is the kernel path (None: the launch options in force), emulation whether
    this is the Blackwell emulation build (None: from the build info); archs and library_loaded likewise."""
    if library_loaded is None:
        library_loaded = _library.cuda_available()
    if archs is None:
        archs = build_info()["cuda_archs"]
    recorded = archs is not None  # False: a loaded library whose build wrote no _build_info.py
    archs = archs or []
    if emulation is None:
        emulation = bool(build_info()["blackwell_emulation"])
    if capability is None:
        return f"{PATH_CPU} (no GPU)" if library_loaded else PATH_CPU
    if not library_loaded:
        return f"{PATH_CPU} (the compiled library is not loaded: CUDA tensors run the reference too)"
    major, minor = capability
    parsed = [p for p in (_parse_arch(a) for a in archs) if p is not None]
    cubins = [(am, an, sfx) for ptx, am, an, sfx in parsed if not ptx and _cubin_runs_on(major, minor, am, an, sfx)]
    if choice is None:
        choice = launch.launch_options().kernel_path
    error = launch.kernel_path_error(launch.LaunchOptions(choice, False))
    if error is not None:
        return f"error: {error}; the quantizing CUDA ops raise"
    if emulation:  # blackwell_kernels_usable of the emulation build: its sm_90a cubin runs
        blackwell = PATH_BLACKWELL_EMULATED if any((am, an, sfx) == (9, 0, "a") for am, an, sfx in cubins) else None
    else:
        blackwell = PATH_BLACKWELL if major >= 10 and any(am >= 10 for am, _, _ in cubins) else None
    if blackwell is not None and choice != "portable":
        return blackwell
    if choice == "blackwell":
        built = " ".join(archs) or "no GPU targets"
        return (f"error: kernel path blackwell (QWEN_FP4_KERNEL_PATH or set_launch_options), but this build "
                f"({built}) has no Blackwell path for sm_{major}{minor}; the quantizing CUDA ops raise")
    if cubins:
        return PATH_PORTABLE
    if any(ptx and (am, an) <= (major, minor) for ptx, am, an, _ in parsed):
        return PATH_PORTABLE_JIT
    if not recorded:
        return PATH_UNRECORDED
    return (f"none: this build ({' '.join(archs) or 'no GPU targets'}) has no kernel for sm_{major}{minor}; "
            "CUDA tensors will fail, CPU tensors use the reference")


def collect_info() -> Dict[str, object]:
    """What ``python -m qwen_resnorm_fp4 info`` reports: versions, the build, the library, the GPUs and the
    path each takes, the switches in force."""
    bi = build_info()
    gpus = []
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            cap = torch.cuda.get_device_capability(i)
            gpus.append({"index": i, "name": torch.cuda.get_device_name(i),
                         "capability": f"{cap[0]}.{cap[1]}", "path": kernel_path(cap)})
    return {
        "version": package_version(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "library_loaded": _library.cuda_available(),
        "library": _library.status(),
        "cuda_archs": bi["cuda_archs"],
        "flashinfer": bi["flashinfer"],
        "build_torch": bi["build_torch"],
        "build_cuda": bi["build_cuda"],
        "build_commit": bi["build_commit"],
        "blackwell_emulation": bi["blackwell_emulation"],
        "kernel_path_switch": launch.launch_options().kernel_path,
        "gpus": gpus,
        "path": gpus[0]["path"] if gpus else kernel_path(None),
        "fast_math_default": default_fast_math(),
        "pdl": launch.launch_options().pdl,
        "switches": switches_in_force(),
    }
