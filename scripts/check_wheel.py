#!/usr/bin/env python3
"""Check a built qwen-resnorm-fp4 wheel before it is published.

    python scripts/check_wheel.py dist/qwen_resnorm_fp4-*.whl [--require-sass] [--targets 90a;100f;120f;compute_90]

Prints one line per check (PASS / FAIL / SKIP) and exits non-zero if any check fails:

  tag         the file name says cp310-abi3 and a Linux platform, and agrees with the WHEEL file and the
              machine type of the extension library
  gpu-code    the extension's .nv_fatbin holds a cubin for each GPU target (sm_90a, sm_100f, sm_120f by
              default) and the compute_90 PTX, in every translation unit. Parsed here, in Python.
  fp4-sass    the Blackwell cubins use the hardware FP4 conversion (SASS F2FP.SATFINITE.E2M1...). Needs a
              disassembler: cuobjdump (+ nvdisasm) or nvdisasm, from the CUDA toolkit or from the PyPI
              packages nvidia-cuda-cuobjdump / nvidia-cuda-nvdisasm. SKIP without one, FAIL with --require-sass.
  stable-abi  every undefined dynamic symbol that torch provides is a C shim symbol (aoti_torch_* / torch_*):
              no c10:: / at:: / torch:: C++ symbol, no libtorch_python / libpython dependency. Parsed here;
              symbols are also resolved against the installed torch's libraries when torch is installed.
  abi-audit   torch-abi-audit's verdict (pip install torch-abi-audit; Python >= 3.11), SKIP if not installed.
  release     not the Blackwell emulation build (QWEN_FP4_EMULATE_BLACKWELL=1, a test build): its build info, the
              marker string its library holds, and its file name's build tag each say so.
  licences    our LICENSE (Apache-2.0) in the .dist-info, and FlashInfer's licence
              (qwen_resnorm_fp4/_licenses/LICENSE.flashinfer.txt) when Blackwell code is compiled in.

Fat binary layout (reverse engineered; cross-checked against cuobjdump and nvcc -gencode output, see
tests/test_wheel_check.py): a .nv_fatbin section holds one container per translation unit. A container is a
16-byte header {u32 magic 0xBA55ED50, u16 version 1, u16 header size 16, u64 size of what follows}, then
entries, each a header {u16 kind (1 PTX, 2 ELF cubin), u16, u32 header size, u64 payload size, u32
compressed size, u32, u16 minor, u16 major, u32 SM number, u32 name offset, u32 name length, u64 flags,
u64, u64 uncompressed size, ...} followed by its payload. Flags: 0x1 64-bit, 0x10 Linux, 0x2000 LZ4
compressed, 0x8000 zstd compressed, 0x100000 arch-specific target ("a"), 0x200000 family target ("f").
"""

from __future__ import annotations

import argparse
import glob
import importlib.util
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_TARGETS = "90a;100f;120f;compute_90"  # setup.py's DEFAULT_ARCHS
PACKAGE = "qwen_resnorm_fp4"
FLASHINFER_LICENCE = f"{PACKAGE}/_licenses/LICENSE.flashinfer.txt"
EMULATION_MARKER = b"qwen_fp4 Blackwell emulation build"  # csrc/launch_blackwell.cu, emulation build only

# ---------------------------------------------------------------------------------------------------------
# ELF (64-bit little-endian: Linux x86_64 / aarch64 hosts and CUDA cubins)

EM_X86_64, EM_AARCH64, EM_CUDA = 62, 183, 190
SHT_DYNSYM, SHT_DYNAMIC, SHT_GNU_VERSYM, SHT_GNU_VERNEED = 11, 6, 0x6FFFFFFF, 0x6FFFFFFE
DT_NEEDED = 1


@dataclass
class Section:
    name: str
    type: int
    offset: int
    size: int
    link: int
    info: int


class Elf:
    """Just enough of an ELF64 reader: sections, dynamic symbols with versions, DT_NEEDED. Reads by seeking,
    so a 1 GiB libtorch_cuda.so costs only its symbol tables."""

    def __init__(self, path: str | os.PathLike):
        self.path = str(path)
        self._f = open(self.path, "rb")
        ident = self._f.read(64)
        if ident[:4] != b"\x7fELF":
            raise ValueError(f"{path}: not an ELF file")
        if ident[4] != 2 or ident[5] != 1:
            raise ValueError(f"{path}: not a 64-bit little-endian ELF file")
        self.machine = struct.unpack_from("<H", ident, 18)[0]
        shoff = struct.unpack_from("<Q", ident, 0x28)[0]
        shentsize, shnum, shstrndx = struct.unpack_from("<HHH", ident, 0x3A)
        raw = self._read(shoff, shentsize * shnum)
        hdrs = [struct.unpack_from("<IIQQQQIIQQ", raw, i * shentsize) for i in range(shnum)]
        names = self._read(hdrs[shstrndx][4], hdrs[shstrndx][5]) if shnum else b""
        self.sections = [
            Section(_cstr(names, h[0]), h[1], h[4], h[5], h[6], h[7]) for h in hdrs]

    def close(self) -> None:
        self._f.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _read(self, offset: int, size: int) -> bytes:
        self._f.seek(offset)
        return self._f.read(size)

    def section(self, name: str) -> Section | None:
        return next((s for s in self.sections if s.name == name), None)

    def section_data(self, sec: Section) -> bytes:
        return self._read(sec.offset, sec.size)

    def dynamic_symbols(self) -> list[tuple[str, bool, bool, str | None]]:
        """(name, undefined, weak, version-library or None) for every named dynamic symbol."""
        dynsym = next((s for s in self.sections if s.type == SHT_DYNSYM), None)
        if dynsym is None:
            return []
        strtab = self.section_data(self.sections[dynsym.link])
        data = self.section_data(dynsym)
        versions: dict[int, str] = {}
        versym = next((s for s in self.sections if s.type == SHT_GNU_VERSYM), None)
        verneed = next((s for s in self.sections if s.type == SHT_GNU_VERNEED), None)
        vers = self.section_data(versym) if versym else b""
        if verneed is not None:
            vn = self.section_data(verneed)
            vstr = self.section_data(self.sections[verneed.link])
            off = 0
            for _ in range(verneed.info):
                _v, cnt, file_, aux, nxt = struct.unpack_from("<HHIII", vn, off)
                a = off + aux
                for _ in range(cnt):
                    _h, _fl, other, name, anext = struct.unpack_from("<IHHII", vn, a)
                    versions[other] = f"{_cstr(vstr, name)} ({_cstr(vstr, file_)})"
                    a += anext
                if not nxt:
                    break
                off += nxt
        out = []
        for i in range(1, len(data) // 24):
            st_name, st_info, _other, shndx = struct.unpack_from("<IBBH", data, i * 24)
            name = _cstr(strtab, st_name)
            if not name:
                continue
            vidx = struct.unpack_from("<H", vers, 2 * i)[0] & 0x7FFF if len(vers) >= 2 * i + 2 else 1
            out.append((name, shndx == 0, (st_info >> 4) == 2, versions.get(vidx)))
        return out

    def needed(self) -> list[str]:
        dyn = next((s for s in self.sections if s.type == SHT_DYNAMIC), None)
        if dyn is None:
            return []
        strtab = self.section_data(self.sections[dyn.link])
        data = self.section_data(dyn)
        out = []
        for i in range(len(data) // 16):
            tag, val = struct.unpack_from("<qQ", data, i * 16)
            if tag == 0:
                break
            if tag == DT_NEEDED:
                out.append(_cstr(strtab, val))
        return out


def _cstr(buf: bytes, off: int) -> str:
    end = buf.find(b"\0", off)
    return buf[off:end if end >= 0 else len(buf)].decode("utf-8", "replace")


# ---------------------------------------------------------------------------------------------------------
# Fat binaries

FATBIN_MAGICS = (0xBA55ED50, 0x466243B1)  # executable, relocatable (-rdc)
KIND_PTX, KIND_ELF = 1, 2
FLAG_LZ4, FLAG_ZSTD = 0x2000, 0x8000
FLAG_ARCH_SPECIFIC, FLAG_FAMILY = 0x100000, 0x200000


@dataclass
class FatbinEntry:
    kind: int  # 1 PTX, 2 ELF cubin
    arch: int  # SM number: 90, 100, 120, ...
    variant: str  # "", "a" or "f"
    flags: int
    name: str  # the translation unit, as nvcc recorded it ("" if none)
    payload: bytes  # as stored: padded to 8 bytes
    uncompressed_size: int
    compressed_size: int = 0  # the real length of a compressed payload

    @property
    def target(self) -> str:
        prefix = "compute_" if self.kind == KIND_PTX else "sm_"
        return f"{prefix}{self.arch}{self.variant}"

    @property
    def compression(self) -> str | None:
        if self.flags & FLAG_ZSTD:
            return "zstd"
        if self.flags & FLAG_LZ4:
            return "lz4"
        return None


@dataclass
class FatbinContainer:
    offset: int
    entries: list[FatbinEntry] = field(default_factory=list)

    @property
    def name(self) -> str:
        return next((e.name for e in self.entries if e.name), f"container@{self.offset:#x}")


def parse_fatbin(data: bytes) -> list[FatbinContainer]:
    """Parse the contents of a .nv_fatbin section (one or more containers, maybe padded between)."""
    containers = []
    pos = 0
    while pos + 16 <= len(data):
        starts = [i for i in (data.find(struct.pack("<I", m), pos) for m in FATBIN_MAGICS) if i >= 0]
        if not starts:
            break
        pos = min(starts)
        if pos + 16 > len(data):
            break
        _magic, version, hsize, size = struct.unpack_from("<IHHQ", data, pos)
        if version != 1 or hsize < 16:
            pos += 4
            continue
        end = pos + hsize + size
        if end > len(data):
            raise ValueError(f"fatbin container at {pos:#x} runs past the end of the section")
        cont = FatbinContainer(pos)
        e = pos + hsize
        while e + 64 <= end:
            (kind, _u1, ehsize, psize, csize, _u2, _minor, _major, arch, name_off, name_len, flags, _z,
             usize) = struct.unpack_from("<HHIQIIHHIIIQQQ", data, e)
            if ehsize < 64 or e + ehsize + psize > end:
                raise ValueError(f"malformed fatbin entry at {e:#x}")
            name = ""
            if name_off and name_len and name_off + name_len <= ehsize:
                name = data[e + name_off:e + name_off + name_len].split(b"\0")[0].decode("utf-8", "replace")
            variant = "a" if flags & FLAG_ARCH_SPECIFIC else "f" if flags & FLAG_FAMILY else ""
            cont.entries.append(FatbinEntry(kind, arch, variant, flags, name,
                                            data[e + ehsize:e + ehsize + psize], usize, csize))
            e += ehsize + psize
        containers.append(cont)
        pos = end
    return containers


def parse_target(spec: str) -> tuple[int, int, str]:
    """'90a' -> (ELF, 90, 'a'); 'compute_90' -> (PTX, 90, ''); 'sm_100f' -> (ELF, 100, 'f')."""
    m = re.fullmatch(r"(compute_|sm_)?(\d+)([af]?)", spec.strip())
    if not m:
        raise ValueError(f"not a GPU target: {spec!r}")
    return (KIND_PTX if m.group(1) == "compute_" else KIND_ELF, int(m.group(2)), m.group(3))


def target_name(t: tuple[int, int, str]) -> str:
    return f"{'compute_' if t[0] == KIND_PTX else 'sm_'}{t[1]}{t[2]}"


def decompress(entry: FatbinEntry) -> bytes | None:
    """The payload, uncompressed; None where it cannot be (LZ4, or zstd without a decoder)."""
    out = _decompress(entry)
    if out is not None and entry.compression and entry.uncompressed_size and len(out) != entry.uncompressed_size:
        return None
    return out


def _decompress(entry: FatbinEntry) -> bytes | None:
    if entry.compression is None:
        return entry.payload
    if entry.compression == "zstd":
        n = entry.compressed_size
        frame = entry.payload[:n] if 0 < n <= len(entry.payload) else entry.payload.rstrip(b"\0")
        try:
            import zstandard  # type: ignore

            return zstandard.ZstdDecompressor().decompress(frame, max_output_size=entry.uncompressed_size or 1 << 31)
        except ImportError:
            pass
        try:
            from compression import zstd  # type: ignore  # Python >= 3.14

            return zstd.decompress(frame)
        except ImportError:
            pass
        if shutil.which("zstd"):
            r = subprocess.run(["zstd", "-d", "-c", "-q"], input=frame, capture_output=True)
            if r.returncode == 0:
                return r.stdout
    return None


# ---------------------------------------------------------------------------------------------------------
# Tools

def find_tool(name: str) -> str | None:
    """A CUDA binary tool: $NAME (upper case), PATH, $CUDA_HOME/bin, /usr/local/cuda/bin, or a PyPI package
    (nvidia-cuda-cuobjdump / nvidia-cuda-nvdisasm install nvidia/cu13/bin/NAME; CUDA 12's nvidia/cuda_NAME/bin)."""
    env = os.environ.get(name.upper())
    if env and os.access(env, os.X_OK):
        return env
    found = shutil.which(name)
    if found:
        return found
    dirs = [os.path.join(os.environ[v], "bin") for v in ("CUDA_HOME", "CUDA_PATH") if os.environ.get(v)]
    dirs.append("/usr/local/cuda/bin")
    for entry in sys.path:
        if entry and os.path.isdir(os.path.join(entry, "nvidia")):
            dirs += sorted(glob.glob(os.path.join(entry, "nvidia", "cu*", "bin")), reverse=True)
            dirs += glob.glob(os.path.join(entry, "nvidia", f"cuda_{name}", "bin"))
    for d in dirs:
        cand = os.path.join(d, name)
        if os.path.isfile(cand) and os.access(cand, os.X_OK):
            return cand
    return None


def demangle(names: list[str]) -> dict[str, str]:
    tool = shutil.which("c++filt")
    if not tool or not names:
        return {n: n for n in names}
    r = subprocess.run([tool], input="\n".join(names) + "\n", capture_output=True, text=True)
    out = r.stdout.splitlines()
    if r.returncode != 0 or len(out) != len(names):
        return {n: n for n in names}
    return dict(zip(names, out))


# ---------------------------------------------------------------------------------------------------------
# The checks

STABLE_SHIM = re.compile(r"^(?:aoti_torch_|torch_)")
UNSTABLE_NS = re.compile(r"\b(?:at|c10|torch|caffe2)::")
UNSTABLE_MANGLED = re.compile(r"(?:^_Z|N|[0-9])(?:K)?(?:3c10|2at|5torch|6caffe2)(?=[0-9A-Z_])")


CXX_RUNTIME = ("std::", "__gnu_cxx::", "__cxxabiv1::", "operator new", "operator delete", "typeinfo for std::",
               "typeinfo name for std::", "vtable for std::", "VTT for std::", "vtable for __cxxabiv1::",
               "typeinfo for __cxxabiv1::", "__cxa_", "__gxx_", "_Unwind_")


def is_cxx_runtime(demangled: str) -> bool:
    """The C++ standard library / runtime (libstdc++, libgcc_s), which torch's libraries re-export too."""
    return demangled.startswith(CXX_RUNTIME)


def is_unstable_torch_symbol(mangled: str, demangled: str) -> bool:
    """A C++ symbol of libtorch's unstable surface (c10::, at::, torch:: other than torch::stable /
    torch::headeronly, which are header-only)."""
    if demangled != mangled or not mangled.startswith("_Z"):
        cleaned = demangled.replace("torch::headeronly", "").replace("torch::stable", "")
        return bool(UNSTABLE_NS.search(cleaned))
    return bool(UNSTABLE_MANGLED.search(mangled))  # no c++filt: look at the mangled name


class Report:
    def __init__(self) -> None:
        self.failed = False

    def line(self, status: str, check: str, msg: str) -> None:
        if status == "FAIL":
            self.failed = True
        print(f"{status:4s} {check}: {msg}", flush=True)


def wheel_tags(filename: str) -> tuple[set[str], set[str], set[str]]:
    stem = filename[:-4] if filename.endswith(".whl") else filename
    parts = stem.split("-")
    if len(parts) not in (5, 6):
        raise ValueError(f"{filename}: not a wheel file name")
    py, abi, plat = parts[-3:]
    return set(py.split(".")), set(abi.split(".")), set(plat.split("."))


def check_tag(rep: Report, wheel: Path, zf: zipfile.ZipFile, so_machine: int | None) -> None:
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
    want = {EM_X86_64: "x86_64", EM_AARCH64: "aarch64"}.get(so_machine)
    if want and arches != {want}:
        problems.append(f"platform {'.'.join(sorted(arches))} but the library is {want}")
    wheel_file = next((n for n in zf.namelist() if re.fullmatch(r"[^/]+\.dist-info/WHEEL", n)), None)
    if wheel_file is None:
        problems.append("no .dist-info/WHEEL")
    else:
        meta = zf.read(wheel_file).decode()
        tags = set(re.findall(r"^Tag:\s*(\S+)", meta, re.M))
        expect = {f"{a}-{b}-{c}" for a in py for b in abi for c in plat}
        if tags != expect:
            problems.append(f"WHEEL says Tag {sorted(tags)}, the file name {sorted(expect)}")
        if re.search(r"^Root-Is-Purelib:\s*true", meta, re.M | re.I):
            problems.append("WHEEL says Root-Is-Purelib: true")
    tag = "-".join(".".join(sorted(t)) for t in (py, abi, plat))
    if problems:
        rep.line("FAIL", "tag", f"{tag}: " + "; ".join(problems))
    else:
        rep.line("PASS", "tag", tag)


def check_gpu_code(rep: Report, containers: list[FatbinContainer], targets: list[tuple[int, int, str]]) -> None:
    if not containers:
        rep.line("FAIL", "gpu-code", "no .nv_fatbin in the extension library: no GPU code at all")
        return
    problems = []
    summary = []
    for c in containers:
        have = {(e.kind, e.arch, e.variant) for e in c.entries}
        tu = os.path.basename(c.name)
        listing = ", ".join(sorted(e.target + (f"[{e.compression}]" if e.compression else "") for e in c.entries))
        summary.append(f"{tu}: {listing}")
        missing = [target_name(t) for t in targets if t not in have]
        if missing:
            problems.append(f"{tu} lacks {', '.join(missing)}")
        for e in c.entries:
            if e.kind == KIND_ELF and e.compression is None and (
                    e.payload[:4] != b"\x7fELF" or struct.unpack_from("<H", e.payload, 18)[0] != EM_CUDA):
                problems.append(f"{tu}: the {e.target} entry is not a CUDA ELF")
    want = " ".join(target_name(t) for t in targets)
    if problems:
        rep.line("FAIL", "gpu-code", f"want {want} in every translation unit: " + "; ".join(problems)
                 + " | found " + " | ".join(summary))
    else:
        rep.line("PASS", "gpu-code", f"{want} in all {len(containers)} translation units ("
                 + " | ".join(summary) + ")")


FP4_SASS = re.compile(r"F2FP\.SATFINITE\.E2M1\S*")


def check_fp4_sass(rep: Report, so: Path, containers: list[FatbinContainer], require: bool) -> None:
    blackwell = sorted({(e.arch, e.variant) for c in containers for e in c.entries
                        if e.kind == KIND_ELF and e.arch >= 100})
    if not blackwell:
        rep.line("FAIL" if require else "SKIP", "fp4-sass", "no Blackwell (sm_100+) cubins to disassemble")
        return
    cuobjdump, nvdisasm = find_tool("cuobjdump"), find_tool("nvdisasm")
    how = ""
    counts: dict[str, dict[str, int]] = {}
    if cuobjdump and nvdisasm:
        env = dict(os.environ, PATH=os.path.dirname(nvdisasm) + os.pathsep + os.environ.get("PATH", ""))
        how = f"cuobjdump -sass ({cuobjdump})"
        for arch, variant in blackwell:
            sm = f"sm_{arch}{variant}"
            r = subprocess.run([cuobjdump, "-sass", "-arch", sm, str(so)], capture_output=True, text=True, env=env)
            if r.returncode != 0:
                rep.line("FAIL", "fp4-sass", f"{cuobjdump} -sass -arch {sm} failed: {r.stderr.strip()[:300]}")
                return
            per_tu = counts.setdefault(sm, {})
            for block in r.stdout.split("Fatbin elf code:")[1:]:
                m = re.search(r"^identifier = (.*)$", block, re.M)
                tu = os.path.basename(m.group(1).strip()) if m else "?"
                if "Function :" not in block:
                    rep.line("FAIL", "fp4-sass", f"{cuobjdump} printed no SASS for {sm} {tu} (nvdisasm broken?)")
                    return
                per_tu[tu] = per_tu.get(tu, 0) + len(FP4_SASS.findall(block))
    elif nvdisasm:
        how = f"nvdisasm ({nvdisasm})"
        with tempfile.TemporaryDirectory() as tmp:
            for c in containers:
                for e in c.entries:
                    if e.kind != KIND_ELF or e.arch < 100:
                        continue
                    cubin = decompress(e)
                    if cubin is None:
                        rep.line("FAIL" if require else "SKIP", "fp4-sass",
                                 f"the {e.target} cubin is {e.compression}-compressed and cannot be unpacked here "
                                 "(pip install zstandard, or install cuobjdump)")
                        return
                    path = os.path.join(tmp, "x.cubin")
                    Path(path).write_bytes(cubin)
                    r = subprocess.run([nvdisasm, path], capture_output=True, text=True)
                    if r.returncode != 0:
                        rep.line("FAIL", "fp4-sass", f"nvdisasm failed on {e.target}: {r.stderr.strip()[:300]}")
                        return
                    tu = os.path.basename(c.name)
                    per_tu = counts.setdefault(e.target, {})
                    per_tu[tu] = per_tu.get(tu, 0) + len(FP4_SASS.findall(r.stdout))
    else:
        rep.line("FAIL" if require else "SKIP", "fp4-sass",
                 "no cuobjdump/nvdisasm (CUDA toolkit, or pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm)")
        return
    missing = [sm for sm, per_tu in counts.items() if sum(per_tu.values()) == 0]
    missing += [f"sm_{a}{v}" for a, v in blackwell if f"sm_{a}{v}" not in counts]
    detail = "; ".join(f"{sm}: " + ", ".join(f"{tu} {n}" for tu, n in sorted(per_tu.items()))
                       for sm, per_tu in sorted(counts.items()))
    if missing:
        rep.line("FAIL", "fp4-sass", f"no F2FP.SATFINITE.E2M1 in {', '.join(sorted(set(missing)))} [{detail}] via {how}")
    else:
        rep.line("PASS", "fp4-sass", f"F2FP.SATFINITE.E2M1 instructions per cubin: {detail} (via {how})")


def torch_lib_dir() -> Path | None:
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return None
    lib = Path(list(spec.submodule_search_locations)[0]) / "lib"
    return lib if lib.is_dir() else None


def check_stable_abi(rep: Report, so: Path) -> None:
    with Elf(so) as elf:
        syms = elf.dynamic_symbols()
        needed = elf.needed()
    undefined = [(n, weak, ver) for n, undef, weak, ver in syms if undef]
    names = [n for n, _, _ in undefined]
    dm = demangle([n for n in names if n.startswith("_Z")])
    problems = []
    unstable = [dm.get(n, n) for n in names if is_unstable_torch_symbol(n, dm.get(n, n))]
    if unstable:
        problems.append(f"{len(unstable)} C++ libtorch symbols: " + ", ".join(unstable[:8])
                        + (" ..." if len(unstable) > 8 else ""))
    bad_needed = [n for n in needed if n.startswith(("libtorch_python", "libpython"))]
    if bad_needed:
        problems.append("needs " + ", ".join(bad_needed) + " (ties the wheel to one Python/torch build)")
    shim = [n for n in names if STABLE_SHIM.match(n)]
    resolved = ""
    lib = torch_lib_dir()
    if lib is not None:
        torch_defined: set[str] = set()
        libs = sorted(p for p in lib.iterdir() if re.match(r"lib(torch|c10)[^/]*\.so", p.name))
        for p in libs:
            try:
                with Elf(p) as t:
                    torch_defined.update(n for n, undef, _w, _v in t.dynamic_symbols() if not undef)
            except (OSError, ValueError):
                continue
        from_torch = [n for n in names if n in torch_defined]
        runtime = [n for n in from_torch if is_cxx_runtime(dm.get(n, n))]
        outside = [dm.get(n, n) for n in from_torch if not STABLE_SHIM.match(n) and n not in runtime]
        if outside:
            problems.append(f"{len(outside)} symbols resolved in torch's libraries are not C shim symbols: "
                            + ", ".join(outside[:8]) + (" ..." if len(outside) > 8 else ""))
        missing = [n for n in shim if n not in torch_defined]
        resolved = (f"; {len(from_torch) - len(runtime)} resolve in the installed torch's {len(libs)} libraries "
                    f"({lib.parent}), all C shim")
        if runtime:
            resolved += f" (and {len(runtime)} C++ standard library symbols that torch re-exports, not counted)"
        if missing:
            resolved += f"; {len(missing)} shim symbols not in this torch (older than the build?): {', '.join(missing[:5])}"
    else:
        resolved = "; torch not installed here, symbols not resolved against its libraries"
    torch_needed = [n for n in needed if n.startswith(("libtorch", "libc10"))]
    msg = (f"{len(undefined)} undefined symbols, {len(shim)} from torch's stable C shim (aoti_torch_*/torch_*), "
           f"{len(unstable)} C++ c10::/at::/torch::{resolved}; torch libraries needed: {', '.join(torch_needed) or 'none'}")
    if problems:
        rep.line("FAIL", "stable-abi", "; ".join(problems) + f" | {msg}")
    elif not shim:
        rep.line("FAIL", "stable-abi", f"no aoti_torch_*/torch_* symbols: this is not a stable-ABI torch library | {msg}")
    else:
        rep.line("PASS", "stable-abi", msg)


def check_abi_audit(rep: Report, so: Path) -> None:
    try:
        from torch_abi_audit import inspect_extension  # type: ignore
    except ImportError:
        rep.line("SKIP", "abi-audit", "torch-abi-audit not installed (pip install torch-abi-audit; Python >= 3.11)")
        return
    r = inspect_extension(so)
    if r.error:
        rep.line("FAIL", "abi-audit", f"torch-abi-audit: {r.error}")
    elif not r.torch.stable or r.torch.unstable_symbols:
        rep.line("FAIL", "abi-audit", f"torch-abi-audit: unstable symbols {list(r.torch.unstable_symbols)[:8]}")
    else:
        rep.line("PASS", "abi-audit", f"torch-abi-audit: STABLE, {r.torch.stable_shim_count} shim symbols, "
                 f"min torch {r.torch.min_torch_version}")


def check_release(rep: Report, wheel_name: str, build: dict | None, so: Path | None) -> None:
    """FAIL for the Blackwell emulation build (software E2M1 on sm_90a), which is never to be published."""
    problems = []
    if build is not None and build.get("BLACKWELL_EMULATION"):
        problems.append("_build_info.py says BLACKWELL_EMULATION = True")
    if so is not None and EMULATION_MARKER in so.read_bytes():
        problems.append(f"{so.name} holds the emulation marker {EMULATION_MARKER.decode()!r}")
    parts = wheel_name[:-4].split("-") if wheel_name.endswith(".whl") else []
    if len(parts) == 6 and "emulation" in parts[2]:
        problems.append(f"the file name's build tag is {parts[2]!r}")
    if problems:
        rep.line("FAIL", "release", "a Blackwell emulation build (QWEN_FP4_EMULATE_BLACKWELL=1), never to be "
                 "published: " + "; ".join(problems))
    else:
        rep.line("PASS", "release", "not an emulation build (build info, library, file name)")


def check_licences(rep: Report, zf: zipfile.ZipFile, has_blackwell: bool) -> None:
    names = zf.namelist()
    problems, found = [], []
    ours = [n for n in names if re.fullmatch(r"[^/]+\.dist-info/(?:licenses/)?LICENSE(?:\.txt)?", n)]
    if not ours:
        problems.append("no LICENSE in the .dist-info")
    else:
        text = zf.read(ours[0]).decode("utf-8", "replace")
        if "Apache License" in text and "Version 2.0" in text:
            found.append(ours[0])
        else:
            problems.append(f"{ours[0]} is not the Apache-2.0 licence")
    extra = [n for n in names if re.fullmatch(r"[^/]+\.dist-info/licenses/.+", n) and n not in ours]
    if has_blackwell:
        if FLASHINFER_LICENCE not in names:
            problems.append(f"Blackwell code (FlashInfer headers) compiled in but no {FLASHINFER_LICENCE}")
        elif "Apache License" not in zf.read(FLASHINFER_LICENCE).decode("utf-8", "replace"):
            problems.append(f"{FLASHINFER_LICENCE} is not FlashInfer's Apache-2.0 licence")
        else:
            found.append(FLASHINFER_LICENCE)
    if problems:
        rep.line("FAIL", "licences", "; ".join(problems))
    else:
        msg = ", ".join(found) + (f" (also {', '.join(extra)})" if extra else "")
        if not has_blackwell:
            msg += "; no Blackwell code, so no FlashInfer licence needed"
        rep.line("PASS", "licences", msg)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("wheel", type=Path)
    ap.add_argument("--require-sass", action="store_true",
                    help="fail (instead of skip) when no disassembler is available to check the Blackwell SASS")
    ap.add_argument("--targets", default=DEFAULT_TARGETS,
                    help=f"GPU targets that every translation unit must hold, ';'-separated (default {DEFAULT_TARGETS})")
    args = ap.parse_args(argv)
    targets = [parse_target(t) for t in args.targets.replace(",", ";").split(";") if t.strip()]

    rep = Report()
    if not args.wheel.is_file():
        rep.line("FAIL", "wheel", f"{args.wheel}: no such file")
        return 1
    with zipfile.ZipFile(args.wheel) as zf, tempfile.TemporaryDirectory() as tmp:
        libs = [n for n in zf.namelist() if re.fullmatch(rf"{PACKAGE}/_C[^/]*\.so", n)]
        so = None
        if len(libs) == 1:
            so = Path(zf.extract(libs[0], tmp))
        info = f"{PACKAGE}/_build_info.py"
        build = None
        if info in zf.namelist():
            build = {}
            exec(zf.read(info).decode(), build)  # our own generated constants
            print(f"info wheel {args.wheel.name}: built for {build.get('CUDA_ARCHS')} with torch "
                  f"{build.get('BUILD_TORCH')}, CUDA {build.get('BUILD_CUDA')}, FlashInfer {build.get('FLASHINFER')}")
        machine = None
        containers: list[FatbinContainer] = []
        if so is not None:
            try:
                with Elf(so) as elf:
                    machine = elf.machine
                    sec = elf.section(".nv_fatbin")
                    containers = parse_fatbin(elf.section_data(sec)) if sec else []
            except ValueError as exc:
                rep.line("FAIL", "extension", str(exc))
                so = None
        check_tag(rep, args.wheel, zf, machine)
        check_release(rep, args.wheel.name, build, so)
        if so is None:
            why = "none" if not libs else ", ".join(libs)
            rep.line("FAIL", "extension", f"want exactly one {PACKAGE}/_C*.so, found {why} (pure-Python build?)")
            for check in ("gpu-code", "fp4-sass", "stable-abi", "abi-audit"):
                rep.line("SKIP", check, "no extension library")
            check_licences(rep, zf, has_blackwell=False)
        else:
            if not so.name.endswith(".abi3.so"):
                rep.line("FAIL", "extension", f"{libs[0]} is not an abi3 module (want _C.abi3.so)")
            check_gpu_code(rep, containers, targets)
            check_fp4_sass(rep, so, containers, args.require_sass)
            check_stable_abi(rep, so)
            check_abi_audit(rep, so)
            has_blackwell = any(e.kind == KIND_ELF and e.arch >= 100 for c in containers for e in c.entries)
            check_licences(rep, zf, has_blackwell)
    print(f"{'FAILED' if rep.failed else 'OK'}: {args.wheel.name}")
    return 1 if rep.failed else 0


if __name__ == "__main__":
    sys.exit(main())
