#!/usr/bin/env python3
"""Check a built qwen-resnorm-fp4 wheel before it is published.

    python scripts/check_wheel.py dist/qwen_resnorm_fp4-*.whl [--require-sass] [--targets 90a;100f;120f;compute_90]

One line per check (PASS / FAIL / SKIP), exit status 1 if any fails; docs/install.md says what each checks.
The compiled libraries checked are qwen_resnorm_fp4/_C.abi3.so (required) and _C_testing.abi3.so (optional):
extension (those two only), tag (cp310-abi3, Linux, readelf -h machine), release (not the emulation build),
gpu-code (cuobjdump's fatbin listing: every target in each translation unit), fp4-sass (cuobjdump -sass:
F2FP.SATFINITE.E2M1 in _C's Blackwell cubins), stable-abi (readelf: DT_NEEDED, symbols resolved against the
installed torch), abi-audit (torch-abi-audit's verdict and minimum torch), licences.

Tools: readelf (binutils); cuobjdump and nvdisasm as $CUOBJDUMP / $NVDISASM, or on PATH, in $CUDA_HOME/bin,
/usr/local/cuda/bin or site-packages/nvidia/cu13/bin (pip install "nvidia-cuda-cuobjdump==13.*"
"nvidia-cuda-nvdisasm==13.*"); torch-abi-audit (pip install torch-abi-audit, Python >= 3.11), optional.
"""

from __future__ import annotations

import argparse
import functools
import glob
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

PACKAGE = "qwen_resnorm_fp4"
MAIN_LIB, TESTING_LIB = f"{PACKAGE}/_C.abi3.so", f"{PACKAGE}/_C_testing.abi3.so"
DEFAULT_TARGETS = "90a;100f;120f;compute_90"  # setup.py's DEFAULT_ARCHS
FLASHINFER_LICENCE = f"{PACKAGE}/_licenses/LICENSE.flashinfer.txt"
EMULATION_MARKER = b"qwen_fp4 Blackwell emulation build"  # csrc/launch_blackwell.cu, emulation build only
FP4_SASS = re.compile(r"F2FP\.SATFINITE\.E2M1\S*")
SHIM = re.compile(r"^(?:aoti_torch_|torch_)")
# torch's libraries also define the C++ standard library and runtime symbols; those are not torch's API
CXX_RUNTIME = re.compile(r"^(?:(?:typeinfo(?: name)?|vtable|VTT) for )?"
                         r"(?:std::|__gnu_cxx::|__cxxabiv1::|operator (?:new|delete)|__cxa_|__gxx_|_Unwind_)")
MACHINES = {"Advanced Micro Devices X86-64": "x86_64", "AArch64": "aarch64"}  # readelf -h's Machine
Blocks = list[tuple[str, str, str]]  # (translation unit, target, text) per fat binary entry


class Report:
    """Prints one line per check and remembers whether any failed."""

    failed = False

    def line(self, status: str, check: str, msg: str) -> None:
        self.failed |= status == "FAIL"
        print(f"{status:4s} {check}: {msg}", flush=True)


class ToolError(RuntimeError):
    """A tool is missing or failed; the message says which and why."""


INSTALL = {"readelf": "install binutils", "cuobjdump": 'CUDA toolkit, or pip install "nvidia-cuda-cuobjdump==13.*"',
           "nvdisasm": 'CUDA toolkit, or pip install "nvidia-cuda-nvdisasm==13.*"'}


def find_tool(name: str) -> str | None:
    """$NAME (upper case), or NAME on PATH, in $CUDA_HOME/bin, /usr/local/cuda/bin, site-packages/nvidia/cu*/bin."""
    if os.environ.get(name.upper()):
        return shutil.which(os.environ[name.upper()])
    dirs = [os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin"), "/usr/local/cuda/bin"]
    dirs += [d for p in sys.path if p for d in sorted(glob.glob(os.path.join(p, "nvidia", "cu*", "bin")), reverse=True)]
    return shutil.which(name) or shutil.which(name, path=os.pathsep.join(dirs))


def run_tool(name: str, *args, env: dict | None = None, empty_if: str = "") -> str:
    """The tool's stdout ("" where it fails saying empty_if); ToolError if it is missing or fails otherwise."""
    exe = find_tool(name)
    if exe is None:
        raise ToolError(f"{name} not found ({INSTALL[name]})")
    r = subprocess.run([exe, *map(str, args)], capture_output=True, text=True, env=env)
    if r.returncode != 0 and not (empty_if and empty_if in r.stderr):
        raise ToolError(f"{exe} {' '.join(map(str, args))} failed (exit {r.returncode}): "
                        f"{(r.stderr or r.stdout).strip()[:300]}")
    return r.stdout if r.returncode == 0 else ""


def elf_machine(so: Path) -> str:
    """x86_64 / aarch64, or readelf's words for another machine."""
    m = re.search(r"^\s*Machine:\s*(.+?)\s*$", run_tool("readelf", "-W", "-h", so), re.M)
    return MACHINES.get(m.group(1), m.group(1)) if m else "unknown"


def dynamic_symbols(*paths: Path) -> list[tuple[str, bool]]:
    """(demangled name without its @version, undefined?) of every dynamic symbol of the files."""
    out = []
    for line in run_tool("readelf", "-W", "--dyn-syms", "-C", *paths).splitlines():
        f = line.split(None, 7)  # Num: Value Size Type Bind Vis Ndx Name (a demangled name has spaces)
        if len(f) == 8 and f[0].endswith(":") and f[0][:-1].isdigit():
            out.append((f[7].split("@")[0], f[6] == "UND"))
    return out


def fatbin_blocks(listing: str) -> Blocks:
    """The entries of cuobjdump's output: an ELF entry of arch sm_100f is target sm_100f, a PTX entry of arch
    sm_90 is target compute_90; the translation unit is the basename of its identifier."""
    out = []
    entries = re.findall(r"^Fatbin (elf|ptx) code:\n(.*?)(?=^Fatbin (?:elf|ptx) code:|\Z)", listing, re.M | re.S)
    for kind, text in entries:
        arch = re.search(r"^arch = sm_(\w+)", text, re.M)
        tu = re.search(r"^identifier = (.+?)\s*$", text, re.M)
        out.append((os.path.basename(tu.group(1)) if tu else "(unnamed)",
                    ("sm_" if kind == "elf" else "compute_") + (arch.group(1) if arch else "?"), text))
    return out


def cuobjdump(so: Path, *args: str, env: dict | None = None) -> Blocks:
    return fatbin_blocks(run_tool("cuobjdump", *args, so, env=env, empty_if="does not contain device code"))


def parse_target(spec: str) -> str:
    """'90a' -> 'sm_90a'; 'sm_100f' -> 'sm_100f'; 'compute_90' -> 'compute_90'."""
    m = re.fullmatch(r"(compute_|sm_)?(\d+[af]?)", spec.strip())
    if not m:
        raise ValueError(f"not a GPU target: {spec!r}")
    return (m.group(1) or "sm_") + m.group(2)


def is_blackwell(target: str) -> bool:
    return target.startswith("sm_") and int(re.match(r"sm_(\d+)", target).group(1)) >= 100


def wheel_tags(filename: str) -> tuple[set[str], set[str], set[str]]:
    """The python, abi and platform tags of a wheel file name."""
    parts = (filename[:-4] if filename.endswith(".whl") else filename).split("-")
    if len(parts) not in (5, 6):
        raise ValueError(f"{filename}: not a wheel file name")
    py, abi, plat = (set(p.split(".")) for p in parts[-3:])
    return py, abi, plat


def select_libraries(names: list[str]) -> tuple[list[str], list[str]]:
    """The wheel's compiled libraries that are checked, and what is wrong with the set."""
    compiled = [n for n in names if n.startswith(f"{PACKAGE}/") and re.search(r"\.so(?:\.|$)", n)]
    problems = [] if MAIN_LIB in compiled else [f"no {MAIN_LIB}" + ("" if compiled else " (pure-Python build?)")]
    if others := [n for n in compiled if n not in (MAIN_LIB, TESTING_LIB)]:
        problems.append(f"unexpected {', '.join(others)} (only {MAIN_LIB} and {TESTING_LIB}, both abi3)")
    return [n for n in (MAIN_LIB, TESTING_LIB) if n in compiled], problems


def check_tag(rep: Report, wheel: Path, zf: zipfile.ZipFile, machines: dict[str, str]) -> None:
    try:
        py, abi, plat = wheel_tags(wheel.name)
    except ValueError as exc:
        rep.line("FAIL", "tag", str(exc))
        return
    problems = []
    if py != {"cp310"}:
        problems.append(f"python tag {'.'.join(sorted(py))} (want cp310)")
    if abi != {"abi3"}:
        problems.append(f"abi tag {'.'.join(sorted(abi))} (want abi3)")
    if not all(p.startswith(("linux_", "manylinux")) for p in plat):
        problems.append(f"platform tag {'.'.join(sorted(plat))} (want linux_* / manylinux*)")
    arches = {re.sub(r"^(?:manylinux\d*(?:_\d+_\d+)?|linux)_", "", p) for p in plat}
    problems += [f"platform {'.'.join(sorted(arches))} but {os.path.basename(n)} is {m}"
                 for n, m in machines.items() if arches != {m}]
    wheel_file = next((n for n in zf.namelist() if re.fullmatch(r"[^/]+\.dist-info/WHEEL", n)), None)
    meta = zf.read(wheel_file).decode() if wheel_file else ""
    tags = set(re.findall(r"^Tag:\s*(\S+)", meta, re.M))
    expect = {f"{a}-{b}-{c}" for a in py for b in abi for c in plat}
    if wheel_file is None:
        problems.append("no .dist-info/WHEEL")
    elif tags != expect:
        problems.append(f"WHEEL says Tag {sorted(tags)}, the file name {sorted(expect)}")
    if re.search(r"^Root-Is-Purelib:\s*true", meta, re.M | re.I):
        problems.append("WHEEL says Root-Is-Purelib: true")
    tag = "-".join(".".join(sorted(t)) for t in (py, abi, plat))
    rep.line("FAIL" if problems else "PASS", "tag", f"{tag}: " + "; ".join(problems) if problems else tag)


def check_release(rep: Report, wheel_name: str, build: dict | None, libs: list[Path]) -> None:
    """FAIL for the Blackwell emulation build (software E2M1 on sm_90a), which is never to be published."""
    problems = ["_build_info.py says BLACKWELL_EMULATION = True"] if build and build.get("BLACKWELL_EMULATION") else []
    problems += [f"{so.name} holds the emulation marker {EMULATION_MARKER.decode()!r}"
                 for so in libs if EMULATION_MARKER in so.read_bytes()]
    parts = wheel_name[:-4].split("-") if wheel_name.endswith(".whl") else []
    if len(parts) == 6 and "emulation" in parts[2]:
        problems.append(f"the file name's build tag is {parts[2]!r}")
    if problems:
        rep.line("FAIL", "release", "a Blackwell emulation build (QWEN_FP4_EMULATE_BLACKWELL=1), never to be "
                 "published: " + "; ".join(problems))
    else:
        rep.line("PASS", "release", "not an emulation build (build info, libraries, file name)")


def check_gpu_code(rep: Report, listings: dict[str, Blocks], targets: list[str]) -> None:
    found, missing = [], []
    for lib, blocks in listings.items():
        per_tu: dict[str, set[str]] = {}
        for tu, target, _ in blocks:
            per_tu.setdefault(tu, set()).add(target)
        name = os.path.basename(lib)
        found.append(f"{name}: " + (" | ".join(f"{tu} {' '.join(sorted(t))}" for tu, t in sorted(per_tu.items()))
                                    or "no GPU code"))
        missing += [f"{name} {tu} lacks {', '.join(m)}" for tu, have in sorted(per_tu.items())
                    if (m := [t for t in targets if t not in have])]
        missing += [f"{name} has no GPU code"] if lib == MAIN_LIB and not per_tu else []
    want = " ".join(targets)
    if missing:
        rep.line("FAIL", "gpu-code", f"want {want} in every translation unit: {'; '.join(missing)} | found "
                 + "; ".join(found))
    else:
        rep.line("PASS", "gpu-code", f"{want} in every translation unit ({'; '.join(found)})")


def check_fp4_sass(rep: Report, so: Path, blocks: Blocks, require: bool) -> None:
    blackwell, nvdisasm = sorted({t for _, t, _ in blocks if is_blackwell(t)}), find_tool("nvdisasm")
    why_not = ("no Blackwell (sm_100+) cubins to disassemble" if not blackwell
               else f"no nvdisasm ({INSTALL['nvdisasm']})" if nvdisasm is None else "")
    if why_not:
        rep.line("FAIL" if require else "SKIP", "fp4-sass", why_not)
        return
    env = dict(os.environ, PATH=os.path.dirname(nvdisasm) + os.pathsep + os.environ.get("PATH", ""))
    counts: dict[str, dict[str, int]] = {sm: {} for sm in blackwell}
    for sm in blackwell:
        try:
            sass = cuobjdump(so, "-sass", "-arch", sm, env=env)
        except ToolError as exc:
            rep.line("FAIL", "fp4-sass", str(exc))
            return
        for tu, _, text in sass:
            if "Function :" not in text:
                rep.line("FAIL", "fp4-sass", f"cuobjdump -sass printed no SASS for {sm} {tu} (nvdisasm broken?)")
                return
            counts[sm][tu] = counts[sm].get(tu, 0) + len(FP4_SASS.findall(text))
    detail = "; ".join(f"{sm}: " + ", ".join(f"{tu} {n}" for tu, n in sorted(c.items())) for sm, c in counts.items())
    if missing := [sm for sm, c in counts.items() if not sum(c.values())]:
        rep.line("FAIL", "fp4-sass", f"no F2FP.SATFINITE.E2M1 in {', '.join(missing)} [{detail}]")
    else:
        rep.line("PASS", "fp4-sass", f"F2FP.SATFINITE.E2M1 instructions per cubin: {detail} (cuobjdump -sass)")


def torch_libraries() -> list[Path]:
    """libtorch*.so / libc10*.so of the installed torch (found without importing it)."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return []
    lib = Path(list(spec.submodule_search_locations)[0]) / "lib"
    return sorted(p for p in lib.glob("lib*.so") if re.match(r"lib(?:torch|c10)", p.name))


@functools.lru_cache(maxsize=1)
def torch_defined_symbols() -> frozenset[str] | None:
    """What the installed torch's libraries define (None without torch)."""
    libs = torch_libraries()
    return frozenset(n for n, undef in dynamic_symbols(*libs) if not undef) if libs else None


def check_stable_abi(rep: Report, libs: list[Path]) -> None:
    problems, notes, torch_libs, torch_defined = [], [], torch_libraries(), torch_defined_symbols()
    for so in libs:
        undefined = [n for n, undef in dynamic_symbols(so) if undef and n]
        needed = re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", run_tool("readelf", "-W", "-d", so))
        shim = [n for n in undefined if SHIM.match(n)]
        if bad := [n for n in needed if n.startswith(("libtorch_python", "libpython"))]:
            problems.append(f"{so.name} needs {', '.join(bad)} (ties the wheel to one Python/torch build)")
        if not shim:
            problems.append(f"{so.name} imports no aoti_torch_*/torch_* symbol: not a stable-ABI torch library")
        torch_needed = [n for n in needed if n.startswith(("libtorch", "libc10"))]
        note = (f"{so.name}: {len(undefined)} undefined symbols, {len(shim)} shim, needs "
                + (", ".join(torch_needed) or "no torch library"))
        if torch_defined is not None:
            from_torch = [n for n in undefined if n in torch_defined and not CXX_RUNTIME.match(n)]
            if outside := [n for n in from_torch if not SHIM.match(n)]:
                problems.append(f"{so.name}: {len(outside)} symbols that torch's libraries define are not C shim "
                                "symbols: " + ", ".join(outside[:8]) + (" ..." if len(outside) > 8 else ""))
            note += f"; {len(from_torch)} resolve in torch's libraries" + ("" if outside else ", all C shim")
        notes.append(note)
    if problems:
        rep.line("FAIL", "stable-abi", "; ".join(problems) + " | " + "; ".join(notes))
    elif torch_defined is None:
        rep.line("SKIP", "stable-abi", "torch not installed, so not resolved against its libraries | "
                 + "; ".join(notes))
    else:
        rep.line("PASS", "stable-abi", "; ".join(notes) + f" ({len(torch_libs)} libraries in {torch_libs[0].parent})")


def version_tuple(v: str) -> tuple[int, ...]:
    """'2.10' -> (2, 10, 0)."""
    return tuple((list(map(int, re.findall(r"\d+", v))) + [0, 0, 0])[:3])


def check_abi_audit(rep: Report, libs: list[Path], torch_floor: str | None) -> None:
    try:
        from torch_abi_audit import inspect_extension  # type: ignore
    except ImportError:
        rep.line("SKIP", "abi-audit", "torch-abi-audit not installed (pip install torch-abi-audit, Python >= 3.11)")
        return
    problems = [] if torch_floor else ["the wheel's METADATA has no 'Requires-Dist: torch>=' to compare with"]
    notes = []
    for so in libs:
        r = inspect_extension(so)
        v = r.torch.min_torch_version
        if r.error or not r.torch.stable:
            problems.append(f"{so.name}: " + (r.error or (f"unstable symbols {list(r.torch.unstable_symbols)[:8]}"
                                                         if r.torch.unstable_symbols else "uses no torch symbol")))
        elif torch_floor and v and version_tuple(v) > version_tuple(torch_floor):
            problems.append(f"{so.name} needs torch {v} ({', '.join(r.torch.version_defining_symbols)}), but the "
                            f"wheel requires torch>={torch_floor}")
        notes.append(f"{so.name}: stable={r.torch.stable}, {r.torch.stable_shim_count} shim symbols, min torch {v}"
                     + (" or newer (shims newer than its data)" if r.torch.unknown_shim_symbols else ""))
    rep.line("FAIL" if problems else "PASS", "abi-audit", "torch-abi-audit: " + "; ".join(problems + notes)
             + f" (the wheel requires torch>={torch_floor})")


def check_licences(rep: Report, zf: zipfile.ZipFile, has_blackwell: bool) -> None:
    names, problems, found = zf.namelist(), [], []
    ours = [n for n in names if re.fullmatch(r"[^/]+\.dist-info/(?:licenses/)?LICENSE(?:\.txt)?", n)]
    if not ours:
        problems.append("no LICENSE in the .dist-info")
    elif "Apache License" in (text := zf.read(ours[0]).decode("utf-8", "replace")) and "Version 2.0" in text:
        found.append(ours[0])
    else:
        problems.append(f"{ours[0]} is not the Apache-2.0 licence")
    extra = [n for n in names if re.fullmatch(r"[^/]+\.dist-info/licenses/.+", n) and n not in ours]
    if has_blackwell and FLASHINFER_LICENCE not in names:
        problems.append(f"Blackwell code (FlashInfer headers) compiled in but no {FLASHINFER_LICENCE}")
    elif has_blackwell and "Apache License" not in zf.read(FLASHINFER_LICENCE).decode("utf-8", "replace"):
        problems.append(f"{FLASHINFER_LICENCE} is not FlashInfer's Apache-2.0 licence")
    elif has_blackwell:
        found.append(FLASHINFER_LICENCE)
    rep.line("FAIL" if problems else "PASS", "licences", "; ".join(problems) or (
        ", ".join(found) + (f" (also {', '.join(extra)})" if extra else "")
        + ("" if has_blackwell else "; no Blackwell code, so no FlashInfer licence needed")))


def check_wheel(rep: Report, wheel: Path, zf: zipfile.ZipFile, tmp: str, targets: list[str], require_sass: bool
                ) -> None:
    """Every check on an open wheel (libraries extracted into tmp)."""
    names, build = zf.namelist(), None
    if f"{PACKAGE}/_build_info.py" in names:
        build = {}
        exec(zf.read(f"{PACKAGE}/_build_info.py").decode(), build)  # our own generated constants
        print(f"info wheel {wheel.name}: built for {build.get('CUDA_ARCHS')} with torch {build.get('BUILD_TORCH')}, "
              f"CUDA {build.get('BUILD_CUDA')}, FlashInfer {build.get('FLASHINFER')}")
    selected, problems = select_libraries(names)
    libs = {n: Path(zf.extract(n, tmp)) for n in selected}
    rep.line("FAIL" if problems else "PASS", "extension", "; ".join(problems) or ", ".join(libs))
    check_tag(rep, wheel, zf, {n: elf_machine(so) for n, so in libs.items()})
    check_release(rep, wheel.name, build, list(libs.values()))
    has_blackwell = False
    if MAIN_LIB not in libs:
        for check in ("gpu-code", "fp4-sass", "stable-abi", "abi-audit"):
            rep.line("SKIP", check, f"no {MAIN_LIB}")
        return check_licences(rep, zf, has_blackwell)
    try:
        listings = {n: cuobjdump(so) for n, so in libs.items()}
        check_gpu_code(rep, listings, targets)
        check_fp4_sass(rep, libs[MAIN_LIB], listings[MAIN_LIB], require_sass)
        has_blackwell = any(is_blackwell(t) for blocks in listings.values() for _, t, _ in blocks)
    except ToolError as exc:  # then whether FlashInfer's licence is needed comes from the build info
        rep.line("FAIL", "gpu-code", str(exc))
        rep.line("FAIL" if require_sass else "SKIP", "fp4-sass", "no fatbin listing")
        has_blackwell = any(is_blackwell(parse_target(a)) for a in (build or {}).get("CUDA_ARCHS", []))
    check_stable_abi(rep, list(libs.values()))
    metadata = next((zf.read(n).decode() for n in names if re.fullmatch(r"[^/]+\.dist-info/METADATA", n)), "")
    floor = re.search(r"^Requires-Dist:\s*torch\s*>=\s*([\d.]+)\s*$", metadata, re.M)
    check_abi_audit(rep, list(libs.values()), floor.group(1) if floor else None)
    check_licences(rep, zf, has_blackwell)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("wheel", type=Path)
    ap.add_argument("--require-sass", action="store_true",
                    help="fail (instead of skip) when no disassembler is available to check the Blackwell SASS")
    ap.add_argument("--targets", default=DEFAULT_TARGETS,
                    help=f"GPU targets every translation unit must hold, ';'-separated (default {DEFAULT_TARGETS})")
    args = ap.parse_args(argv)
    targets = [parse_target(t) for t in args.targets.replace(",", ";").split(";") if t.strip()]
    rep = Report()
    if not args.wheel.is_file():
        rep.line("FAIL", "wheel", f"{args.wheel}: no such file")
        return 1
    with zipfile.ZipFile(args.wheel) as zf, tempfile.TemporaryDirectory() as tmp:
        try:
            check_wheel(rep, args.wheel, zf, tmp, targets, args.require_sass)
        except ToolError as exc:  # readelf missing, or a library it cannot read
            rep.line("FAIL", "readelf", f"{exc}; the checks after this line did not run")
    print(f"{'FAILED' if rep.failed else 'OK'}: {args.wheel.name}")
    return 1 if rep.failed else 0


if __name__ == "__main__":
    sys.exit(main())
