"""scripts/check_wheel.py: its fat binary parser, tag and symbol rules (CPU only; the nvcc cross-check runs
where a CUDA toolkit is installed)."""

from __future__ import annotations

import importlib.util
import re
import shutil
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "check_wheel.py"
if not SCRIPT.is_file():
    pytest.skip(f"{SCRIPT} not present (tests copied without scripts/)", allow_module_level=True)

_spec = importlib.util.spec_from_file_location("check_wheel", SCRIPT)
cw = importlib.util.module_from_spec(_spec)
sys.modules["check_wheel"] = cw
_spec.loader.exec_module(cw)


def entry(kind: int, arch: int, flags: int, payload: bytes, name: bytes = b"", usize: int = 0, ext: bytes = b"",
          csize: int = 0) -> bytes:
    name_off = 64 if name else 0
    name_field = name + b"\0" * (-len(name) % 8) if name else b""
    hsize = 64 + len(name_field) + len(ext)
    ver = (0, 9) if kind == 1 else (8, 1)
    head = struct.pack("<HHIQIIHHIIIQQQ", kind, 0x101, hsize, len(payload), csize, 0, ver[0], ver[1], arch,
                       name_off, len(name), flags, 0, usize)
    return head + name_field + ext + payload


def container(*entries: bytes) -> bytes:
    body = b"".join(entries)
    return struct.pack("<IHHQ", 0xBA55ED50, 1, 16, len(body)) + body


def test_parse_synthetic_fatbin():
    cubin = b"\x7fELF" + bytes(14) + struct.pack("<H", cw.EM_CUDA) + bytes(8)
    tu = b"/src/csrc/launch_blackwell.cu"
    c1 = container(
        entry(2, 90, 0x100011, cubin, tu),
        entry(2, 100, 0x1200011, cubin, tu, ext=bytes(48)),
        entry(2, 120, 0x1200011, cubin, tu, ext=bytes(48)),
        entry(1, 90, 0x8011, b"\x28\xb5\x2f\xfd" + bytes(12), tu, usize=4096, ext=bytes(16)),
    )
    c2 = container(entry(2, 90, 0x11, cubin), entry(1, 100, 0x108011, b"x" * 8))
    data = bytes(24) + c1 + bytes(8) + c2 + bytes(16)  # padding around and between containers
    conts = cw.parse_fatbin(data)
    assert len(conts) == 2
    assert [e.target for e in conts[0].entries] == ["sm_90a", "sm_100f", "sm_120f", "compute_90"]
    assert conts[0].name == tu.decode()
    assert conts[0].entries[3].compression == "zstd" and conts[0].entries[3].uncompressed_size == 4096
    assert [e.target for e in conts[1].entries] == ["sm_90", "compute_100a"]
    assert conts[1].name.startswith("container@")


def _zstd_compress(data: bytes) -> bytes | None:
    try:
        import zstandard  # type: ignore

        return zstandard.ZstdCompressor().compress(data)
    except ImportError:
        pass
    if shutil.which("zstd"):
        return subprocess.run(["zstd", "-c", "-q"], input=data, capture_output=True, check=True).stdout
    return None


def test_decompress_padded_zstd_payload():
    """Compressed payloads are stored padded to 8 bytes; the entry header has the real length."""
    plain = b"\x7fELF" + bytes(range(256)) * 8
    frame = _zstd_compress(plain)
    if frame is None:
        pytest.skip("no zstd compressor (zstandard module or zstd command)")
    blob = container(entry(2, 100, 0x1208011, frame + bytes(-len(frame) % 8), usize=len(plain), csize=len(frame)))
    (e,) = cw.parse_fatbin(blob)[0].entries
    assert e.compression == "zstd" and e.compressed_size == len(frame)
    assert cw.decompress(e) == plain


def test_parse_target():
    assert cw.parse_target("90a") == (cw.KIND_ELF, 90, "a")
    assert cw.parse_target("sm_100f") == (cw.KIND_ELF, 100, "f")
    assert cw.parse_target("compute_90") == (cw.KIND_PTX, 90, "")
    assert cw.target_name(cw.parse_target("120f")) == "sm_120f"
    with pytest.raises(ValueError):
        cw.parse_target("hopper")


def test_wheel_tags():
    py, abi, plat = cw.wheel_tags("qwen_resnorm_fp4-0.1.0-cp310-abi3-manylinux_2_28_x86_64.whl")
    assert (py, abi, plat) == ({"cp310"}, {"abi3"}, {"manylinux_2_28_x86_64"})
    assert cw.wheel_tags("x-1-2-py3-none-any.whl")[2] == {"any"}


@pytest.mark.parametrize("mangled,demangled,unstable", [
    ("_ZN3c1015SmallVectorBaseIjE8grow_podEPKvmm", "c10::SmallVectorBase<unsigned int>::grow_pod(void const*, unsigned long, unsigned long)", True),
    ("_ZNK2at10TensorBase4sizeEl", "at::TensorBase::size(long) const", True),
    ("_ZN5torch8autograd12VariableInfoC1Ev", "torch::autograd::VariableInfo::VariableInfo()", True),
    ("_ZN5torch6stable6TensorD1Ev", "torch::stable::Tensor::~Tensor()", False),
    ("_ZNSt6localeD1Ev", "std::locale::~locale()", False),
    ("aoti_torch_get_numel", "aoti_torch_get_numel", False),
])
def test_unstable_symbols(mangled, demangled, unstable):
    assert cw.is_unstable_torch_symbol(mangled, demangled) is unstable
    # without c++filt only the mangled name is seen
    if mangled.startswith("_Z") and "stable" not in demangled:
        assert cw.is_unstable_torch_symbol(mangled, mangled) is unstable


def test_pure_python_wheel_fails(tmp_path, capsys):
    whl = tmp_path / "qwen_resnorm_fp4-0.1.0-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w") as zf:
        zf.writestr("qwen_resnorm_fp4/__init__.py", "")
        zf.writestr("qwen_resnorm_fp4-0.1.0.dist-info/WHEEL", "Root-Is-Purelib: true\nTag: py3-none-any\n")
        zf.writestr("qwen_resnorm_fp4-0.1.0.dist-info/licenses/LICENSE", "Apache License\nVersion 2.0\n")
    assert cw.main([str(whl)]) == 1
    out = capsys.readouterr().out
    assert re.search(r"^FAIL tag: ", out, re.M)
    assert re.search(r"^FAIL extension: ", out, re.M)
    assert re.search(r"^PASS licences: ", out, re.M)


def test_emulation_build_is_refused_as_a_release(tmp_path, capsys):
    """Each sign of the Blackwell emulation build fails the release check: build info, the library's
    marker string (csrc/launch_blackwell.cu), the file name's build tag; a clean wheel passes it."""
    marker = (Path(__file__).resolve().parents[1] / "csrc" / "launch_blackwell.cu").read_text()
    assert cw.EMULATION_MARKER.decode() in marker
    clean_so, marked_so = tmp_path / "clean.so", tmp_path / "marked.so"
    clean_so.write_bytes(b"\x7fELF" + bytes(100))
    marked_so.write_bytes(b"\x7fELF" + bytes(50) + cw.EMULATION_MARKER + b": software E2M1\0" + bytes(50))
    name = "qwen_resnorm_fp4-0.1.0-cp310-abi3-linux_x86_64.whl"
    tagged = "qwen_resnorm_fp4-0.1.0-0blackwellemulation-cp310-abi3-linux_x86_64.whl"
    cases = [(name, {"BLACKWELL_EMULATION": False}, clean_so, "PASS"),
             (name, None, clean_so, "PASS"),
             (name, {"BLACKWELL_EMULATION": True}, clean_so, "FAIL"),
             (name, {"BLACKWELL_EMULATION": False}, marked_so, "FAIL"),
             (tagged, {"BLACKWELL_EMULATION": False}, clean_so, "FAIL")]
    for wheel_name, build, so, want in cases:
        rep = cw.Report()
        cw.check_release(rep, wheel_name, build, so)
        out = capsys.readouterr().out
        assert out.startswith(f"{want} release: "), (wheel_name, build, so.name, out)
        assert rep.failed == (want == "FAIL")


def _nvcc() -> str | None:
    return cw.find_tool("nvcc")


@pytest.mark.skipif(_nvcc() is None, reason="no CUDA toolkit (nvcc)")
def test_parser_against_nvcc(tmp_path):
    """Build a tiny kernel for known targets; the parser must list exactly those (and agree with cuobjdump)."""
    src = tmp_path / "k.cu"
    src.write_text("__global__ void k(float* x) { x[threadIdx.x] *= 2.f; }\n")
    obj = tmp_path / "k.o"
    gencode = ["-gencode=arch=compute_90a,code=sm_90a", "-gencode=arch=compute_100f,code=sm_100f",
               "-gencode=arch=compute_120f,code=sm_120f", "-gencode=arch=compute_90,code=compute_90"]
    subprocess.run([_nvcc(), "-c", "-Xcompiler", "-fPIC", *gencode, str(src), "-o", str(obj)], check=True)
    with cw.Elf(obj) as elf:
        conts = cw.parse_fatbin(elf.section_data(elf.section(".nv_fatbin")))
    targets = [e.target for c in conts for e in c.entries]
    assert sorted(targets) == ["compute_90", "sm_100f", "sm_120f", "sm_90a"]
    cuobjdump, nvdisasm = cw.find_tool("cuobjdump"), cw.find_tool("nvdisasm")
    if cuobjdump and nvdisasm:
        env = {"PATH": str(Path(nvdisasm).parent) + ":/usr/bin:/bin"}
        out = subprocess.run([cuobjdump, "-sass", str(obj)], capture_output=True, text=True, check=True, env=env).stdout
        elf_archs = [re.search(r"^arch = (\S+)", b, re.M).group(1) for b in out.split("Fatbin elf code:")[1:]]
        ptx_archs = [re.search(r"^arch = (\S+)", b, re.M).group(1) for b in out.split("Fatbin ptx code:")[1:]]
        assert sorted(elf_archs) == ["sm_100f", "sm_120f", "sm_90a"]
        assert ptx_archs == ["sm_90"]


def test_elf_reader_on_this_python():
    """The dynamic-symbol reader on a real ELF file: the running interpreter (not whatever ``python3`` on
    PATH is: under pyenv that is a shell script, and the test skipped)."""
    exe = Path(sys.executable).resolve()
    with open(exe, "rb") as f:
        if f.read(4) != b"\x7fELF":
            pytest.skip("not an ELF interpreter")
    with cw.Elf(exe) as elf:
        syms = elf.dynamic_symbols()
        needed = elf.needed()
    assert any(n.startswith("libc.so") for n in needed)
    undef = {n: v for n, u, _w, v in syms if u}
    assert any(v and "GLIBC_" in v for v in undef.values())
