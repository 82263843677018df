"""Where things are: the repository root (or the root of a copy of the tests: a directory holding ``tests/`` and
what was copied next to it, e.g. ``pyproject.toml`` and ``scripts/`` in CI and the wheel builds). Test files
compute no path from their own ``__file__``: they live one folder deeper than this package's parent."""

from __future__ import annotations

from pathlib import Path

#: The directory holding tests/ (the checkout's root, or the root of a copy of the tests).
REPO_ROOT = Path(__file__).resolve().parents[2]
#: tests/ itself.
TESTS_DIR = REPO_ROOT / "tests"
