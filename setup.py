"""Build step: the wheel carries the named experiments and the data cards.

The repository's top-level ``experiments/`` and ``datasets/`` folders are their only source; this
copies them into ``fedbandit/_shipped/`` inside the build (never into the source tree), where
``fedbandit.config.shipped_folder`` finds them in an installed package. A checkout or an editable
install reads the top-level folders directly. Everything else is declared in ``setup.cfg``.
"""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
#: Source folder -> the files of it that are shipped.
SHIPPED = {"experiments": "*.toml", "datasets": "*.md"}


class BuildWithShippedFolders(build_py):
    """``build_py`` plus a copy of each shipped folder into ``fedbandit/_shipped/<folder>``."""

    def run(self) -> None:
        super().run()
        if self.editable_mode:
            return
        for folder, pattern in SHIPPED.items():
            target = Path(self.build_lib) / "fedbandit" / "_shipped" / folder
            if target.exists():
                shutil.rmtree(target)
            target.mkdir(parents=True)
            sources = sorted((ROOT / folder).glob(pattern))
            if not sources:
                raise SystemExit(f"setup.py: no {pattern} files in {ROOT / folder}")
            for source in sources:
                shutil.copy2(source, target / source.name)


setup(cmdclass={"build_py": BuildWithShippedFolders})
