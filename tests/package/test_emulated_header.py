"""The emulation build's copy of FlashInfer's quantization_utils.cuh (tools/emulated_flashinfer_header.py),
regenerated here from the installed FlashInfer header (CPU only): the unified diff against the original holds
only guard lines that admit sm_90 and asm blocks with a Blackwell-only instruction replaced by one call of their
namesake in csrc/blackwell_emulation.cuh, in exactly the expected functions and numbers. A FlashInfer whose header
differs fails here, and the emulation build refuses it."""

from __future__ import annotations

import difflib
import importlib.util
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from helpers.paths import REPO_ROOT
from helpers.session import HANG_GUARD_S

ROOT = REPO_ROOT
TOOL = ROOT / "tools" / "emulated_flashinfer_header.py"
if not TOOL.is_file():
    pytest.skip(f"{TOOL} not present (tests copied without tools/)", allow_module_level=True)

_spec = importlib.util.spec_from_file_location("emulated_flashinfer_header", TOOL)
gen = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = gen
_spec.loader.exec_module(gen)

#: The functions that change and what changes in each (written out here, not taken from the tool).
EXPECTED = Counter({
    ("fp32_vec_to_e2m1(float (&array)[8])", "guard"): 1, ("fp32_vec_to_e2m1(float (&array)[8])", "asm"): 1,
    ("fp32_vec_to_e2m1(float2 (&array)[4])", "guard"): 1, ("fp32_vec_to_e2m1(float2 (&array)[4])", "asm"): 1,
    ("fp32_vec_to_e2m1(float2 (&array)[8])", "guard"): 1, ("fp32_vec_to_e2m1(float2 (&array)[8])", "asm"): 1,
    ("e2m1x2_byte_to_float2(uint32_t byteVal)", "guard"): 1, ("e2m1x2_byte_to_float2(uint32_t byteVal)", "asm"): 1,
    ("e2m1x2_byte_scaled_e4m3_to_float2(uint32_t byteVal,", "guard"): 1,
    ("e2m1x2_byte_scaled_e4m3_to_float2(uint32_t byteVal,", "asm"): 1,
    ("cvt_warp_fp16_to_fp4(", "guard"): 1,
})
ORIGINAL_GUARD = "#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 1000)"
SM90_GUARD = re.compile(r"#if defined\(__CUDA_ARCH__\) && \(__CUDA_ARCH__ >= 900\)(\s*//.*)?")
CALL = re.compile(r"\s+(?:val|result) = qwen_fp4_emulation::(\w+)\([\w, ]*\);")
FUNCTION_LINE = re.compile(r"^(?!template\b|namespace\b|struct\b|using\b|#|//)\S.*?\b(\w+\(.*)$")


def installed_header() -> Path:
    spec = importlib.util.find_spec("flashinfer")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("flashinfer-python is not installed (its headers are what the emulation copies)")
    path = (Path(list(spec.submodule_search_locations)[0]) / "data" / "csrc" / "nv_internal" / "tensorrt_llm" /
            "kernels" / "quantization_utils.cuh")
    if not path.is_file():
        pytest.skip(f"flashinfer-python has no {path}")
    return path


def enclosing_function(lines: list[str], index: int) -> str:
    """The definition line (from the name on) of the function that line `index` of the original lies in."""
    for i in range(index, -1, -1):
        m = FUNCTION_LINE.match(lines[i])
        if m:
            return m.group(1).removesuffix(" {").strip()
    raise AssertionError(f"no function above line {index + 1}")


def classify_hunk(removed: list[str], added: list[str]) -> list[tuple[str, str | None]]:
    """The substitutions one diff hunk makes: ("guard", None) and ("asm", name of the emulation called); an
    assertion error for anything else."""
    out = []
    if removed and removed[0] == ORIGINAL_GUARD:
        assert added and SM90_GUARD.fullmatch(added[0]), f"guard replaced by {added[:1]}"
        out.append(("guard", None))
        removed, added = removed[1:], added[1:]
    if removed or added:
        assert removed and removed[0].strip() == "asm volatile(", f"a change that is not an asm block: {removed[:2]}"
        assert removed[-1].rstrip().endswith(");"), f"the asm block does not end the hunk: {removed[-1]!r}"
        block = "\n".join(removed)
        assert "cvt.rn.satfinite.e2m1x2.f32" in block or "cvt.rn.f16x2.e2m1x2" in block, \
            "an asm block without a Blackwell-only instruction was replaced"
        assert len(added) == 1, f"an asm block must become one call, got {added}"
        m = CALL.fullmatch(added[0])
        assert m, f"not an emulation call: {added[0]!r}"
        out.append(("asm", m.group(1)))
    return out


def substitutions(original: str, emulated: str) -> Counter:
    """(function, kind) of every change of the copy, by the unified diff without context."""
    lines = original.splitlines()
    found: Counter = Counter()
    hunk = re.compile(r"@@ -(\d+)(?:,(\d+))? \+\d+(?:,\d+)? @@")
    diff = list(difflib.unified_diff(lines, emulated.splitlines(), n=0, lineterm=""))[2:]
    i = 0
    while i < len(diff):
        m = hunk.match(diff[i])
        assert m, diff[i]
        start = int(m.group(1)) - 1
        i += 1
        removed, added = [], []
        while i < len(diff) and not diff[i].startswith("@@"):
            (removed if diff[i].startswith("-") else added).append(diff[i][1:])
            i += 1
        function = enclosing_function(lines, start)
        for kind, called in classify_hunk(removed, added):
            if called is not None:
                assert function.startswith(called + "("), f"{function}: calls the emulation of {called}"
            found[(function, kind)] += 1
    return found


def test_copy_changes_only_guards_and_blackwell_asm():
    original = installed_header().read_text()
    emulated, log = gen.emulated_header(original)
    found = substitutions(original, emulated)
    assert found == EXPECTED, f"unexpected substitutions: {found - EXPECTED}; missing: {EXPECTED - found}"
    assert sum(k == "guard" for (_, k) in found.elements()) == 6 == gen.EXPECTED_GUARDS
    assert sum(k == "asm" for (_, k) in found.elements()) == 5 == gen.EXPECTED_ASM_BLOCKS
    assert len(log) == 6
    # Nothing Blackwell-only is left in the emulated functions; the other functions keep their guard.
    assert emulated.count(ORIGINAL_GUARD) == original.count(ORIGINAL_GUARD) - 6
    assert emulated.count("asm volatile(") == original.count("asm volatile(") - 5


def test_unified_diff_is_what_the_build_prints(tmp_path):
    header = installed_header()
    diff = gen.write_emulated_header(header, tmp_path / "q.cuh")
    assert diff == gen.unified_diff(header.read_text(), (tmp_path / "q.cuh").read_text())
    assert diff.count("\n-#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 1000)\n") == 6


def test_another_header_is_refused():
    original = installed_header().read_text()
    with pytest.raises(gen.HeaderMismatch, match="SHA-256"):
        gen.emulated_header(original + "\n")
    # Past the pin, a header whose structure moved fails too.
    guard_gone = original.replace(ORIGINAL_GUARD + "\n  uint32_t val;", "  uint32_t val;", 1)
    with pytest.raises(gen.HeaderMismatch, match="guard|want 1"):
        gen.emulated_header(guard_gone, check_pin=False)
    marker = "  using ReturnType = std::conditional_t<CVT_ELTS_PER_THREAD == 16, uint64_t, uint32_t>;\n"
    assert original.count(marker) >= 1
    extra_asm = original.replace(marker,
                                 marker + '  asm volatile("cvt.rn.f16x2.e2m1x2 %0, %1;" : "=r"(x) : "h"(y));\n', 1)
    with pytest.raises(gen.HeaderMismatch, match="asm"):
        gen.emulated_header(extra_asm, check_pin=False)
    renamed = original.replace("e2m1x2_byte_to_float2(uint32_t byteVal) {", "e2m1x2_to_float2(uint32_t byteVal) {")
    with pytest.raises(gen.HeaderMismatch, match="signature"):
        gen.emulated_header(renamed, check_pin=False)


def test_emulation_build_refuses_blackwell_targets():
    from torch.utils.cpp_extension import CUDA_HOME

    if CUDA_HOME is None:
        pytest.skip("no CUDA toolkit: setup.py would install pure Python before looking at the targets")
    env = dict(os.environ, QWEN_FP4_EMULATE_BLACKWELL="1", QWEN_FP4_CUDA_ARCHS="90a;100f")
    env.pop("QWEN_FP4_NO_CUDA", None)
    proc = subprocess.run([sys.executable, "setup.py", "--name"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=HANG_GUARD_S)
    assert proc.returncode != 0
    assert "QWEN_FP4_CUDA_ARCHS=90a" in proc.stderr + proc.stdout
