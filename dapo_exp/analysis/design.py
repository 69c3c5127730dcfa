"""Two-level designs over the five switches: generate them (pyDOE3), recognise them in a set of runs,
and state what they alias.

Each switch is a two-level factor coded -1 (off) / +1 (on). The factors carry letters in the
order of :data:`SWITCHES`: a = clip_higher, b = dynamic_sampling, c = token_level_loss,
d = overlong_punishment, e = overlong_filtering. An interaction is a *word* (``ab`` = a x b);
its column is the product of the factors' columns.

- **Full factorial** 2^5: 32 configurations; every main effect and interaction has its own column.
- **Half fraction** 2^(5-1), generator e = abcd (defining relation I = abcde): 16 configurations.
  Resolution V: each main effect is aliased with one 4-way interaction (a = bcde) and each
  two-way interaction with one 3-way interaction (ab = cde), so with 3- and 4-way interactions
  assumed negligible all main effects and two-way interactions are identified with half the runs.

:func:`describe_design` takes any set of switch states (the runs of a sweep) and finds the
design: which switches vary, the defining relation (the words whose column is constant), the
resolution and the alias groups. It works for any fraction, regular or not; a word that is only
partly correlated with another (an irregular fraction, or a fraction with runs missing) is
reported with its correlation.

``python -m dapo_exp.analysis design fractional`` prints the 16 configurations as Hydra
overrides, one line per configuration (``sweeps/fractional.sh`` loops over them).
``--switches gspo,dr_grpo_adv,top_entropy`` builds the same kind of design over any list of
registered switches that can be on together (:func:`check_switches`): the full factorial 2^k, or
the half fraction 2^(k-1) whose last factor is the product of the others (resolution k). Every
registered switch has a letter: DAPO's five a-e as above, then the others in registry order.
"""

from __future__ import annotations

import itertools
import string
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from dapo_exp.fixes import FIXES, dapo_fixes, incompatibility

# The ONE place the attribution code (design, effects, report) reads the switch names and their
# options: the registry of the fixes (dapo_exp.fixes), whose DAPO fixes (Table 1's five columns)
# are the factors of these two-level designs; the GRPO family's switches are compared one at a
# time against GRPO (the table's paired differences, sweeps/family.sh), not factors here.
SWITCHES: tuple[str, ...] = dapo_fixes()

# Hydra option (conf/<switch>/<option>.yaml) for the off and on level of each switch: the first two
# options of each fix (off `disabled`; on `enabled`, and `soft` for the overlong punishment, the
# paper's Eq. 13: its other options are the seed documents' variants, not the paper's).
SWITCH_OPTIONS: dict[str, tuple[str, str]] = {s: (FIXES[s].options[0], FIXES[s].options[1]) for s in SWITCHES}
# a letter for every registered switch: DAPO's five first (a-e), then the others in registry order
LETTERS = dict(zip(SWITCHES + tuple(n for n in FIXES if n not in SWITCHES), string.ascii_letters))
# the half fraction: four base factors and e = abcd (pyDOE3 generator string)
HALF_FRACTION_GENERATOR = "a b c d abcd"
DESIGNS = ("fractional", "full")


def _letter(switch: str) -> str:
    """The switch's letter (one is given, in order, to a fix registered after this module was imported)."""
    if switch not in LETTERS:
        LETTERS[switch] = next(c for c in string.ascii_letters if c not in LETTERS.values())
    return LETTERS[switch]


def check_switches(switches: Sequence[str]) -> tuple[str, ...]:
    """The factors of a design: registered switches, no repeats, at least two, every pair able to be on
    together (a two-level design turns each pair on at once); else ValueError naming the switches."""
    names = tuple(switches)
    unknown = [s for s in names if s not in FIXES]
    if unknown:
        raise ValueError(f"unknown switch {unknown[0]!r}; registered switches: {', '.join(FIXES)}")
    if len(set(names)) != len(names) or len(names) < 2:
        raise ValueError(f"a design needs two or more distinct switches, got {', '.join(names) or 'none'}")
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            why = incompatibility(FIXES[a], FIXES[b])
            if why:
                raise ValueError(f"switches {a} and {b} cannot be factors of one design: they cannot be on together "
                                 f"({why})")
    return names


def half_fraction_generator(k: int) -> str:
    """pyDOE3's generator of the 2^(k-1) half fraction: k-1 base factors, the last their product."""
    base = string.ascii_lowercase[: k - 1]
    return " ".join([*base, base])


def coded(states: pd.DataFrame | np.ndarray) -> np.ndarray:
    """Switch states (bool / 0-1) -> the -1 / +1 coding."""
    x = np.asarray(states, dtype=float)
    return 2.0 * x - 1.0


def switches_in(runs: pd.DataFrame) -> tuple[str, ...]:
    """The factors of the runs' design: DAPO's five switches (:data:`SWITCHES`), then every other
    registered fix whose column takes both values among ``runs`` (a design over family switches is
    attributed with no change to the analysis)."""
    extra = tuple(n for n in FIXES if n not in SWITCHES and n in runs and runs[n].dropna().nunique() > 1)
    return SWITCHES + extra


def fractional_design(generator: str | None = None, switches: Sequence[str] = SWITCHES) -> pd.DataFrame:
    """A half fraction from pyDOE3's ``fracfact``, one bool column per switch: over DAPO's five the
    2^(5-1) with e = abcd (16 rows); over k chosen switches the 2^(k-1) of :func:`half_fraction_generator`
    (its letters are positions in ``switches``) unless ``generator`` is given."""
    from pyDOE3 import fracfact

    switches = check_switches(switches)
    generator = generator or (HALF_FRACTION_GENERATOR if switches == SWITCHES else half_fraction_generator(len(switches)))
    x = fracfact(generator)
    if x.shape[1] != len(switches):
        raise ValueError(f"generator {generator!r} gives {x.shape[1]} factors; the switches are {len(switches)}")
    return pd.DataFrame(x > 0, columns=list(switches))


def full_factorial(switches: Sequence[str] = SWITCHES) -> pd.DataFrame:
    """The 2^k full factorial from pyDOE3's ``ff2n`` (2^5 = 32 rows over DAPO's five), one bool column per switch."""
    from pyDOE3 import ff2n

    switches = check_switches(switches)
    return pd.DataFrame(ff2n(len(switches)) > 0, columns=list(switches))


def make_design(name: str, switches: Sequence[str] | None = None) -> pd.DataFrame:
    """``fractional`` (2^(k-1); DAPO's five: e = abcd) or ``full`` (2^k) over ``switches`` (default DAPO's five)."""
    switches = SWITCHES if switches is None else tuple(switches)
    if name == "fractional":
        return fractional_design(switches=switches)
    if name == "full":
        return full_factorial(switches)
    raise ValueError(f"design {name!r}: choose one of {', '.join(DESIGNS)}")


def job_overrides(design: pd.DataFrame) -> list[str]:
    """One line of Hydra overrides per row: ``clip_higher=enabled dynamic_sampling=disabled ...``
    (the first two options of each switch's config group: off, on)."""
    options = {s: (FIXES[s].options[0], FIXES[s].options[1]) for s in design.columns}
    lines = []
    for _, row in design.iterrows():
        lines.append(" ".join(f"{s}={options[s][int(bool(row[s]))]}" for s in design.columns))
    return lines


# --------------------------------------------------------------------------- #
# Words, alias groups, recognition                                             #
# --------------------------------------------------------------------------- #
def word_name(factors: Sequence[str]) -> str:
    """``("clip_higher", "dynamic_sampling")`` -> ``"ab"`` (letters in :data:`LETTERS` order)."""
    return "".join(sorted((_letter(f) for f in factors), key=string.ascii_letters.index))


def term_name(factors: Sequence[str]) -> str:
    """``("clip_higher", "dynamic_sampling")`` -> ``"clip_higher × dynamic_sampling"`` (in letter order)."""
    return " × ".join(sorted(factors, key=lambda f: string.ascii_letters.index(_letter(f))))


def word_columns(points: pd.DataFrame, factors: Sequence[str], max_order: int | None = None) -> dict[tuple, np.ndarray]:
    """The ±1 column of every word (product of 1..max_order factors) over the design points."""
    x = {f: coded(points[f]) for f in factors}
    out = {}
    top = len(factors) if max_order is None else max_order
    for k in range(1, top + 1):
        for w in itertools.combinations(factors, k):
            out[w] = np.prod([x[f] for f in w], axis=0)
    return out


@dataclass
class DesignInfo:
    """What a set of switch states is as a design (see :func:`describe_design`)."""

    kind: str  # "full factorial", "regular fraction", "irregular", "one configuration"
    n_points: int  # distinct switch states
    varied: list[str]  # switches that take both values
    constant: dict[str, bool]  # switches that do not vary, with their value
    defining_words: list[tuple[str, int]] = field(default_factory=list)  # (word, sign): I = ±word
    resolution: int | None = None
    # alias groups: words (up to the full order) whose columns are equal up to sign
    alias_groups: list[list[tuple[str, int]]] = field(default_factory=list)
    # partial aliasing: (word, word, correlation) for |r| strictly between 0 and 1 (mains and 2-ways)
    partial: list[tuple[str, str, float]] = field(default_factory=list)

    @property
    def name(self) -> str:
        k = len(self.varied)
        if self.kind == "full factorial":
            return f"2^{k} full factorial"
        if self.kind == "regular fraction":
            p = int(round(np.log2(len(self.defining_words) + 1)))
            res = _ROMAN.get(self.resolution or 0, str(self.resolution))
            return f"2^({k}-{p}) fractional factorial, resolution {res}"
        return self.kind

    def letters(self) -> str:
        return ", ".join(f"{_letter(s)} = {s}" for s in self.varied)

    def text(self) -> str:
        """A paragraph: the design, its defining relation and aliasing of main effects and 2-way interactions."""
        lines = [f"Design: {self.name}; {self.n_points} distinct configurations of {len(self.varied)} varied switches"]
        if self.varied:
            lines[-1] += f" ({self.letters()})"
        if self.constant:
            lines.append(
                "Not varied (no effect can be estimated): "
                + ", ".join(f"{s} ({'on' if v else 'off'})" for s, v in self.constant.items())
            )
        if self.defining_words:
            rel = " = ".join(["I"] + [("" if s > 0 else "-") + w for w, s in self.defining_words])
            lines.append(f"Defining relation: {rel}")
        if self.kind == "regular fraction":
            lo = [g for g in self.alias_groups if len(g[0][0]) <= 2]
            summary = _alias_summary(lo)
            if summary:
                lines.append("Aliasing: " + summary)
            lines.append(
                "Alias groups of main effects and two-way interactions: "
                + "; ".join(" = ".join(("" if s > 0 else "-") + w for w, s in g) for g in lo)
            )
        else:
            exact = [g for g in self.alias_groups if len(g[0][0]) <= 2 and sum(len(w) <= 2 for w, _ in g) > 1]
            if exact:
                lines.append(
                    "Fully aliased among main effects and two-way interactions: "
                    + "; ".join(" = ".join(("" if s > 0 else "-") + w for w, s in g if len(w) <= 2) for g in exact)
                )
        if self.partial:
            shown = self.partial[:8]
            more = f", and {len(self.partial) - len(shown)} more pairs" if len(self.partial) > len(shown) else ""
            lines.append(
                "Partly aliased (correlated columns; their estimates share variance): "
                + ", ".join(f"{a} ~ {b} (r = {r:+.2f})" for a, b, r in shown)
                + more
            )
        return "\n".join(lines)


_ROMAN = {1: "I", 2: "II", 3: "III", 4: "IV", 5: "V", 6: "VI"}


def _alias_summary(groups: list[list[tuple[str, int]]]) -> str:
    """'main effects aliased with four-way interactions; two-way interactions with three-way ones'."""
    parts = []
    names = {1: "main effects", 2: "two-way", 3: "three-way", 4: "four-way", 5: "five-way"}
    for order in (1, 2):
        if not any(len(g[0][0]) == order for g in groups):
            continue
        mates = sorted({len(w) for g in groups if len(g[0][0]) == order for w, _ in g[1:]})
        what = "main effects" if order == 1 else "two-way interactions"
        if not mates:
            parts.append(f"{what} aliased with nothing")
            continue
        kinds = [names[m] for m in mates]
        listed = kinds[0] if len(kinds) == 1 else ", ".join(kinds[:-1]) + " and " + kinds[-1]
        parts.append(f"{what} aliased with {listed}" + (" effects" if mates == [1] else " interactions"))
    return "; ".join(parts)


def describe_design(points: pd.DataFrame, switches: Sequence[str] = SWITCHES) -> DesignInfo:
    """Recognise the design formed by ``points`` (rows of switch states; duplicates, e.g. seeds, ignored)."""
    pts = points[list(switches)].astype(bool).drop_duplicates().reset_index(drop=True)
    varied = [s for s in switches if pts[s].nunique() == 2]
    constant = {s: bool(pts[s].iloc[0]) for s in switches if s not in varied and len(pts)}
    n = len(pts)
    k = len(varied)
    if k == 0:
        return DesignInfo("one configuration", n, varied, constant)
    cols = word_columns(pts, varied)
    defining = [(word_name(w), int(c[0])) for w, c in cols.items() if np.all(c == c[0])]
    groups: dict[bytes, list[tuple[str, int]]] = {}
    for w, c in cols.items():
        if np.all(c == c[0]):
            continue
        sign = int(c[np.flatnonzero(c)[0]]) if np.any(c) else 1
        key = (c * sign).tobytes()
        groups.setdefault(key, []).append((word_name(w), sign))
    alias_groups = []
    for g in groups.values():
        g = sorted(g, key=lambda t: (len(t[0]), t[0]))
        s0 = g[0][1]
        alias_groups.append([(w, s * s0) for w, s in g])  # signs relative to the first (lowest-order) word
    alias_groups.sort(key=lambda g: (len(g[0][0]), g[0][0]))
    if n == 2**k:
        kind = "full factorial"
    elif defining and n * (len(defining) + 1) == 2**k and _balanced(cols, defining):
        kind = "regular fraction"
    else:
        kind = "irregular design"
    resolution = min(len(w) for w, _ in defining) if defining else None
    partial = []
    low = [w for w in cols if len(w) <= 2 and not np.all(cols[w] == cols[w][0])]
    if len(low) > 1:
        r = np.corrcoef(np.array([cols[w] for w in low]))
        for i, j in zip(*np.triu_indices(len(low), 1)):
            if 1e-9 < abs(r[i, j]) < 1 - 1e-9:
                partial.append((word_name(low[i]), word_name(low[j]), float(r[i, j])))
    return DesignInfo(kind, n, varied, constant, defining, resolution, alias_groups, partial)


def _balanced(cols: dict[tuple, np.ndarray], defining: list[tuple[str, int]]) -> bool:
    """A regular fraction: every word outside the defining relation is balanced (as many + as -)."""
    dw = {w for w, _ in defining}
    return all(abs(c.sum()) < 1e-9 for w, c in cols.items() if word_name(w) not in dw)
