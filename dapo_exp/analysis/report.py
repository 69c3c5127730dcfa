"""The whole analysis in one call: runs -> table, effects, figures (used by the CLI and the Hydra callback)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from dapo_exp.analysis.runs import RunSet, load_runs
from dapo_exp.analysis.table import comparison_table, table_markdown, write_table


@dataclass
class AnalysisResult:
    """What :func:`run_analysis` produced."""

    data: RunSet
    table: pd.DataFrame
    markdown: str
    out_dir: Path
    figure_dir: Path
    files: list[Path] = field(default_factory=list)
    figures: bool = True
    # main effects and two-way interactions (dapo_exp.analysis.effects.Effects), None when no switch varies
    effects: Any = None
    # the rungs of a ladder or the Holm-adjusted pairs of an irregular set (dapo_exp.analysis.contrasts);
    # empty for a two-level design or one configuration
    contrasts: pd.DataFrame | None = None
    wandb: dict[str, str] | None = None

    @property
    def n_excluded(self) -> int:
        return self.data.n_excluded

    def text(self, width: int = 120) -> str:
        """What the command line and the callback print, in lines of at most ``width`` characters
        (paths excepted): a ladder's rungs first (each against the one below,
        :func:`dapo_exp.analysis.contrasts.contrasts_text`), the table's and the effects' terminal forms,
        runs, excluded count, paths. The files hold the full tables
        (:func:`dapo_exp.analysis.table.table_text`)."""
        from dapo_exp.analysis.contrasts import LADDER_KIND, contrasts_text
        from dapo_exp.analysis.effects import effects_text
        from dapo_exp.analysis.table import table_text, wrap_text

        eff = f"\n{effects_text(self.effects, width)}\n" if self.effects is not None else "\n"
        con = self.contrasts if self.contrasts is not None else pd.DataFrame()
        if len(con) and self.effects is not None and not _any_estimated(self.effects):
            # a ladder or an irregular set: no single switch's effect is estimable, and ten lines of aliasing
            # would bury the contrasts that answer the question (effects.md keeps them)
            which = "the rung contrasts above" if con.attrs.get("kind") == LADDER_KIND else "the pairwise contrasts"
            eff = "\n" + "\n".join(wrap_text(
                "Effects of single switches: none can be estimated from these configurations (switches change "
                f"together, each fix entering with those before it); {which} are what these runs can show "
                f"(the aliasing: {self.out_dir / 'effects.md'})", width)) + "\n\n"
        runs = "\n".join(wrap_text(f"runs: {self.data.describe()} (excluded from the statistics: {self.n_excluded})",
                                   width))
        files = f"effects: {self.out_dir / 'effects.md'} (.csv, .tex)\n" if self.effects is not None else ""
        rungs = contrasts_text(con, width)
        rungs = f"{rungs}\n" if rungs else ""
        if len(con):
            what = ("rungs" if con.attrs.get("kind") == LADDER_KIND
                    else f"{len(con)} pairs, Holm-adjusted (neither a ladder nor a two-level design)")
            files += f"contrasts: {self.out_dir / 'contrasts.md'} (.csv; {what})\n"
        wb = f"W&B summary run: {self.wandb['id']} (group {self.wandb['group']}, {self.wandb['dir']})\n" if self.wandb else ""
        return (
            f"{rungs}{table_text(self.table, width)}{eff}"
            f"{runs}\n"
            f"table: {self.out_dir / 'table.md'} (.csv, .tex)\n{files}"
            f"figures: {self.figure_dir if self.figures else '(not drawn)'}\n{wb}"
        )


def _any_estimated(eff) -> bool:
    """Whether the effects' table holds at least one estimated term."""
    return bool(len(eff.table)) and bool((eff.table["status"] == "estimated").any())


def run_analysis(
    paths: str | os.PathLike | Sequence[str | os.PathLike] | None = None,
    *,
    wandb: str | None = None,
    out: str | os.PathLike,
    group: str | None = None,
    tags: list[str] | None = None,
    cache_dir: str | os.PathLike | None = None,
    refresh: bool = False,
    band: str = "ci",
    end_window: int = 1,
    figures: bool = True,
    ci: str = "t",
    bootstrap: dict | None = None,
    effects_model: str = "two-way",
    wandb_log: dict | None = None,
    margin: float | None = None,
) -> AnalysisResult:
    """Load runs (local ``paths`` or a ``wandb`` spec), write ``table.{md,csv,tex}``, ``runs.csv``,
    ``effects.{md,csv,tex}`` (when a switch varies), ``contrasts.{md,csv}`` (a ladder's rungs, or an
    irregular set's Holm-adjusted pairs: :func:`dapo_exp.analysis.contrasts.configuration_contrasts`) and figures.

    ``out/figures/curves_vs_{step,rollouts,tokens}.{png,svg}`` and ``effects_forest.{png,svg}`` (the
    contrasts' forest for a ladder or an irregular set, else the effects':
    :func:`dapo_exp.analysis.effects.forest_figure`).
    ``ci``: ``t`` or ``bootstrap`` (table and effects; ``bootstrap``: its keyword arguments).
    ``margin``: equivalence margin of the differences to the baseline, in pp (default
    :data:`dapo_exp.analysis.verdicts.DEFAULT_MARGIN`, 5).
    ``wandb_log``: keyword arguments of :func:`dapo_exp.analysis.wandb_writer.log_summary_run`
    (project, mode, group ...) to log the result as a W&B summary run; None: not logged.
    Returns an :class:`AnalysisResult`; raises when no run is found.
    """
    data = _load(paths, wandb, group, tags, cache_dir, refresh, end_window)
    out_dir = Path(out)
    table, con, files = _tables(data, out_dir, ci, bootstrap, margin)
    fig_dir = out_dir / "figures"
    eff = _effects(data, effects_model, ci, bootstrap)
    if eff is not None:
        from dapo_exp.analysis.effects import write_effects

        files += list(write_effects(eff, out_dir).values())
    if figures:
        from dapo_exp.analysis.curves import write_figures

        files += write_figures(data, fig_dir, band=band)
        if eff is not None or len(con):
            from dapo_exp.analysis.effects import write_forest

            files += write_forest(eff, fig_dir, contrasts=con)
    if ci == "bootstrap":
        files.append(_write_problem_share(data, table, eff, effects_model, bootstrap or {}, out_dir))
    result = AnalysisResult(data, table, table_markdown(table), out_dir, fig_dir, files, figures, eff, con)
    if wandb_log is not None:
        from dapo_exp.analysis.wandb_writer import log_summary_run

        result.wandb = log_summary_run(result, **wandb_log)
    return result


def _tables(data: RunSet, out_dir: Path, ci: str, bootstrap: dict | None,
            margin: float | None) -> tuple[pd.DataFrame, pd.DataFrame, list[Path]]:
    """The comparison table and the contrasts (a ladder's rungs, an irregular set's pairs), written with
    ``runs.csv``: (table, contrasts, the files)."""
    from dapo_exp.analysis.contrasts import configuration_contrasts, write_contrasts
    from dapo_exp.analysis.verdicts import DEFAULT_MARGIN

    margin = DEFAULT_MARGIN if margin is None else margin
    table = comparison_table(data, ci=ci, bootstrap=bootstrap, margin=margin)
    files = list(write_table(table, out_dir).values())
    runs_csv = out_dir / "runs.csv"
    data.runs.to_csv(runs_csv, index=False)
    con = configuration_contrasts(data, margin=margin)
    return table, con, [*files, runs_csv, *write_contrasts(con, out_dir).values()]


def _load(paths, wandb, group, tags, cache_dir, refresh, end_window) -> RunSet:
    """The runs of local ``paths`` or of a W&B spec (exactly one of them); raises when there are none."""
    if (paths is None or paths == []) == (wandb is None):
        raise ValueError("give run/sweep directories or a W&B spec (exactly one of them)")
    if wandb is not None:
        from dapo_exp.analysis.wandb_reader import DEFAULT_CACHE, load_wandb

        data = load_wandb(
            wandb, group=group, tags=tags, cache_dir=cache_dir or DEFAULT_CACHE, refresh=refresh, end_window=end_window
        )
    else:
        data = load_runs(paths, end_window=end_window)  # type: ignore[arg-type]
    if not len(data.runs):
        raise FileNotFoundError(f"no runs found in {paths if wandb is None else wandb}")
    return data


def _effects(data: RunSet, model: str, ci: str, bootstrap: dict | None):
    """The effects on final accuracy when at least one switch varies among the included runs, else None."""
    from dapo_exp.analysis.design import switches_in
    from dapo_exp.analysis.effects import fit_effects
    from dapo_exp.analysis.runs import with_endpoint
    from dapo_exp.analysis.table import DIFF_KEY, TABLE_METRICS

    inc = with_endpoint(data.included)
    src = next(m.source for m in TABLE_METRICS if m.key == DIFF_KEY)
    switches = switches_in(inc) if len(inc) else ()
    if not len(inc) or src not in inc or inc[list(switches)].isna().any().any():
        return None
    usable = inc.dropna(subset=[src])
    if not len(usable) or all(usable[s].nunique() < 2 for s in switches):
        return None
    return fit_effects(data, DIFF_KEY, model=model, ci=ci, switches=switches, **(bootstrap or {}))


def _write_problem_share(data, table, eff, effects_model: str, bootstrap: dict, out_dir: Path) -> Path:
    """``problem_share.md``: bootstrap se with and without resampling problems, per configuration,
    per difference to the baseline and per effect (how much of each interval the problem sample makes)."""
    from dapo_exp.analysis import bootstrap as boot

    kw = {k: v for k, v in bootstrap.items() if k in ("B", "seed")}
    cube = boot.eval_cube(data.included)
    contrasts = {}
    if eff is not None:
        from dapo_exp.analysis.effects import contrast_weights

        contrasts = {f"effect: {k}": w for k, w in contrast_weights(eff, data, cube).items()}
    share = boot.problem_share(cube, baseline=table.attrs.get("baseline"), contrasts=contrasts, **kw)
    b = table.attrs.get("bootstrap", {})
    lines = [
        "**How much of the uncertainty comes from the problem sample.** Standard errors (pp) of final avg@k, of "
        "the differences to the baseline and of the effects. se_all: hierarchical bootstrap resampling seeds, "
        "problems and samples; se_no_problems: the same without resampling problems; boot_problem_share = "
        "1 - se_no_problems² / se_all² (an upper bound: resampling problems re-weights each problem's seed and "
        "sample noise too). anova_se, anova_problem_share: the unbiased two-way (seed x problem) method-of-moments "
        "split of the variance of the mean, and the part of it due to which "
        f"{b.get('problems', '?')} problems were evaluated (dapo_exp.analysis.bootstrap.crossed_components). "
        f"Bootstrap: {kw.get('B', boot.DEFAULT_B)} replicates, seed {kw.get('seed', boot.DEFAULT_SEED)}.",
        "",
        share.to_markdown(index=False, floatfmt=".2f") if len(share) else "(nothing to show)",
    ]
    path = out_dir / "problem_share.md"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    share.to_csv(out_dir / "problem_share.csv", index=False)
    return path
