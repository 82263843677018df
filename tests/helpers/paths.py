"""Where things are: the repository root (or the root of a copy of the tests: a directory holding ``tests/`` and
what was copied next to it, e.g. ``pyproject.toml`` and ``scripts/`` in CI and the wheel builds). Test files
compute no path from their own ``__file__``: they live one folder deeper than this package's parent."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Dict, Mapping, Optional

import qwen_resnorm_fp4

#: The directory holding tests/ (the checkout's root, or the root of a copy of the tests).
REPO_ROOT = Path(__file__).resolve().parents[2]
#: tests/ itself.
TESTS_DIR = REPO_ROOT / "tests"
#: The directory holding the qwen_resnorm_fp4 under test: the checkout, or the site of an installed wheel
#: (scripts/gpu_check.sh WHEEL=...). A child process that should test the same package puts it first on
#: PYTHONPATH (and runs from it where ``-m`` or ``-c`` would put the working directory first).
PACKAGE_PARENT = Path(qwen_resnorm_fp4.__file__).resolve().parent.parent


def package_env(base: Optional[Mapping[str, str]] = None, **variables: str) -> Dict[str, str]:
    """The environment of a child interpreter that tests the same package: ``base`` (default: this process's
    environment) with ``variables`` set and PACKAGE_PARENT first on PYTHONPATH. Run the child with
    ``cwd=PACKAGE_PARENT`` too: ``-m`` and ``-c`` put the working directory before PYTHONPATH."""
    env = dict(os.environ if base is None else base, **variables)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(PACKAGE_PARENT), env.get("PYTHONPATH"))))
    return env
