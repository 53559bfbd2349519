"""The recipes and grids that ship with vitdepth, found by name outside a clone.

The repository's ``configs/`` folder is where users read and edit them; ``vitdepth/configs`` is a
symlink to it in a clone and the real folder in an installed wheel (setuptools copies the files as
package data). So ``vitdepth fit --config digits`` and ``vitdepth sweep digits-depth`` work from any
folder, while a file of that name in the current folder still wins.
"""

from __future__ import annotations

from pathlib import Path

CONFIGS = (Path(__file__).parent / "configs").resolve()
RECIPE_FOLDERS = (".", "data")  # where --config NAME looks: recipes, then data-set configs
GRID_FOLDERS = ("grids",)
SUFFIXES = (".yaml", ".yml")


def shipped_file(name: str, folders: tuple[str, ...]) -> Path | None:
    """The shipped file ``name`` means, or None: a path under configs/ (``data/cifar10.yaml``, also
    written ``configs/data/cifar10.yaml``) or a name in one of ``folders``; ``.yaml`` may be left off."""
    relative = name.removeprefix("configs/")
    names = [relative] if relative.endswith(SUFFIXES) else [relative, relative + ".yaml"]
    for folder in dict.fromkeys((".", *folders)):
        for candidate in names:
            path = CONFIGS / folder / candidate
            if path.is_file():
                return path
    return None


def local_or_shipped(given: str, folders: tuple[str, ...]) -> str | None:
    """``given`` if it is a file here, else the shipped file it names (as a path), else None."""
    if Path(given).is_file():
        return given
    found = shipped_file(given, folders)
    return str(found) if found else None


def shipped_names(folders: tuple[str, ...]) -> list[str]:
    """The names that ``shipped_file`` finds in ``folders`` (``digits``, ``cifar10``), for errors."""
    return sorted(path.stem for folder in folders for path in (CONFIGS / folder).glob("*.y*ml"))
