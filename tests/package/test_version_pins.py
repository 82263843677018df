"""The build pins (torch for building the wheel, flashinfer-python for the Blackwell headers) are written
in several files of different formats: README's quickstart, pyproject.toml (extras, cibuildwheel),
setup.py, .ci/run and the GitHub workflows. They must agree, or a user, CI and the wheel builds would use
different versions. CPU only; files absent from this copy of the tests (e.g. an sdist without .github/)
are skipped."""

from __future__ import annotations

import re

import pytest

from helpers.paths import REPO_ROOT

ROOT = REPO_ROOT
FILES = ["README.md", "pyproject.toml", "setup.py", ".ci/run"] + [
    str(p.relative_to(ROOT)) for p in sorted((ROOT / ".github" / "workflows").glob("*.yml"))]


def pins(pattern: str) -> dict:
    found = {}
    for name in FILES:
        path = ROOT / name
        if path.is_file():
            for version in re.findall(pattern, path.read_text()):
                found.setdefault(version, set()).add(name)
    return found


def test_torch_build_pin_is_one_version():
    found = pins(r"\btorch==([0-9][0-9.]*[0-9])")
    if not found:
        pytest.skip("no file with a torch pin in this copy of the tests")
    assert len(found) == 1, f"torch pinned to different versions: {found}"


def test_flashinfer_pin_is_one_version_and_setup_py_agrees():
    setup_py = ROOT / "setup.py"
    if not setup_py.is_file():
        pytest.skip("setup.py not in this copy of the tests")
    pinned = re.search(r'^FLASHINFER_PINNED = "([^"]+)"', setup_py.read_text(), re.M).group(1)
    found = pins(r"\bflashinfer-python==([0-9][0-9.]*[0-9])")
    assert set(found) <= {pinned}, f"setup.py pins FlashInfer {pinned}, other files: {found}"
    assert found, "no flashinfer-python pin found outside setup.py"


def test_no_instruction_installs_flashinfer_without_its_dependencies():
    """No install instruction (README, docs, scripts, CI, pyproject) installs flashinfer-python with --no-deps: such
    a flashinfer cannot import, and diffusers, SGLang and vLLM import any installed flashinfer. The build fetches
    FlashInfer's headers itself (setup.py)."""
    names = FILES + [str(p.relative_to(ROOT)) for pattern in ("docs/*.md", "scripts/*", "third_party/*.md")
                     for p in sorted(ROOT.glob(pattern)) if p.is_file()]
    pattern = r"pip install[^\n]*(--no-deps[^\n]*flashinfer-python==|flashinfer-python==[^\n]*--no-deps)"
    offending = [name for name in names if (ROOT / name).is_file() and re.search(pattern, (ROOT / name).read_text())]
    assert not offending, f"installs flashinfer-python with --no-deps: {offending}"
