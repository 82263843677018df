"""The package's layering (docs/design.md, "Layers"): each module imports only modules of a lower layer (so
there is no import cycle and no import order to keep in __init__.py), no module imports another's private
name, none reads the environment through ctypes, and no block has a statement after its return."""

from __future__ import annotations

import ast

import pytest

from helpers.paths import REPO_ROOT

PACKAGE = REPO_ROOT / "qwen_resnorm_fp4"

#: Layer of each module of the core (lower layers first). integrations/, the command line and the benchmarks
#: sit above all of them.
LAYERS = {
    "constants": 0, "env": 0, "layout": 0, "_argtypes": 0, "_library": 0, "rcp_approx": 0,
    "recipe": 1, "device": 1,
    "validation": 2,
    "reference": 3,
    "ops": 4,
    "operands": 5, "launch": 5,
    "api": 6, "_fused_common": 6,
    "fused_path": 7, "fused_path_fp8": 7, "gemm": 7, "_linear_common": 7,
    "linear": 8, "linear_fp8": 8,
    "testing": 9, "info": 9,
}


def _tree(module: str) -> ast.Module:
    return ast.parse((PACKAGE / f"{module}.py").read_text())


def _package_imports(tree: ast.Module):
    """(module, names) of every import of a sibling module, at any depth (lazy imports too)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            if node.module is None:
                for alias in node.names:
                    yield alias.name, ()
            else:
                yield node.module.split(".")[0], tuple(a.name for a in node.names)


@pytest.mark.parametrize("module", sorted(LAYERS))
def test_imports_point_down(module):
    for imported, _ in _package_imports(_tree(module)):
        if imported in ("_version", "_build_info"):  # files setup.py writes, no imports of their own
            continue
        assert imported in LAYERS, f"{module} imports {imported}, which has no layer"
        assert LAYERS[imported] < LAYERS[module], f"{module} (layer {LAYERS[module]}) imports {imported} " \
                                                  f"(layer {LAYERS[imported]})"


def test_every_core_module_has_a_layer():
    skip = {"__init__", "__main__", "cli", "_version", "_build_info"}  # the last two: written by setup.py
    modules = {p.stem for p in PACKAGE.glob("*.py") if p.stem not in skip and not p.stem.startswith("bench")}
    assert modules == set(LAYERS)


@pytest.mark.parametrize("module", sorted(LAYERS) + ["__init__"])
def test_no_private_names_of_other_modules(module):
    for imported, names in _package_imports(_tree(module)):
        if imported.startswith("_"):
            continue
        private = [n for n in names if n.startswith("_")]
        assert not private, f"{module} imports {private} from {imported}"


@pytest.mark.parametrize("module", sorted(LAYERS))
def test_no_ctypes(module):
    for node in ast.walk(_tree(module)):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in node.names] + ([node.module] if isinstance(node, ast.ImportFrom) else [])
            assert "ctypes" not in names, f"{module} imports ctypes"


@pytest.mark.parametrize("module", sorted(LAYERS))
def test_no_statement_after_a_return(module):
    for node in ast.walk(_tree(module)):
        for field in ("body", "orelse", "finalbody"):
            block = getattr(node, field, None)
            if not isinstance(block, list):
                continue
            for i, stmt in enumerate(block[:-1]):
                assert not isinstance(stmt, (ast.Return, ast.Raise, ast.Continue, ast.Break)), \
                    f"{module}:{block[i + 1].lineno}: unreachable after line {stmt.lineno}"


def test_the_release_package_registers_no_test_op():
    """The test-only ops live in qwen_fp4_testing, defined only by qwen_resnorm_fp4.testing."""
    import qwen_resnorm_fp4.ops as ops

    assert not [name for name in ops.SCHEMAS if name in ("_rcp_approx", "_e2m1_codes", "_div_full_rcp")]
    assert all(not (PACKAGE / f"{m}.py").read_text().count("qwen_fp4_testing") for m in LAYERS if m != "testing")
