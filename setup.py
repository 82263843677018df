"""Build of qwen-resnorm-fp4: a CUDA extension (_C, the ops' kernels) and a small one of test-only ops
(_C_testing, loaded by qwen_resnorm_fp4.testing alone), against the LibTorch stable ABI and Python's limited
API, so one cp310-abi3 wheel serves every torch >= 2.10 and Python >= 3.10 of the same CUDA major version.

Environment:
  QWEN_FP4_CUDA_ARCHS     GPU targets, ';'-separated (default "90a;100f;120f;compute_90": cubins for
                          sm_90a, sm_100f, sm_120f and compute_90 PTX for GPUs the wheel does not know).
  QWEN_FP4_FLASHINFER_DIR FlashInfer's headers for the Blackwell targets: a FlashInfer source tree, a flashinfer/data
                          directory or the flashinfer-python wheel file. Unset, the build takes a checkout in
                          third_party/flashinfer, an installed flashinfer-python that imports, or else fetches the
                          pinned wheel and extracts its headers into build/ (see third_party/README.md).
  QWEN_FP4_FLASHINFER_ANY_VERSION=1  Accept a flashinfer-python other than FLASHINFER_PINNED (installed or named).
  QWEN_FP4_NO_CUDA=1      Pure-Python install (CPU reference only), even with a CUDA toolkit.
  QWEN_FP4_EMULATE_BLACKWELL=1  A test build, never shipped: the Blackwell path for sm_90a, FlashInfer 0.7.4's
                          conversion with its Blackwell-only instructions emulated in software
                          (tools/emulated_flashinfer_header.py), so the H200 can run it against the portable path.
  MAX_JOBS                Parallel compile jobs (ninja).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from setuptools import find_packages, setup

ROOT = Path(__file__).parent.resolve()
PACKAGE = ROOT / "qwen_resnorm_fp4"
# The one place the version is written is pyproject.toml; _version.py (written below) carries it into the package.
VERSION = re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M).group(1)
FLASHINFER_PINNED = "0.7.4"  # the flashinfer-python whose headers the Blackwell path is tested against
# Its wheel (py3-none-any: one file for every platform), as PyPI serves it. Change all three with FLASHINFER_PINNED.
FLASHINFER_WHEEL = f"flashinfer_python-{FLASHINFER_PINNED}-py3-none-any.whl"
FLASHINFER_WHEEL_SHA256 = "a051a62e09a2738e8b0de47a1944fd2f0f3eff01b728b662141ea660cb09dd32"
FLASHINFER_WHEEL_URL = ("https://files.pythonhosted.org/packages/7e/22/"
                        "c96155b9959c0fb37ce179c7b1053552c170ab875bbbfc75406c9024c36f/" + FLASHINFER_WHEEL)
# Where the build extracts that wheel's headers and licence (ignored by git, not in the sdist).
FLASHINFER_FETCH_DIR = ROOT / "build" / f"flashinfer-{FLASHINFER_PINNED}"
FLASHINFER_STAMP = "WHEEL_SHA256"  # in an extracted tree: the SHA-256 of the wheel it came from
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


def _flashinfer_layout(base: Path) -> Path | None:
    """base/csrc/nv_internal when base holds FlashInfer's TensorRT-LLM headers there, else None."""
    nv = base / "csrc" / "nv_internal"
    if (nv / "tensorrt_llm" / "kernels" / "quantization_utils.cuh").is_file():
        return nv
    return None


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _wheel_member_target(name: str) -> str | None:
    """Where a member of a flashinfer-python wheel goes in the extracted tree (None: the build does not read it)."""
    for prefix, target in (("flashinfer/data/csrc/nv_internal/", "csrc/nv_internal/"),
                           ("flashinfer/data/include/", "include/")):
        if name.startswith(prefix) and not name.endswith("/"):
            return target + name[len(prefix):]
    if re.fullmatch(r"flashinfer_python-[^/]+\.dist-info/licenses/LICENSE", name):
        return "LICENSE"
    return None


def extract_flashinfer_wheel(wheel: Path, dest: Path, digest: str) -> Path:
    """Extract the headers and the licence of a flashinfer-python wheel into dest (replaced), stamped with the
    wheel's SHA-256; returns dest's csrc/nv_internal."""
    partial = dest.with_name(dest.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    with zipfile.ZipFile(wheel) as z:
        for info in z.infolist():
            rel = _wheel_member_target(info.filename)
            if rel is None:
                continue
            if ".." in Path(rel).parts or Path(rel).is_absolute():
                raise SystemExit(f"qwen-resnorm-fp4: {wheel} has a member outside its tree: {info.filename}")
            target = partial / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            with z.open(info) as src, open(target, "wb") as out:
                shutil.copyfileobj(src, out)
    (partial / FLASHINFER_STAMP).write_text(digest + "\n")
    shutil.rmtree(dest, ignore_errors=True)
    partial.rename(dest)
    nv = _flashinfer_layout(dest)
    if nv is None:
        raise SystemExit(f"qwen-resnorm-fp4: {wheel} holds no flashinfer/data/csrc/nv_internal/tensorrt_llm/kernels/"
                         "quantization_utils.cuh: not a flashinfer-python wheel with FlashInfer's headers")
    return nv


def _extracted(dest: Path, digest: str) -> Path | None:
    """dest's csrc/nv_internal when dest was extracted from the wheel of this SHA-256, else None."""
    stamp = dest / FLASHINFER_STAMP
    if stamp.is_file() and stamp.read_text().strip() == digest:
        return _flashinfer_layout(dest)
    return None


def flashinfer_from_wheel_file(wheel: Path, any_version_allowed: bool) -> Path:
    """The headers of a flashinfer-python wheel the user named (QWEN_FP4_FLASHINFER_DIR), extracted into the build
    tree; its version must be the pinned one unless QWEN_FP4_FLASHINFER_ANY_VERSION=1 (and any_version_allowed)."""
    match = re.match(r"flashinfer_python-([^-]+)-", wheel.name)
    version = match.group(1) if match else None
    any_version = any_version_allowed and os.environ.get("QWEN_FP4_FLASHINFER_ANY_VERSION") == "1"
    if version != FLASHINFER_PINNED and not any_version:
        raise SystemExit(
            f"qwen-resnorm-fp4: QWEN_FP4_FLASHINFER_DIR={wheel} is not the flashinfer-python {FLASHINFER_PINNED} wheel "
            f"({FLASHINFER_WHEEL}) that the Blackwell path is tested against (set QWEN_FP4_FLASHINFER_ANY_VERSION=1 "
            "to build against it anyway)")
    digest = _sha256(wheel)
    dest = ROOT / "build" / "flashinfer-wheel"
    return _extracted(dest, digest) or extract_flashinfer_wheel(wheel, dest, digest)


class FetchError(Exception):
    pass


def download_flashinfer_wheel(directory: Path) -> Path:
    """Download the pinned flashinfer-python wheel into directory: with pip (the user's index, proxy and
    certificate settings apply), or from PyPI directly where this Python has no pip (a uv environment)."""
    wheel = directory / FLASHINFER_WHEEL
    if importlib.util.find_spec("pip") is not None:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--dest", str(directory),
               f"flashinfer-python=={FLASHINFER_PINNED}"]
        log("fetching FlashInfer's headers: " + " ".join(cmd))
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if proc.returncode != 0 or not wheel.is_file():
            tail = "\n    ".join(proc.stdout.strip().splitlines()[-8:])
            raise FetchError(f"pip download exited with {proc.returncode}:\n    {tail}")
        return wheel
    import urllib.request

    log(f"fetching FlashInfer's headers: no pip in this Python, downloading {FLASHINFER_WHEEL_URL}")
    try:
        with urllib.request.urlopen(FLASHINFER_WHEEL_URL, timeout=60) as response, open(wheel, "wb") as out:
            shutil.copyfileobj(response, out)
    except OSError as exc:
        raise FetchError(f"downloading {FLASHINFER_WHEEL_URL} failed: {exc}") from exc
    return wheel


def fetch_flashinfer() -> Path:
    """The pinned flashinfer-python wheel's headers in the build tree (FLASHINFER_FETCH_DIR): reused when already
    extracted from the wheel of FLASHINFER_WHEEL_SHA256, else downloaded, checked against it and extracted.
    Returns the tree's csrc/nv_internal; raises FetchError."""
    nv = _extracted(FLASHINFER_FETCH_DIR, FLASHINFER_WHEEL_SHA256)
    if nv:
        return nv
    FLASHINFER_FETCH_DIR.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=FLASHINFER_FETCH_DIR.parent) as tmp:
        wheel = download_flashinfer_wheel(Path(tmp))
        digest = _sha256(wheel)
        if digest != FLASHINFER_WHEEL_SHA256:
            raise FetchError(f"the downloaded {wheel.name} has SHA-256 {digest}, not PyPI's {FLASHINFER_WHEEL_SHA256}")
        return extract_flashinfer_wheel(wheel, FLASHINFER_FETCH_DIR, digest)


def _import_error(module: str) -> str | None:
    """None when `import module` succeeds in a fresh interpreter, else the error's last line."""
    try:
        proc = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True, text=True, timeout=600,
                              cwd=tempfile.gettempdir())
    except subprocess.TimeoutExpired:
        return "the import did not finish in 600 s"
    if proc.returncode == 0:
        return None
    lines = proc.stderr.strip().splitlines()
    return lines[-1] if lines else f"exit status {proc.returncode}"


def find_flashinfer(any_version_allowed: bool = True) -> tuple[Path, str, Path | None]:
    """(include root holding tensorrt_llm/ and flashinfer/, a description, the licence file).
    any_version_allowed: whether QWEN_FP4_FLASHINFER_ANY_VERSION=1 may admit an unpinned flashinfer-python."""
    escape = any_version_allowed and os.environ.get("QWEN_FP4_FLASHINFER_ANY_VERSION") == "1"
    env = os.environ.get("QWEN_FP4_FLASHINFER_DIR")
    if env:  # named explicitly: used, or the build stops
        path = Path(env)
        if path.is_file() and path.suffix == ".whl":
            nv = flashinfer_from_wheel_file(path, any_version_allowed)
            return nv, f"QWEN_FP4_FLASHINFER_DIR={env}", _licence(nv.parent.parent)
        for base in (path, path / "data"):
            nv = _flashinfer_layout(base)
            if nv:
                return nv, f"QWEN_FP4_FLASHINFER_DIR={env}", _licence(base)
        raise SystemExit(
            f"qwen-resnorm-fp4: QWEN_FP4_FLASHINFER_DIR={env} holds no csrc/nv_internal/tensorrt_llm/kernels/"
            "quantization_utils.cuh (nor data/csrc/...): point it at a FlashInfer source tree, the flashinfer/data "
            f"directory of flashinfer-python {FLASHINFER_PINNED}, or its wheel file ({FLASHINFER_WHEEL})")
    tried = ["QWEN_FP4_FLASHINFER_DIR (not set)"]

    checkout = ROOT / "third_party" / "flashinfer"
    nv = _flashinfer_layout(checkout)
    if nv:
        return nv, f"checkout {checkout}", _licence(checkout)
    tried.append(f"a FlashInfer checkout at {checkout} (absent)")

    # An installed flashinfer-python serves only when it imports: one that does not breaks every import of
    # flashinfer (diffusers, SGLang, vLLM), and the build must not depend on it.
    spec = importlib.util.find_spec("flashinfer")
    if spec is not None and spec.submodule_search_locations:
        pkg = Path(list(spec.submodule_search_locations)[0])
        try:
            version = importlib.metadata.version("flashinfer-python")
        except importlib.metadata.PackageNotFoundError:
            version = None
        nv = _flashinfer_layout(pkg / "data")
        error = _import_error("flashinfer") if nv else None
        if nv is None:
            tried.append(f"the installed flashinfer-python {version} at {pkg} (no data/csrc/nv_internal)")
        elif error is not None:
            tried.append(f"the installed flashinfer-python {version} at {pkg} "
                         f"(not used: `import flashinfer` fails: {error})")
            log(f"the installed flashinfer-python {version} at {pkg} does not import ({error}), which breaks every "
                "package that imports flashinfer (diffusers, SGLang, vLLM); the build does not use it. Uninstall it "
                "(pip uninstall flashinfer-python) or install it with its dependencies "
                f"(pip install flashinfer-python=={FLASHINFER_PINNED}).")
        elif version != FLASHINFER_PINNED and not escape:
            tried.append(f"the installed flashinfer-python {version} at {pkg} (not {FLASHINFER_PINNED}; "
                         "QWEN_FP4_FLASHINFER_ANY_VERSION=1 builds against it)")
        else:
            return nv, f"flashinfer-python {version} at {pkg}", _licence(pkg / "data")
    else:
        tried.append("the installed flashinfer-python package (not installed)")

    try:
        nv = fetch_flashinfer()
    except FetchError as exc:
        tried.append(f"fetching the flashinfer-python {FLASHINFER_PINNED} wheel into {FLASHINFER_FETCH_DIR} ({exc})")
        raise SystemExit(
            "qwen-resnorm-fp4: the Blackwell targets need FlashInfer's headers (build time only) and none were found. "
            "Tried, in order:\n  " + "\n  ".join(tried) +
            f"\nOffline, set QWEN_FP4_FLASHINFER_DIR to the {FLASHINFER_WHEEL} file (`pip download --no-deps "
            f"flashinfer-python=={FLASHINFER_PINNED}` where there is network), to a FlashInfer source tree, or clone "
            "FlashInfer into third_party/flashinfer. Or build without Blackwell: QWEN_FP4_CUDA_ARCHS='90a;compute_90'; "
            "or pure Python (CPU reference only): QWEN_FP4_NO_CUDA=1.") from exc
    return nv, f"flashinfer-python {FLASHINFER_PINNED} wheel (sha256 {FLASHINFER_WHEEL_SHA256[:12]}...), " \
               f"extracted into {FLASHINFER_FETCH_DIR}", _licence(FLASHINFER_FETCH_DIR)


def _licence(base: Path) -> Path | None:
    """FlashInfer's licence next to a header tree: in it or its parent (a source tree, an extracted wheel), or in
    the dist-info beside the package (the flashinfer/data directory of an installed flashinfer-python)."""
    candidates = [base / "LICENSE", base.parent / "LICENSE"]
    candidates += sorted(base.parent.parent.glob("flashinfer_python-*.dist-info/licenses/LICENSE"))
    for cand in candidates:
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
        f"BLACKWELL_EMULATION = {emulation!r}  # True only in the emulation build (QWEN_FP4_EMULATE_BLACKWELL=1), "
        "never shipped\n")


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
        raise SystemExit(f"qwen-resnorm-fp4: the Blackwell emulation cannot use this FlashInfer header: {exc}") from exc
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
        include_dirs += [emulated_flashinfer_include(nv), str(nv), str(nv / "include"),
                         str(nv.parent.parent / "include")]
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
    # The emulation wheel carries the build tag EMULATION_BUILD_TAG in its file name, so it is never taken for
    # a release.
    options=({"bdist_wheel": {"py_limited_api": "cp310",
                              **({"build_number": EMULATION_BUILD_TAG} if emulating_blackwell() else {})}}
             if ext_modules else {}),
)
