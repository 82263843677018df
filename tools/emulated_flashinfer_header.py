"""The emulation build's copy of FlashInfer's ``tensorrt_llm/kernels/quantization_utils.cuh`` (never shipped).

The Blackwell path (csrc/launch_blackwell.cu) converts with FlashInfer 0.7.4's ``cvt_warp_fp16_to_fp4``. Its
body, and those of the E2M1 helpers it calls, sit under ``#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 1000)``
and compile to ``return 0`` on sm_90. The copy written here differs from the original only inside the functions
of ``EMULATED_FUNCTIONS``: there the architecture guard also admits sm_90, and each ``asm`` block that holds a
Blackwell-only instruction becomes one call of its software equivalent in csrc/blackwell_emulation.cuh. Every
other byte is the original's. The header is pinned by its SHA-256 (FlashInfer 0.7.4's), so another FlashInfer
fails here instead of being emulated unseen.

    python tools/emulated_flashinfer_header.py ORIGINAL OUT   # writes OUT, prints the unified diff

setup.py calls ``write_emulated_header`` when QWEN_FP4_EMULATE_BLACKWELL=1; tests/package/test_emulated_header.py
checks the diff hunk by hunk.
"""

from __future__ import annotations

import difflib
import hashlib
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Tuple

#: SHA-256 of quantization_utils.cuh in flashinfer-python 0.7.4, the only header this emulates.
PINNED_SHA256 = "a2c4dbbed1309abfbcef4427648342d5f164225811d5a821a13aeab1bc817ef6"
PINNED_FLASHINFER = "0.7.4"

BLACKWELL_GUARD = "#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 1000)"
EMULATION_GUARD = "#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)  // qwen-fp4 Blackwell emulation"
#: PTX instructions that sm_90 lacks; an asm block is replaced exactly when it holds one of them.
BLACKWELL_ONLY_PTX = ("cvt.rn.satfinite.e2m1x2.f32", "cvt.rn.f16x2.e2m1x2")
EMULATION_NAMESPACE = "qwen_fp4_emulation"


@dataclass(frozen=True)
class EmulatedFunction:
    """One function of the header: the first line of its definition, and what its asm block becomes
    (None: the function has no asm block; only its guard changes)."""

    signature: str
    asm_replacement: str | None


#: The functions the emulation changes, by a name for messages.
EMULATED_FUNCTIONS: Dict[str, EmulatedFunction] = {
    "fp32_vec_to_e2m1(float[8])": EmulatedFunction(
        "inline __device__ uint32_t fp32_vec_to_e2m1(float (&array)[8]) {",
        f"val = {EMULATION_NAMESPACE}::fp32_vec_to_e2m1(array);"),
    "fp32_vec_to_e2m1(float2[4])": EmulatedFunction(
        "inline __device__ uint32_t fp32_vec_to_e2m1(float2 (&array)[4]) {",
        f"val = {EMULATION_NAMESPACE}::fp32_vec_to_e2m1(array);"),
    "fp32_vec_to_e2m1(float2[8])": EmulatedFunction(
        "inline __device__ uint64_t fp32_vec_to_e2m1(float2 (&array)[8]) {",
        f"val = {EMULATION_NAMESPACE}::fp32_vec_to_e2m1(array);"),
    "e2m1x2_byte_to_float2": EmulatedFunction(
        "__device__ __forceinline__ float2 e2m1x2_byte_to_float2(uint32_t byteVal) {",
        f"result = {EMULATION_NAMESPACE}::e2m1x2_byte_to_float2(byteVal);"),
    "e2m1x2_byte_scaled_e4m3_to_float2": EmulatedFunction(
        "__device__ __forceinline__ float2 e2m1x2_byte_scaled_e4m3_to_float2(uint32_t byteVal,",
        f"result = {EMULATION_NAMESPACE}::e2m1x2_byte_scaled_e4m3_to_float2(byteVal, scaleVal);"),
    "cvt_warp_fp16_to_fp4": EmulatedFunction(
        "__device__ std::conditional_t<CVT_ELTS_PER_THREAD == 16, uint64_t, uint32_t> cvt_warp_fp16_to_fp4(",
        None),
}
#: Substitutions a correct copy holds: one guard per function, one asm block per function that has one.
EXPECTED_GUARDS = len(EMULATED_FUNCTIONS)
EXPECTED_ASM_BLOCKS = sum(f.asm_replacement is not None for f in EMULATED_FUNCTIONS.values())


class HeaderMismatch(RuntimeError):
    """The header is not the one the emulation was written for."""


def _skip_literal(text: str, i: int) -> int:
    """Index just past the string or character literal that starts at text[i]."""
    quote = text[i]
    i += 1
    while text[i] != quote:
        i += 2 if text[i] == "\\" else 1
    return i + 1


def _scan(text: str, start: int, open_ch: str, close_ch: str) -> int:
    """Index just past the bracket that closes the first open_ch at or after start, skipping literals and
    comments (the asm strings hold braces)."""
    depth, i = 0, start
    while i < len(text):
        c = text[i]
        if c in "\"'":
            i = _skip_literal(text, i)
            continue
        if text.startswith("//", i):
            i = text.index("\n", i)
            continue
        if c == open_ch:
            depth += 1
        elif c == close_ch:
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    raise HeaderMismatch(f"unbalanced {open_ch}{close_ch} from offset {start}")


def _function_span(text: str, name: str, fn: EmulatedFunction) -> Tuple[int, int]:
    """(start, end) offsets of the definition of fn: its signature line through its closing brace."""
    found = [m.start() for m in re.finditer(re.escape(fn.signature), text)]
    if len(found) != 1:
        raise HeaderMismatch(f"{name}: its signature occurs {len(found)} times (want 1): {fn.signature!r}")
    start = text.rfind("\n", 0, found[0]) + 1
    if text[start:found[0]].strip():
        raise HeaderMismatch(f"{name}: the signature does not start its line")
    params_end = _scan(text, text.index("(", found[0]), "(", ")")  # the signature's first '(' opens the parameters
    return start, _scan(text, text.index("{", params_end), "{", "}")


def _emulate_function(name: str, fn: EmulatedFunction, body: str) -> Tuple[str, int, int]:
    """The function's text with its guard and asm block substituted; (text, guards, asm blocks)."""
    guards = body.count(BLACKWELL_GUARD + "\n")
    if guards != 1:
        raise HeaderMismatch(f"{name}: {guards} lines {BLACKWELL_GUARD!r} (want 1)")
    body = body.replace(BLACKWELL_GUARD + "\n", EMULATION_GUARD + "\n")
    asm_at = [m.start() for m in re.finditer(r"^[ \t]*asm volatile\(", body, re.M)]
    want = 0 if fn.asm_replacement is None else 1
    if len(asm_at) != want:
        raise HeaderMismatch(f"{name}: {len(asm_at)} asm blocks (want {want})")
    if not asm_at:
        if any(p in body for p in BLACKWELL_ONLY_PTX):
            raise HeaderMismatch(f"{name}: a Blackwell-only instruction outside an asm block")
        return body, 1, 0
    start = asm_at[0]
    end = _scan(body, body.index("(", start), "(", ")")
    if body[end] != ";" or body[end + 1] != "\n":
        raise HeaderMismatch(f"{name}: the asm statement does not end its line with ';'")
    block = body[start:end + 1]
    if not any(p in block for p in BLACKWELL_ONLY_PTX):
        raise HeaderMismatch(f"{name}: its asm block holds no Blackwell-only instruction")
    indent = block[:len(block) - len(block.lstrip())]
    return body[:start] + indent + fn.asm_replacement + body[end + 1:], 1, 1


def emulated_header(original: str, check_pin: bool = True) -> Tuple[str, List[str]]:
    """(the emulation copy of the header text, one line per substitution). Raises HeaderMismatch when the
    header is not FlashInfer 0.7.4's (check_pin) or any expected construct is missing or repeated."""
    if check_pin:
        digest = hashlib.sha256(original.encode()).hexdigest()
        if digest != PINNED_SHA256:
            raise HeaderMismatch(
                f"quantization_utils.cuh has SHA-256 {digest}, not FlashInfer {PINNED_FLASHINFER}'s "
                f"({PINNED_SHA256}): the emulation build supports only flashinfer-python=={PINNED_FLASHINFER}")
    spans = sorted((_function_span(original, name, fn), name, fn) for name, fn in EMULATED_FUNCTIONS.items())
    out, pos, log, guards, blocks = [], 0, [], 0, 0
    for (start, end), name, fn in spans:
        if start < pos:
            raise HeaderMismatch(f"{name}: overlaps the function before it")
        body, g, a = _emulate_function(name, fn, original[start:end])
        out += [original[pos:start], body]
        pos, guards, blocks = end, guards + g, blocks + a
        log.append(f"{name}: guard admits sm_90" + (f"; asm -> {fn.asm_replacement}" if a else ""))
    out.append(original[pos:])
    if (guards, blocks) != (EXPECTED_GUARDS, EXPECTED_ASM_BLOCKS):
        raise HeaderMismatch(f"{guards} guards and {blocks} asm blocks substituted, want {EXPECTED_GUARDS} and "
                             f"{EXPECTED_ASM_BLOCKS}")
    return "".join(out), log


def unified_diff(original: str, emulated: str, name: str = "quantization_utils.cuh") -> str:
    """The copy against the original, as a unified diff (3 lines of context)."""
    return "".join(difflib.unified_diff(original.splitlines(True), emulated.splitlines(True),
                                        fromfile=f"flashinfer/{name}", tofile=f"emulated/{name}"))


def write_emulated_header(original_path: Path, out_path: Path) -> str:
    """Write the emulation copy of original_path to out_path; returns the unified diff."""
    original = Path(original_path).read_text()
    emulated, _ = emulated_header(original)
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(emulated)
    return unified_diff(original, emulated)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: emulated_flashinfer_header.py ORIGINAL OUT")
    print(write_emulated_header(Path(sys.argv[1]), Path(sys.argv[2])), end="")
