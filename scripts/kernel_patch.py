"""What the diagnostic patch scripts share (cta_timestamps_patch.py, cta_phases_patch.py,
arithmetic_free_patch.py): text edits of csrc/resnorm_kernel.cuh (or another file) in a *copy* of the source tree, never the
checkout itself."""
import sys
from pathlib import Path
from typing import Callable, Sequence, Tuple

Edit = Tuple[str, str, int]  # (old text, new text, how many times old must occur)


def edit_kernel(root: Path, edits: Sequence[Edit], file: str = "csrc/resnorm_kernel.cuh") -> None:
    """Replaces each old text (which must occur exactly its count of times) in root's `file`."""
    path = root / file
    s = path.read_text()
    for old, new, count in edits:
        if s.count(old) != count:
            sys.exit(f"{path}: expected {count} of this code, found {s.count(old)} (the kernel changed?):\n{old}")
        s = s.replace(old, new)
    path.write_text(s)


def main(patch: Callable[[Path], None], script: str) -> None:
    """The scripts' command line: one argument, the copy of the tree to patch."""
    repo = Path(__file__).resolve().parent.parent
    if len(sys.argv) != 2 or Path(sys.argv[1]).resolve() == repo:
        sys.exit(f"usage: python scripts/{script} COPY_OF_THE_TREE  (never the checkout itself)")
    patch(Path(sys.argv[1]))
