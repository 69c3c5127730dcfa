"""Every figure the analysis writes is legible at its default size: drawn without a matplotlib
warning (no collapsed layout), no tick label or other text outside the figure, aliased effects
as a note beside the estimated ones, and titles that say what is drawn (no band promised where a
one-seed sweep has none)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from fixtures_runs import LADDER_SWEEP, STANDARD_SWEEP, make_sweep, make_switch_run
from matplotlib.backends.backend_agg import FigureCanvasAgg
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


@pytest.mark.parametrize("sweep", list(SWEEPS))
def test_forest_with_aliased_terms_draws_them_as_a_note(sweeps, sweep):
    eff = A.fit_effects(A.load_runs(sweeps[sweep]))
    aliased = eff.table[eff.table["status"] != "estimated"]["term"].tolist()
    estimated = eff.table[eff.table["status"] == "estimated"]["term"].tolist()
    assert aliased  # presets switch fixes together: some terms are not identified
    fig = plot_effects(eff)
    assert outside(fig) == []
    rows = [t for ax in fig.axes for t in ytick_texts(ax)]
    assert sorted(rows) == sorted(estimated)  # only estimated terms are rows of an axis
    notes = "\n".join(t.get_text() for ax in fig.axes for t in ax.texts)
    for term in aliased:
        assert f"{term}: aliased with" in notes
    # no row of text standing in for a number, no arbitrary axis
    assert not any("aliased" in t for ax in fig.axes for t in ytick_texts(ax))
    if not estimated:
        assert len(fig.axes) == 1 and not fig.axes[0].axison
        assert "no term can be estimated" in fig.axes[0].get_title(loc="left")


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
