"""Build of qwen-resnorm-fp4: a CUDA extension (_C, the ops' kernels) and a small one of test-only ops
(_C_testing, loaded by qwen_resnorm_fp4.testing alone), against the LibTorch stable ABI and Python's limited
API, so one cp310-abi3 wheel serves every torch >= 2.10 and Python >= 3.10 of the same CUDA major version.

Environment:
  QWEN_FP4_CUDA_ARCHS     GPU targets, ';'-separated (default "90a;100f;120f;compute_90": cubins for
                          sm_90a, sm_100f, sm_120f and compute_90 PTX for GPUs the wheel does not know).
  QWEN_FP4_FLASHINFER_DIR FlashInfer headers for the Blackwell targets (see third_party/README.md).
  QWEN_FP4_NO_CUDA=1      Pure-Python install (CPU reference only), even with a CUDA toolkit.
  QWEN_FP4_EMULATE_BLACKWELL=1  A test build, never shipped: the Blackwell path for sm_90a, FlashInfer 0.7.4's
                          conversion with its Blackwell-only instructions emulated in software
                          (tools/emulated_flashinfer_header.py), so the H200 can run it against the portable path.
  MAX_JOBS                Parallel compile jobs (ninja).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import find_packages, setup

ROOT = Path(__file__).parent.resolve()
PACKAGE = ROOT / "qwen_resnorm_fp4"
# The one place the version is written is pyproject.toml; _version.py (written below) carries it into the package.
VERSION = re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M).group(1)
FLASHINFER_PINNED = "0.7.4"  # the flashinfer-python whose headers the Blackwell path is tested against
DEFAULT_ARCHS = "90a;100f;120f;compute_90"
TORCH_TARGET_VERSION = "0x020a000000000000"  # stable ABI of torch 2.10


def log(msg: str) -> None:
    print(f"qwen-resnorm-fp4 setup: {msg}", file=sys.stderr, flush=True)


def cuda_archs() -> list[str]:
    archs = [a.strip() for a in os.environ.get("QWEN_FP4_CUDA_ARCHS", DEFAULT_ARCHS).replace(",", ";").split(";")]
    return [a for a in archs if a]


def gencode_flags(archs: list[str]) -> list[str]:
    flags = []
    for a in archs:
        if a.startswith("compute_"):
            flags.append(f"-gencode=arch={a},code={a}")
        else:
            flags.append(f"-gencode=arch=compute_{a},code=sm_{a}")
    return flags


def is_blackwell(arch: str) -> bool:
    digits = "".join(c for c in arch.replace("compute_", "") if c.isdigit())
    return int(digits) >= 100


def emulating_blackwell() -> bool:
    """QWEN_FP4_EMULATE_BLACKWELL=1: the emulation build (see the module docstring)."""
    return os.environ.get("QWEN_FP4_EMULATE_BLACKWELL") == "1"


def find_flashinfer(any_version_allowed: bool = True) -> tuple[Path, str, Path | None]:
    """(include root holding tensorrt_llm/ and flashinfer/, a description, the licence file).
    any_version_allowed: whether QWEN_FP4_FLASHINFER_ANY_VERSION=1 may admit an unpinned flashinfer-python."""

    def layout(base: Path):
        nv = base / "csrc" / "nv_internal"
        if (nv / "tensorrt_llm" / "kernels" / "quantization_utils.cuh").is_file():
            return nv
        return None

    tried = []
    env = os.environ.get("QWEN_FP4_FLASHINFER_DIR")
    if env:
        for base in (Path(env), Path(env) / "data"):
            nv = layout(base)
            if nv:
                return nv, f"QWEN_FP4_FLASHINFER_DIR={env}", _licence(base)
        tried.append(f"QWEN_FP4_FLASHINFER_DIR={env} (no csrc/nv_internal/tensorrt_llm/kernels/quantization_utils.cuh)")
    else:
        tried.append("QWEN_FP4_FLASHINFER_DIR (not set)")

    checkout = ROOT / "third_party" / "flashinfer"
    nv = layout(checkout)
    if nv:
        return nv, f"checkout {checkout}", _licence(checkout)
    tried.append(f"a FlashInfer checkout at {checkout} (absent)")

    spec = importlib.util.find_spec("flashinfer")
    if spec is not None and spec.submodule_search_locations:
        pkg = Path(list(spec.submodule_search_locations)[0])
        nv = layout(pkg / "data")
        version = importlib.metadata.version("flashinfer-python")
        if nv:
            escape = any_version_allowed and os.environ.get("QWEN_FP4_FLASHINFER_ANY_VERSION") == "1"
            if version != FLASHINFER_PINNED and not escape:
                raise SystemExit(
                    f"qwen-resnorm-fp4: flashinfer-python {version} is installed, but the Blackwell path is tested "
                    f"against {FLASHINFER_PINNED}: pip install --no-deps flashinfer-python=={FLASHINFER_PINNED} "
                    "(or set QWEN_FP4_FLASHINFER_ANY_VERSION=1 to build against it anyway)")
            dist = Path(str(importlib.metadata.distribution("flashinfer-python").locate_file(""))) / \
                f"flashinfer_python-{version}.dist-info" / "licenses" / "LICENSE"
            return nv, f"flashinfer-python {version} at {pkg}", dist if dist.is_file() else None
        tried.append(f"the installed flashinfer-python {version} at {pkg} (no data/csrc/nv_internal)")
    else:
        tried.append("the installed flashinfer-python package (not installed)")
    raise SystemExit(
        "qwen-resnorm-fp4: the Blackwell targets need FlashInfer's headers and none were found. Tried, in order:\n  "
        + "\n  ".join(tried)
        + f"\nFix one: pip install --no-deps flashinfer-python=={FLASHINFER_PINNED}; or clone FlashInfer into "
        "third_party/flashinfer; or point QWEN_FP4_FLASHINFER_DIR at a FlashInfer source tree. "
        "Or build without Blackwell: QWEN_FP4_CUDA_ARCHS='90a;compute_90'.")


def _licence(base: Path) -> Path | None:
    for cand in (base / "LICENSE", base.parent / "LICENSE"):
        if cand.is_file():
            return cand
    return None


def source_commit() -> str | None:
    """The checkout's commit (short hash, "-dirty" with uncommitted changes to tracked files), or None
    outside a git checkout (an sdist): recorded so that a wheel's benchmark can name its code."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              timeout=10)
        if head.returncode != 0 or not head.stdout.strip():
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return head.stdout.strip() + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return None


def write_build_info(archs: list[str], flashinfer: str | None, cuda: str | None, emulation: bool = False) -> None:
    import torch

    (PACKAGE / "_version.py").write_text(f'__version__ = "{VERSION}"\n')
    (PACKAGE / "_build_info.py").write_text(
        "# Written by setup.py at build time.\n"
        f"CUDA_ARCHS = {archs!r}\n"
        f"FLASHINFER = {flashinfer!r}\n"
        f"BUILD_TORCH = {torch.__version__!r}\n"
        f"BUILD_CUDA = {cuda!r}\n"
        f"BUILD_COMMIT = {source_commit()!r}\n"
        f"BLACKWELL_EMULATION = {emulation!r}  # True only in the emulation build (QWEN_FP4_EMULATE_BLACKWELL=1), never shipped\n")


EMULATION_BUILD_TAG = "0blackwellemulation"  # a wheel build tag starts with a digit


def emulation_archs() -> list[str]:
    """The emulation build's targets: sm_90a only (Blackwell targets have the real instructions; the compute_90
    PTX would JIT the emulation onto any GPU). QWEN_FP4_CUDA_ARCHS may be unset or "90a"."""
    archs = cuda_archs() if os.environ.get("QWEN_FP4_CUDA_ARCHS") else ["90a"]
    if archs != ["90a"]:
        raise SystemExit(
            f"qwen-resnorm-fp4: QWEN_FP4_EMULATE_BLACKWELL=1 builds for sm_90a only, but QWEN_FP4_CUDA_ARCHS asks for "
            f"{' '.join(archs)}: set QWEN_FP4_CUDA_ARCHS=90a (or unset it) for the emulation build")
    return archs


def emulated_flashinfer_include(nv: Path) -> str:
    """Write the emulation copy of FlashInfer's quantization_utils.cuh into the build tree, print its diff
    against the original, and return the include root that holds it (qwen_fp4_emulated/...)."""
    spec = importlib.util.spec_from_file_location("emulated_flashinfer_header",
                                                  ROOT / "tools" / "emulated_flashinfer_header.py")
    gen = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = gen  # dataclasses look their module up there
    spec.loader.exec_module(gen)
    include = ROOT / "build" / "qwen_fp4_emulation" / "include"
    try:
        diff = gen.write_emulated_header(nv / "tensorrt_llm" / "kernels" / "quantization_utils.cuh",
                                         include / "qwen_fp4_emulated" / "quantization_utils.cuh")
    except gen.HeaderMismatch as exc:
        raise SystemExit(f"qwen-resnorm-fp4: the Blackwell emulation cannot use this FlashInfer header: {exc}")
    log("the emulation copy of FlashInfer's quantization_utils.cuh differs from the original only by:\n" + diff)
    return str(include)


def extension_modules():
    if os.environ.get("QWEN_FP4_NO_CUDA") == "1":
        log("QWEN_FP4_NO_CUDA=1: installing pure Python (CPU reference only).")
        write_build_info([], None, None)
        return [], {}
    from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CUDAExtension

    if CUDA_HOME is None:
        log("no CUDA toolkit found (CUDA_HOME): installing pure Python (CPU reference only).")
        write_build_info([], None, None)
        return [], {}

    emulation = emulating_blackwell()
    archs = emulation_archs() if emulation else cuda_archs()
    sources = ["csrc/registration.cpp", "csrc/ops.cpp", "csrc/launch_portable.cu", "csrc/nvfp4_dequantize.cu",
               "csrc/ops_fp8.cpp", "csrc/launch_fp8.cu", "csrc/launch_norm_modulate.cu"]
    include_dirs = [str(ROOT / "csrc")]
    # torch adds Py_LIMITED_API itself for py_limited_api; USE_CUDA declares the CUDA parts of the shim.
    defines = [f"-DTORCH_TARGET_VERSION={TORCH_TARGET_VERSION}", "-DUSE_CUDA"]
    flashinfer_desc = None
    licences_dir = PACKAGE / "_licenses"
    shutil.rmtree(licences_dir, ignore_errors=True)
    if emulation:
        nv, flashinfer_desc, licence = find_flashinfer(any_version_allowed=False)
        log(f"Blackwell EMULATION build (never ship it) against FlashInfer's headers from {flashinfer_desc}")
        sources.append("csrc/launch_blackwell.cu")
        include_dirs += [emulated_flashinfer_include(nv), str(nv), str(nv / "include"), str(nv.parent.parent / "include")]
        defines.append("-DQWEN_FP4_EMULATE_BLACKWELL=1")
        if licence is not None:
            licences_dir.mkdir(exist_ok=True)
            shutil.copy(licence, licences_dir / "LICENSE.flashinfer.txt")
    elif any(is_blackwell(a) and not a.startswith("compute_") for a in archs):
        nv, flashinfer_desc, licence = find_flashinfer()
        log(f"Blackwell targets use FlashInfer's headers from {flashinfer_desc}")
        sources.append("csrc/launch_blackwell.cu")
        include_dirs += [str(nv), str(nv / "include"), str(nv.parent.parent / "include")]
        if licence is not None:
            licences_dir.mkdir(exist_ok=True)
            shutil.copy(licence, licences_dir / "LICENSE.flashinfer.txt")
    else:
        sources.append("csrc/launch_blackwell_stub.cpp")
    log(f"GPU targets: {' '.join(archs)}")

    import torch

    write_build_info(archs, flashinfer_desc, torch.version.cuda, emulation)
    # torch's defaults hide the bf16/half operators that FlashInfer's headers use: undo that.
    undef = ["-U__CUDA_NO_HALF_OPERATORS__", "-U__CUDA_NO_HALF_CONVERSIONS__", "-U__CUDA_NO_BFLOAT16_CONVERSIONS__",
             "-U__CUDA_NO_HALF2_OPERATORS__", "-U__CUDA_NO_BFLOAT16_OPERATORS__"]
    nvcc = ["-O3", "-std=c++17", "--expt-relaxed-constexpr", "-DENABLE_BF16", "-DENABLE_FP8", "-DENABLE_FP4",
            "-lineinfo", *undef, *defines, *gencode_flags(archs)]
    compile_args = {"cxx": ["-O3", "-std=c++17", *defines], "nvcc": nvcc}
    ext = CUDAExtension(name="qwen_resnorm_fp4._C", sources=sources, include_dirs=include_dirs,
                        extra_compile_args=compile_args, py_limited_api=True)
    # The test-only ops, in a library of their own that only qwen_resnorm_fp4.testing loads.
    testing = CUDAExtension(name="qwen_resnorm_fp4._C_testing",
                            sources=["csrc/testing_ops.cpp", "csrc/testing_kernels.cu"],
                            include_dirs=[str(ROOT / "csrc")], extra_compile_args=compile_args, py_limited_api=True)
    return [ext, testing], {"build_ext": BuildExtension}


ext_modules, cmdclass = extension_modules()

setup(
    packages=find_packages(include=["qwen_resnorm_fp4", "qwen_resnorm_fp4.*"]),
    package_data={"qwen_resnorm_fp4": ["_licenses/*", "data/*"]},
    ext_modules=ext_modules,
    cmdclass=cmdclass,
    # The emulation wheel carries the build tag EMULATION_BUILD_TAG in its file name, so it is never taken for a release.
    options=({"bdist_wheel": {"py_limited_api": "cp310", **({"build_number": EMULATION_BUILD_TAG} if emulating_blackwell() else {})}}
             if ext_modules else {}),
)
