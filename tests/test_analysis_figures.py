"""Every figure the analysis writes is legible at its default size: drawn without a matplotlib
warning (no collapsed layout), no tick label or other text outside the figure, aliased effects
as a note beside the estimated ones, a ladder's or an irregular set's forest of its contrasts (the
numbers of contrasts.py, never a picture of the aliasing), and titles that say what is drawn (no
band promised where a one-seed sweep has none)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from fixtures_runs import LADDER_SWEEP, STANDARD_SWEEP, make_sweep, make_switch_run
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import to_rgba
from matplotlib.text import Text

from dapo_exp import analysis as A
from dapo_exp.analysis import design as D
from dapo_exp.analysis.design import SWITCHES
from dapo_exp.analysis.effects import plot_effects
from dapo_exp.analysis.studies import STUDIES, study_figure

ONE_SEED = [(p, 0, acc, "finished") for p, acc in
            (("grpo", 0.30), ("clip", 0.40), ("clip_ds", 0.45), ("full", 0.50), ("full_no_ds", 0.48))]
SWEEPS = {"multi-seed": STANDARD_SWEEP, "one seed": ONE_SEED, "ladder": LADDER_SWEEP}


@pytest.fixture(scope="module")
def sweeps(tmp_path_factory):
    root = tmp_path_factory.mktemp("multirun")
    out = {}
    for name, spec in SWEEPS.items():
        make_sweep(root / name.replace(" ", "_"), spec)
        out[name] = root / name.replace(" ", "_")
    return out


def _fractional(root, seeds):
    """A 2^(5-1) half fraction with ``seeds``: every main effect and two-way interaction is estimable."""
    rng = np.random.default_rng(3)
    for seed in seeds:
        for _, r in D.fractional_design().iterrows():
            sw = {s: bool(r[s]) for s in SWITCHES}
            make_switch_run(root / f"{D.word_name([s for s in SWITCHES if sw[s]]) or 'none'},seed={seed}", sw, seed,
                            rng.random((20, 4)) < 0.3 + 0.1 * sw["dynamic_sampling"])
    return root


def _hidden_ticklabels(fig) -> set[int]:
    """ids of the tick labels matplotlib keeps but does not draw (their tick lies outside the view, or
    the axes is a text panel with its axis off)."""
    hidden = set()
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            lo, hi = sorted(axis.get_view_interval())
            eps = 1e-9 * max(1.0, abs(hi - lo))
            for loc, label in zip(axis.get_majorticklocs(), axis.get_majorticklabels()):
                if not ax.axison or not lo - eps <= loc <= hi + eps:
                    hidden.add(id(label))
    return hidden


def outside(fig) -> list[str]:
    """Draw ``fig`` as it is saved (Agg, default size) and return every text drawn outside it: tick
    labels (each axis), titles, notes, legends. Raises on any warning while drawing."""
    FigureCanvasAgg(fig)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # e.g. "constrained_layout not applied because axes sizes collapsed to zero"
        fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    box = fig.bbox
    tol = 1.0  # pixel
    bad = []
    hidden = _hidden_ticklabels(fig)
    for t in fig.findobj(Text):
        if not t.get_visible() or not t.get_text().strip() or (t.axes is not None and not t.axes.get_visible()):
            continue
        if id(t) in hidden:
            continue
        e = t.get_window_extent(renderer)
        if e.x0 < box.x0 - tol or e.x1 > box.x1 + tol or e.y0 < box.y0 - tol or e.y1 > box.y1 + tol:
            bad.append(t.get_text())
    tight = fig.get_tightbbox(renderer)
    full = fig.bbox_inches
    if tight.x0 < full.x0 - 0.02 or tight.x1 > full.x1 + 0.02 or tight.y0 < full.y0 - 0.02 or tight.y1 > full.y1 + 0.02:
        bad.append(f"tight bbox {tight.bounds} beyond the figure {full.bounds}")
    return bad


def ytick_texts(ax) -> list[str]:
    """The y tick labels drawn (within the axis' view; none on a text panel)."""
    if not ax.axison:
        return []
    lo, hi = sorted(ax.get_ylim())
    return [t.get_text() for loc, t in zip(ax.get_yticks(), ax.get_yticklabels()) if t.get_text() and lo <= loc <= hi]


@pytest.mark.parametrize("x", ["step", "rollouts", "tokens"])
@pytest.mark.parametrize("sweep", list(SWEEPS))
def test_curves_are_legible_and_warning_free(sweeps, sweep, x):
    fig = A.plot_curves(A.load_runs(sweeps[sweep]), x=x)
    assert outside(fig) == []
    # every y axis has tick labels (none clipped: checked above) and names its unit
    for ax in fig.axes:
        if ax.get_visible():
            assert ytick_texts(ax) and ax.get_ylabel()


def test_the_one_seed_curves_promise_no_band(sweeps):
    one = A.plot_curves(A.load_runs(sweeps["one seed"]))
    title = one.get_suptitle()
    assert "one seed" in title and "no band" in title and "95%" not in title and "interval" not in title
    assert not any(ax.collections for ax in one.axes)  # and none is drawn
    multi = A.plot_curves(A.load_runs(sweeps["multi-seed"]))
    # full_no_ds has one seed: the band is said to be for the others
    assert "95% t-interval" in multi.get_suptitle() and "2+ seeds" in multi.get_suptitle()
    assert any(ax.collections for ax in multi.axes)
    three = A.plot_curves(A.load_runs(sweeps["multi-seed"]), labels=["grpo", "clip_ds"])  # 3 seeds each
    assert "2+ seeds" not in three.get_suptitle() and "95% t-interval" in three.get_suptitle()


def test_the_study_figure_is_legible(sweeps):
    fig = study_figure(A.load_runs(sweeps["multi-seed"]), STUDIES["clip_higher"])
    assert outside(fig) == []


def test_plot_effects_draws_aliased_terms_as_a_note_beside_the_estimated_ones(sweeps):
    """The effects' own forest (:func:`plot_effects`, for a set that identifies some terms: the main effects
    of the standard sweep): estimated terms are rows, the aliased ones a note beside them, never a row of
    text standing in for a number."""
    eff = A.fit_effects(A.load_runs(sweeps["multi-seed"]), model="main")
    aliased = eff.table[eff.table["status"] != "estimated"]["term"].tolist()
    estimated = eff.table[eff.table["status"] == "estimated"]["term"].tolist()
    assert aliased and estimated
    fig = plot_effects(eff)
    assert outside(fig) == []
    rows = [t for ax in fig.axes for t in ytick_texts(ax)]
    assert sorted(rows) == sorted(estimated)  # only estimated terms are rows of an axis
    notes = "\n".join(t.get_text() for ax in fig.axes for t in ax.texts)
    for term in aliased:
        assert f"{term}: aliased with" in notes
    assert not any("aliased" in t for ax in fig.axes for t in ytick_texts(ax))


# grpo < clip < clip_ds < full, three seeds: the README's headline ladder
LADDER_SPEC = [(p, s, acc, "finished") for p, accs in {
    "grpo": (0.30, 0.34, 0.31), "clip": (0.36, 0.37, 0.35), "clip_ds": (0.38, 0.43, 0.39),
    "full": (0.45, 0.44, 0.50)}.items() for s, acc in enumerate(accs)]
# three configurations, none of whose switch sets contains another's
IRREGULAR_SPEC = [(p, s, acc, "finished") for p, accs in {
    "full_no_clip": (0.40, 0.45, 0.42, 0.47), "full_no_ds": (0.44, 0.46, 0.47, 0.52),
    "full_no_tl": (0.30, 0.41, 0.36, 0.40)}.items() for s, acc in enumerate(accs)]


def _sweep_forest(root, out, monkeypatch):
    """The sweep-end analysis (``run_analysis``, as the callback calls it) with every warning an error;
    returns its result and the figure it saved as ``effects_forest.png``. Its curve figures are not drawn (about
    8 of the 10 CPU-s of each analysis here): the tests of the curves draw them, and
    test_the_whole_analysis_draws_without_a_warning draws both."""
    from dapo_exp.analysis import curves as C
    from dapo_exp.analysis import effects as E

    monkeypatch.setattr(C, "write_figures", lambda *a, **k: [])
    drawn = []
    pick = E.forest_figure
    monkeypatch.setattr(E, "forest_figure", lambda *a, **k: drawn.append(pick(*a, **k)) or drawn[-1])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        result = A.run_analysis(root, out=out)
    assert (out / "figures" / "effects_forest.png") in result.files and len(drawn) == 1
    assert outside(drawn[0]) == []  # drawn without a warning, nothing clipped
    return result, drawn[0]


def _errorbar_rows(ax) -> list[tuple[str, float, float, float, bool]]:
    """Per errorbar of ``ax``, top row first: (its row's tick label, centre, lower end, upper end, filled)."""
    ticks = {round(float(y), 6): t.get_text() for y, t in zip(ax.get_yticks(), ax.get_yticklabels())}
    rows = []
    for c in ax.containers:
        (x, y), = c.lines[0].get_xydata()
        (lo, _), (hi, _) = c.lines[2][0].get_segments()[0] if c.has_xerr else ((np.nan, 0), (np.nan, 0))
        filled = to_rgba(c.lines[0].get_markerfacecolor()) != to_rgba("white")  # open marker: not shown
        rows.append((y, ticks[round(float(y), 6)], float(x), float(lo), float(hi), filled))
    return [r[1:] for r in sorted(rows, key=lambda r: -r[0])]


def _right_notes(fig) -> list[str]:
    """The labels of the right-hand axis (beside each row), top row first."""
    ax = fig.axes[1]
    return [t.get_text() for _, t in sorted(zip(ax.get_yticks(), ax.get_yticklabels()), key=lambda yt: -yt[0])]


def _no_aliasing_text(fig) -> None:
    text = "\n".join(t.get_text() for t in fig.findobj(Text))
    assert "aliased" not in text and "can be estimated" not in text


def test_a_ladders_forest_draws_each_rung_against_the_one_below(tmp_path, monkeypatch):
    root = tmp_path / "multirun" / "ladder"
    make_sweep(root, LADDER_SPEC)
    result, fig = _sweep_forest(root, tmp_path / "analysis", monkeypatch)
    rungs = A.rung_contrasts(A.load_runs(root))
    assert len(rungs) == 3 and result.contrasts.attrs["kind"] == "ladder"
    ax = fig.axes[0]
    rows = _errorbar_rows(ax)
    assert [r[0].replace("\n", " ") for r in rows] == [
        "clip − grpo (+ Clip-Higher)", "clip_ds − clip (+ Dynamic Sampling)",
        "full − clip_ds (+ Token-level Policy Gradient Loss + Soft Overlong Punishment)"]
    for (_, x, lo, hi, filled), (_, r) in zip(rows, rungs.iterrows()):
        assert (x, lo, hi) == pytest.approx((r["diff"], r["lo"], r["hi"]))
        assert filled == (r["verdict"] == "difference shown")
    assert any(line.get_xdata()[0] == 0 == line.get_xdata()[-1] for line in ax.get_lines())  # the zero line
    assert "95% CI" in ax.get_xlabel() and "paired t" in ax.get_xlabel() and "(pp)" in ax.get_xlabel()
    assert "each rung against the one below" in ax.get_title()
    assert _right_notes(fig) == [f"MDE {m:.1f}" for m in rungs["mde"]]  # the MDE beside each rung
    _no_aliasing_text(fig)


def test_an_irregular_sets_forest_draws_the_pairs_with_holm_adjusted_p(tmp_path, monkeypatch):
    root = tmp_path / "multirun" / "irregular"
    make_sweep(root, IRREGULAR_SPEC)
    _, fig = _sweep_forest(root, tmp_path / "analysis", monkeypatch)
    pairs = A.pairwise_contrasts(A.load_runs(root))
    assert len(pairs) == 3 and pairs.attrs["kind"] == "irregular"
    ax = fig.axes[0]
    rows = _errorbar_rows(ax)
    assert [r[0].replace("\n", " ") for r in rows] == [
        "full_no_ds − full_no_clip (+ Clip-Higher; − Dynamic Sampling)",
        "full_no_tl − full_no_clip (+ Clip-Higher; − Token-level Policy Gradient Loss)",
        "full_no_tl − full_no_ds (+ Dynamic Sampling; − Token-level Policy Gradient Loss)"]
    for (_, x, lo, hi, filled), (_, r) in zip(rows, pairs.iterrows()):
        assert (x, lo, hi) == pytest.approx((r["diff"], r["lo"], r["hi"]))
        assert filled == (r["p_holm"] < 0.05)  # the verdict reads the Holm-adjusted p
    assert _right_notes(fig) == [f"Holm p {p:.2g}" for p in pairs["p_holm"]]
    assert "Holm" in ax.get_title() and "3 pairs" in ax.get_title() and "unadjusted" in ax.get_xlabel()
    _no_aliasing_text(fig)


def test_a_one_seed_sets_forest_draws_the_estimates_and_says_why_no_interval(sweeps, monkeypatch, tmp_path):
    _, fig = _sweep_forest(sweeps["one seed"], tmp_path / "analysis", monkeypatch)
    ax = fig.axes[0]
    rows = _errorbar_rows(ax)
    assert len(rows) == 10 and all(np.isnan(lo) and np.isnan(hi) for _, _, lo, hi, _ in rows)
    assert "CI" not in ax.get_xlabel() and "no interval" in ax.get_xlabel() and "1 seed" in ax.get_xlabel()
    _no_aliasing_text(fig)


def test_a_two_level_design_keeps_its_forest_of_effects(tmp_path, monkeypatch):
    root = _fractional(tmp_path / "multirun" / "fractional", (0, 1))
    result, fig = _sweep_forest(root, tmp_path / "analysis", monkeypatch)
    assert result.contrasts.empty and result.contrasts.attrs["kind"] == "two-level"
    (ax,) = fig.axes
    t = result.effects.table
    assert ytick_texts(ax) == t["term"].tolist()  # every term estimated, a row each
    whiskers = sorted(tuple(line.get_xdata()) for line in ax.get_lines() if len(line.get_xdata()) == 2
                      and line.get_ydata()[0] == line.get_ydata()[1])
    assert np.allclose(whiskers, sorted(zip(t["lo"], t["hi"])))
    assert "main effects" in ax.get_title() and "95% CI" in ax.get_xlabel()


def test_forest_of_a_half_fraction_has_every_term_and_no_note(tmp_path):
    eff = A.fit_effects(A.load_runs(_fractional(tmp_path / "fractional", (0, 1))))
    fig = plot_effects(eff)
    assert outside(fig) == []
    (ax,) = fig.axes
    assert len(ytick_texts(ax)) == 15 and "95% CI" in ax.get_xlabel()
    assert "main effects" in ax.get_title() and "two-way interactions" in ax.get_title()


def test_forest_without_residual_df_says_it_draws_no_interval(tmp_path):
    """One seed of a half fraction: 16 runs, 16 parameters; estimates but no interval, and the label says so."""
    eff = A.fit_effects(A.load_runs(_fractional(tmp_path / "fractional1", (0,))))
    assert eff.df_resid == 0 and eff.table["effect"].notna().all()
    fig = plot_effects(eff)
    assert outside(fig) == []
    (ax,) = fig.axes
    assert "CI" not in ax.get_xlabel() and "no interval" in ax.get_xlabel()
    assert "Holm" not in ax.get_title()


@pytest.mark.parametrize("sweep", ["multi-seed", "one seed"])
def test_the_whole_analysis_draws_without_a_warning(sweeps, sweep, tmp_path):
    """What ``python -m dapo_exp.analysis`` and the sweep's callback write: PNG and SVG, no warning."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = A.run_analysis(sweeps[sweep], out=tmp_path / "analysis")
    assert [str(w.message) for w in caught] == []
    pngs = sorted(p.name for p in result.files if p.suffix == ".png")
    assert "curves_vs_step.png" in pngs and "effects_forest.png" in pngs


def test_the_curves_say_what_ran_in_words_and_apart(sweeps):
    """The title names the sweep, task and model; panels have readable names; each configuration its own
    line style besides its colour (curves that overlap stay apart)."""
    data = A.load_runs(sweeps["multi-seed"])
    fig = A.plot_curves(data)
    runs = data.included
    first = fig.get_suptitle().splitlines()[0]
    for col in ("sweep", "task", "model"):
        for v in runs[col].dropna().unique():
            assert str(v) in first, (col, v, first)
    titles = [ax.get_title() for ax in fig.axes if ax.get_visible()]
    assert "held-out accuracy" in titles and "policy entropy" in titles and not [t for t in titles if "/" in t]
    lines = fig.axes[0].get_lines()
    looks = {(line.get_color(), line.get_linestyle()) for line in lines}
    assert len(lines) >= 4 and len(looks) == len(lines)  # no two configurations look alike
    assert len({line.get_linestyle() for line in lines[:4]}) == 4  # four styles before any repeats
