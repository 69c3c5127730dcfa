"""Code speaks of code: the package's docstrings carry no dates, issue numbers, commit hashes or
reports of a measurement. Those belong to the docs' results and benchmark pages and the lab notebook
(sweeps/README.md), where they can be dated and sourced; a docstring says what the code does and why."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "dapo_exp"

FORBIDDEN = {
    "a date": re.compile(r"\b20\d\d-\d\d-\d\d\b"),
    "an issue number": re.compile(r"\b[Ii]ssues? #?\d+|\(#\d+\)|\bPR #?\d+"),
    "a commit hash": re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,40}\b"),
    "a measurement report": re.compile(r"\b[Mm]easured (?:on|at|with) (?:a|an|one|this|my)\b[^.]*?"
                                       r"\b(?:box|machine|GPU|CPU|cores?|laptop)\b|\bload average (?:of )?\d"),
}


def docstrings(path: Path):
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node)
            if doc:
                yield getattr(node, "name", "<module>"), doc


def offences(path: Path) -> list[str]:
    out = []
    for name, doc in docstrings(path):
        for what, pattern in FORBIDDEN.items():
            out += [f"{path.relative_to(PACKAGE.parent)}:{name}: {what}: {m.group(0)!r}" for m in pattern.finditer(doc)]
    return out


def test_no_package_docstring_carries_a_date_an_issue_a_commit_or_a_measurement():
    found = [o for p in sorted(PACKAGE.rglob("*.py")) for o in offences(p)]
    assert not found, "\n".join(found)


@pytest.mark.parametrize("doc, what", [
    ("Fast since 2026-11-22.", "a date"),
    ("Fixes issue 23.", "an issue number"),
    ("As in c04be63e64e8.", "a commit hash"),
    ("Measured on a 2-core box: 12k tokens/s.", "a measurement report"),
])
def test_the_check_finds_each_kind(tmp_path, doc, what):
    f = tmp_path / "mod.py"
    f.write_text(f'"""{doc}"""\n\n\ndef g():\n    """Returns 3 (an ordinary number, 10 s time-out)."""\n')
    found = offences_in(f)
    assert len(found) == 1 and what in found[0]


def offences_in(path: Path) -> list[str]:
    return [f"{name}: {what}" for name, doc in docstrings(path) for what, p in FORBIDDEN.items() if p.search(doc)]
