"""MkDocs hook: serve the committed sweep results and the lab notebook from ``sweeps/``.

The documentation links to ``sweeps/README.md`` (the dated lab notebook) and shows the figures
under ``sweeps/results/`` where they are committed, without copies under ``docs/``: this hook adds
those files to the site as if they were under ``docs/sweeps/``, so links to them are checked by
``mkdocs build --strict`` like any other page.
"""

from __future__ import annotations

from pathlib import Path

from mkdocs.structure.files import File, Files, InclusionLevel

ROOT = Path(__file__).resolve().parents[2]
SUFFIXES = {".md", ".png", ".svg", ".csv", ".txt"}


def on_files(files: Files, config) -> Files:
    sweeps = ROOT / "sweeps"
    paths = [sweeps / "README.md", *sorted(p for p in (sweeps / "results").rglob("*")
                                          if p.is_file() and p.suffix in SUFFIXES)]
    for path in paths:
        f = File(path.relative_to(ROOT).as_posix(), src_dir=str(ROOT), dest_dir=config["site_dir"],
                 use_directory_urls=config["use_directory_urls"])
        if path != sweeps / "README.md":
            f.inclusion = InclusionLevel.NOT_IN_NAV  # result tables: linked to, not listed in the nav
        files.append(f)
    return files
