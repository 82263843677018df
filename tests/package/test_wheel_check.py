"""scripts/check_wheel.py: its rules on synthetic inputs (CPU only), and on libraries built here with gcc / nvcc
where those and readelf / cuobjdump / nvdisasm / torch-abi-audit are installed (each test skips without them)."""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from helpers.paths import REPO_ROOT

ROOT = REPO_ROOT
SCRIPT = ROOT / "scripts" / "check_wheel.py"
if not SCRIPT.is_file():
    pytest.skip(f"{SCRIPT} not present (tests copied without scripts/)", allow_module_level=True)

_spec = importlib.util.spec_from_file_location("check_wheel", SCRIPT)
cw = importlib.util.module_from_spec(_spec)
sys.modules["check_wheel"] = cw
_spec.loader.exec_module(cw)

WHEEL_NAME = "qwen_resnorm_fp4-0.1.0-cp310-abi3-linux_x86_64.whl"
APACHE = "Apache License\nVersion 2.0\n"

# cuobjdump's listing of a library built with nvcc -lineinfo (the header lines it prints per fat binary entry)
LISTING = """
Fatbin elf code:
================
arch = sm_90a
code version = [1,8]
host = linux
compile_size = 64bit
identifier = /src/csrc/launch_blackwell.cu

Fatbin elf code:
================
arch = sm_100f
code version = [1,8]
host = linux
compile_size = 64bit
compressed
identifier = /src/csrc/launch_blackwell.cu

Fatbin ptx code:
================
arch = sm_90
code version = [9,0]
host = linux
compile_size = 64bit
compressed
identifier = /src/csrc/launch_blackwell.cu
ptxasOptions =  --generate-line-info

Fatbin elf code:
================
arch = sm_90
code version = [1,8]
host = linux
compile_size = 64bit
"""


def test_fatbin_blocks_reads_cuobjdump_listing():
    got = [(tu, target) for tu, target, _ in cw.fatbin_blocks(LISTING)]
    assert got == [("launch_blackwell.cu", "sm_90a"), ("launch_blackwell.cu", "sm_100f"),
                   ("launch_blackwell.cu", "compute_90"), ("(unnamed)", "sm_90")]
    assert cw.fatbin_blocks("") == []


def test_parse_target():
    assert cw.parse_target("90a") == "sm_90a"
    assert cw.parse_target("sm_100f") == "sm_100f"
    assert cw.parse_target("compute_90") == "compute_90"
    assert cw.is_blackwell("sm_120f") and not cw.is_blackwell("sm_90a") and not cw.is_blackwell("compute_100")
    with pytest.raises(ValueError):
        cw.parse_target("hopper")


def test_wheel_tags():
    assert cw.wheel_tags(WHEEL_NAME) == ({"cp310"}, {"abi3"}, {"linux_x86_64"})
    assert cw.wheel_tags("x-1-2-py3-none-any.whl")[2] == {"any"}
    with pytest.raises(ValueError):
        cw.wheel_tags("x-1.whl")


def test_select_libraries_accepts_the_testing_library_and_requires_C():
    main, testing = cw.MAIN_LIB, cw.TESTING_LIB
    assert cw.select_libraries([main, "qwen_resnorm_fp4/api.py"]) == ([main], [])
    assert cw.select_libraries([testing, main]) == ([main, testing], [])
    libs, problems = cw.select_libraries([testing])
    assert libs == [testing] and problems == [f"no {main}"]
    libs, problems = cw.select_libraries(["qwen_resnorm_fp4/_C.cpython-311-x86_64-linux-gnu.so"])
    assert libs == [] and "unexpected qwen_resnorm_fp4/_C.cpython-311-x86_64-linux-gnu.so" in problems[1]
    assert cw.select_libraries([main, "qwen_resnorm_fp4/libfoo.so.1"])[1][0].startswith("unexpected")
    assert cw.select_libraries(["qwen_resnorm_fp4/__init__.py"])[1] == [f"no {main} (pure-Python build?)"]


@pytest.mark.parametrize("name,runtime", [
    ("std::locale::~locale()", True),
    ("operator new(unsigned long)", True),
    ("typeinfo for std::exception", True),
    ("vtable for __cxxabiv1::__class_type_info", True),
    ("__cxa_begin_catch", True),
    ("c10::detail::torchCheckFail(char const*, char const*, unsigned int, char const*)", False),
    ("aoti_torch_get_numel", False),
])
def test_cxx_runtime(name, runtime):
    assert bool(cw.CXX_RUNTIME.match(name)) is runtime


def blocks(*entries: tuple[str, str]) -> list[tuple[str, str, str]]:
    return [(tu, target, "") for tu, target in entries]


def test_gpu_code_wants_every_target_in_every_translation_unit(capsys):
    targets = ["sm_90a", "sm_100f", "compute_90"]
    full = blocks(("a.cu", "sm_90a"), ("a.cu", "sm_100f"), ("a.cu", "compute_90"))
    cases = [({cw.MAIN_LIB: full}, "PASS"),
             ({cw.MAIN_LIB: full, cw.TESTING_LIB: []}, "PASS"),  # a CPU-only testing library
             ({cw.MAIN_LIB: full + blocks(("b.cu", "sm_90a"))}, "FAIL"),
             ({cw.MAIN_LIB: full, cw.TESTING_LIB: blocks(("t.cu", "sm_90a"))}, "FAIL"),
             ({cw.MAIN_LIB: []}, "FAIL")]
    for listings, want in cases:
        rep = cw.Report()
        cw.check_gpu_code(rep, listings, targets)
        out = capsys.readouterr().out
        assert out.startswith(f"{want} gpu-code: "), (listings, out)
        assert rep.failed == (want == "FAIL")
    cw.check_gpu_code(cw.Report(), {cw.MAIN_LIB: full + blocks(("b.cu", "sm_90a"))}, targets)
    assert "_C.abi3.so b.cu lacks sm_100f, compute_90" in capsys.readouterr().out


def test_pure_python_wheel_fails(tmp_path, capsys):
    whl = tmp_path / "qwen_resnorm_fp4-0.1.0-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w") as zf:
        zf.writestr("qwen_resnorm_fp4/__init__.py", "")
        zf.writestr("qwen_resnorm_fp4-0.1.0.dist-info/WHEEL", "Root-Is-Purelib: true\nTag: py3-none-any\n")
        zf.writestr("qwen_resnorm_fp4-0.1.0.dist-info/licenses/LICENSE", APACHE)
    assert cw.main([str(whl)]) == 1
    out = capsys.readouterr().out
    assert re.search(r"^FAIL tag: ", out, re.M)
    assert re.search(r"^FAIL extension: no qwen_resnorm_fp4/_C.abi3.so \(pure-Python build\?\)", out, re.M)
    assert re.search(r"^SKIP stable-abi: ", out, re.M)
    assert re.search(r"^PASS licences: ", out, re.M)


def test_emulation_build_is_refused_as_a_release(tmp_path, capsys):
    """Each sign of the Blackwell emulation build fails the release check: build info, a library's marker
    string (csrc/launch_blackwell.cu), the file name's build tag; a clean wheel passes it."""
    assert cw.EMULATION_MARKER.decode() in (ROOT / "csrc" / "launch_blackwell.cu").read_text()
    clean_so, marked_so = tmp_path / "clean.so", tmp_path / "marked.so"
    clean_so.write_bytes(b"\x7fELF" + bytes(100))
    marked_so.write_bytes(b"\x7fELF" + bytes(50) + cw.EMULATION_MARKER + b": software E2M1\0" + bytes(50))
    tagged = WHEEL_NAME.replace("0.1.0-cp310", "0.1.0-0blackwellemulation-cp310")
    cases = [(WHEEL_NAME, {"BLACKWELL_EMULATION": False}, [clean_so], "PASS"),
             (WHEEL_NAME, None, [clean_so, clean_so], "PASS"),
             (WHEEL_NAME, {"BLACKWELL_EMULATION": True}, [clean_so], "FAIL"),
             (WHEEL_NAME, {"BLACKWELL_EMULATION": False}, [marked_so], "FAIL"),
             (WHEEL_NAME, {"BLACKWELL_EMULATION": False}, [clean_so, marked_so], "FAIL"),  # the testing library
             (tagged, {"BLACKWELL_EMULATION": False}, [clean_so], "FAIL")]
    for wheel_name, build, libs, want in cases:
        rep = cw.Report()
        cw.check_release(rep, wheel_name, build, libs)
        out = capsys.readouterr().out
        assert out.startswith(f"{want} release: "), (wheel_name, build, [so.name for so in libs], out)
        assert rep.failed == (want == "FAIL")


def test_version_tuple():
    assert cw.version_tuple("2.10") == (2, 10, 0)
    assert cw.version_tuple("2.10.0") == cw.version_tuple("2.10") < cw.version_tuple("2.11.0")


# --- on libraries built here ------------------------------------------------------------------------------

needs_gcc_readelf = pytest.mark.skipif(not (shutil.which("gcc") and shutil.which("readelf")),
                                       reason="no gcc or readelf (binutils)")


def c_library(tmp_path: Path, name: str, symbols: list[str], link: tuple[str, ...] = ()) -> Path:
    """A shared library that calls each symbol (a mangled name goes through an asm label)."""
    decl = "".join(f'void f{i}(void) __asm__("{s}");\n' for i, s in enumerate(symbols))
    calls = "".join(f"f{i}(); " for i in range(len(symbols)))
    src = tmp_path / f"{name}.c"
    src.write_text(f"{decl}void entry(void) {{ {calls}}}\n")
    out = tmp_path / f"{name}.so"
    subprocess.run(["gcc", "-shared", "-fPIC", str(src), "-o", str(out), *link], check=True)
    return out


def a_c10_function() -> str:
    """The mangled name of a function that the installed torch's libc10.so defines."""
    libc10 = next((p for p in cw.torch_libraries() if p.name == "libc10.so"), None)
    if libc10 is None:
        pytest.skip("torch (libc10.so) not installed")
    out = subprocess.run(["readelf", "-W", "--dyn-syms", str(libc10)], capture_output=True, text=True).stdout
    return next(f[7].split("@")[0] for line in out.splitlines() if len(f := line.split()) == 8
                and f[3] == "FUNC" and f[6] != "UND" and f[7].startswith("_ZN3c10"))


@needs_gcc_readelf
def test_stable_abi_on_built_libraries(tmp_path, capsys):
    """Only shim symbols: PASS; a c10:: function, no shim symbol at all, or libpython in DT_NEEDED: FAIL."""
    (tmp_path / "libpython3.so").write_bytes(c_library(tmp_path, "empty", []).read_bytes())
    good = c_library(tmp_path, "good", ["aoti_torch_get_numel"])
    cases = [([good], "PASS", None),
             ([good, c_library(tmp_path, "bad", ["aoti_torch_get_numel", a_c10_function()])], "FAIL",
              r"bad\.so: 1 symbols that torch's libraries define are not C shim symbols: c10::"),
             ([c_library(tmp_path, "noshim", ["strlen"])], "FAIL", r"noshim\.so imports no aoti_torch_\*"),
             ([c_library(tmp_path, "py", ["aoti_torch_get_numel"], ("-Wl,--no-as-needed", "-L", str(tmp_path),
                                                                    "-lpython3"))], "FAIL",
              r"py\.so needs libpython3\.so")]
    for libs, want, why in cases:
        rep = cw.Report()
        cw.check_stable_abi(rep, libs)
        out = capsys.readouterr().out
        assert out.startswith(f"{want} stable-abi: "), out
        assert why is None or re.search(why, out), out


@needs_gcc_readelf
def test_stable_abi_without_torch_is_skipped(tmp_path, capsys, monkeypatch):
    """Without torch to resolve against, the check says SKIP, and still fails on what it can see."""
    monkeypatch.setattr(cw, "torch_libraries", lambda: [])
    monkeypatch.setattr(cw, "torch_defined_symbols", lambda: None)
    cw.check_stable_abi(cw.Report(), [c_library(tmp_path, "good", ["aoti_torch_get_numel"])])
    assert capsys.readouterr().out.startswith("SKIP stable-abi: torch not installed")
    cw.check_stable_abi(cw.Report(), [c_library(tmp_path, "noshim", ["strlen"])])
    assert capsys.readouterr().out.startswith("FAIL stable-abi: noshim.so imports no aoti_torch_*")


@needs_gcc_readelf
def test_abi_audit_minimum_torch(tmp_path, capsys):
    """torch-abi-audit's verdict, and its minimum torch against the wheel's torch>= floor."""
    pytest.importorskip("torch_abi_audit")
    lib = c_library(tmp_path, "lib", ["aoti_torch_get_numel", "torch_library_impl"])  # torch_library_impl: 2.10
    for floor, want in (("2.10", "PASS"), ("2.11", "PASS"), ("2.9", "FAIL"), (None, "FAIL")):
        rep = cw.Report()
        cw.check_abi_audit(rep, [lib], floor)
        out = capsys.readouterr().out
        assert out.startswith(f"{want} abi-audit: "), (floor, out)
    cw.check_abi_audit(cw.Report(), [c_library(tmp_path, "bad", ["aoti_torch_get_numel", a_c10_function()])], "2.10")
    assert re.match(r"FAIL abi-audit: torch-abi-audit: bad\.so: unstable symbols \['c10::", capsys.readouterr().out)


def _nvcc() -> str | None:
    return cw.find_tool("nvcc")


needs_nvcc_cuobjdump = pytest.mark.skipif(not (_nvcc() and cw.find_tool("cuobjdump") and shutil.which("g++")),
                                          reason="no nvcc, cuobjdump or g++")


def cuda_library(tmp_path: Path, body: str, gencode: list[str]) -> Path:
    src, obj, out = tmp_path / "k.cu", tmp_path / "k.o", tmp_path / "k.so"
    src.write_text("#include <cuda_fp4.h>\n" + body)
    subprocess.run([_nvcc(), "-c", "-lineinfo", "-Xcompiler", "-fPIC", *gencode, str(src), "-o", str(obj)], check=True)
    subprocess.run(["g++", "-shared", str(obj), "-o", str(out)], check=True)
    return out


@needs_nvcc_cuobjdump
def test_fatbin_listing_against_nvcc(tmp_path):
    """A kernel built for known targets: the listing names exactly those, in its translation unit."""
    gencode = ["-gencode=arch=compute_90a,code=sm_90a", "-gencode=arch=compute_100f,code=sm_100f",
               "-gencode=arch=compute_120f,code=sm_120f", "-gencode=arch=compute_90,code=compute_90"]
    so = cuda_library(tmp_path, "__global__ void k(float* x) { x[threadIdx.x] *= 2.f; }\n", gencode)
    got = sorted((tu, target) for tu, target, _ in cw.cuobjdump(so))
    assert got == [("k.cu", "compute_90"), ("k.cu", "sm_100f"), ("k.cu", "sm_120f"), ("k.cu", "sm_90a")]


@needs_nvcc_cuobjdump
@pytest.mark.skipif(cw.find_tool("nvdisasm") is None, reason="no nvdisasm")
def test_fp4_sass_against_nvcc(tmp_path, capsys):
    """The hardware E2M1 conversion in an sm_100f cubin is found; a cubin without it fails the check."""
    gencode = ["-gencode=arch=compute_90a,code=sm_90a", "-gencode=arch=compute_100f,code=sm_100f"]
    convert = ("__global__ void k(const float* x, __nv_fp4_storage_t* o) {\n"
               "  o[threadIdx.x] = __nv_cvt_float_to_fp4(x[threadIdx.x], __NV_E2M1, cudaRoundNearest); }\n")
    for body, want in ((convert, r"PASS fp4-sass: .*sm_100f: k\.cu [1-9]"),
                       ("__global__ void k(float* x) { x[threadIdx.x] *= 2.f; }\n", r"FAIL fp4-sass: no F2FP")):
        so = cuda_library(tmp_path, body, gencode)
        rep = cw.Report()
        cw.check_fp4_sass(rep, so, cw.cuobjdump(so), require=True)
        assert re.match(want, capsys.readouterr().out)


INPLACE = ROOT / "qwen_resnorm_fp4" / "_C.abi3.so"


# In the exhaustive sweep: disassembling every target of the checkout's library takes most of a minute, and CI
# makes the same check (scripts/check_wheel.py --require-sass) on the release wheel itself.
@pytest.mark.exhaustive
@needs_gcc_readelf
@pytest.mark.skipif(not INPLACE.is_file() or cw.find_tool("cuobjdump") is None,
                    reason="no compiled qwen_resnorm_fp4/_C.abi3.so in the checkout, or no cuobjdump")
def test_whole_wheel_around_the_checkout_library(tmp_path, capsys):
    """A wheel holding the checkout's compiled library (checked for the targets it was built for) and a CPU-only
    testing library passes every check; asking for a target it lacks fails gpu-code."""
    if cw.elf_machine(INPLACE) != "x86_64":
        pytest.skip(f"the checkout's library is {cw.elf_machine(INPLACE)}; the test wheel's tag says x86_64")
    listing = cw.cuobjdump(INPLACE)
    targets = sorted({t for _, t, _ in listing})
    testing = c_library(tmp_path, "testing", ["aoti_torch_get_numel"])
    whl = tmp_path / WHEEL_NAME
    with zipfile.ZipFile(whl, "w") as zf:
        zf.write(INPLACE, cw.MAIN_LIB)
        zf.write(testing, cw.TESTING_LIB)
        zf.writestr("qwen_resnorm_fp4/_build_info.py", f"CUDA_ARCHS = {targets!r}\nBLACKWELL_EMULATION = False\n")
        zf.writestr("qwen_resnorm_fp4-0.1.0.dist-info/WHEEL", "Root-Is-Purelib: false\nTag: cp310-abi3-linux_x86_64\n")
        zf.writestr("qwen_resnorm_fp4-0.1.0.dist-info/METADATA", "Name: qwen-resnorm-fp4\nRequires-Dist: torch>=2.10\n")
        zf.writestr("qwen_resnorm_fp4-0.1.0.dist-info/licenses/LICENSE", APACHE)
        if any(cw.is_blackwell(t) for t in targets):
            zf.writestr(cw.FLASHINFER_LICENCE, APACHE)
    rc = cw.main([str(whl), "--targets", ";".join(targets)])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "PASS extension: qwen_resnorm_fp4/_C.abi3.so, qwen_resnorm_fp4/_C_testing.abi3.so" in out
    assert re.search(r"^PASS gpu-code: .*_C_testing\.abi3\.so: no GPU code", out, re.M)
    assert cw.main([str(whl), "--targets", ";".join(targets + ["sm_121f"])]) == 1
    assert re.search(r"^FAIL gpu-code: .* lacks sm_121f", capsys.readouterr().out, re.M)
