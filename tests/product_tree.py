"""The product's source files and their import names, read from pyproject's package-dir.

The folders do not match the import names (daemon/ is kvbudget.daemon): pyproject's
`[tool.setuptools.package-dir]` is the one table that maps them, so the contract tests
read it rather than keep a second copy.
"""

from __future__ import annotations

import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parent.parent
PRODUCT_FOLDERS = ("daemon", "kvbudget", "tui", "traces")


class SourceFile(NamedTuple):
    path: Path
    module: str  # its import name, e.g. kvbudget.daemon.core.step
    is_package: bool  # an __init__.py: relative imports resolve from the module itself

    @property
    def shown(self) -> str:
        return self.path.relative_to(ROOT).as_posix()


def package_dirs() -> dict[str, str]:
    """Import name -> folder (relative to the repository root), as pyproject declares them."""
    with open(ROOT / "pyproject.toml", "rb") as f:
        return dict(tomllib.load(f)["tool"]["setuptools"]["package-dir"])


def is_generated(path: Path) -> bool:
    return path.name.endswith(("_pb2.py", "_pb2_grpc.py", "_pb2.pyi"))


def module_name(path: Path, dirs: dict[str, str]) -> str:
    """The import name of a file: the package whose folder holds it most closely, plus the rest."""
    relative = path.relative_to(ROOT)
    best: tuple[int, str, Path] | None = None
    for package, folder in dirs.items():
        base = Path(folder)
        if relative.is_relative_to(base) and (best is None or len(base.parts) > best[0]):
            best = (len(base.parts), package, relative.relative_to(base))
    if best is None:
        raise ValueError(f"{relative} is under no package-dir entry of pyproject.toml")
    _, package, rest = best
    parts = [*rest.parent.parts] + ([] if rest.stem == "__init__" else [rest.stem])
    return ".".join([package, *parts])


def product_files() -> Iterator[SourceFile]:
    """Every hand-written .py file in the product folders (generated protobuf code aside)."""
    dirs = package_dirs()
    for folder in PRODUCT_FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            if is_generated(path) or "egg-info" in path.as_posix():
                continue
            yield SourceFile(path, module_name(path, dirs), path.name == "__init__.py")
