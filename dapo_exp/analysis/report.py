"""The whole analysis in one call: runs -> table files and figures (used by the CLI and the Hydra callback)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

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

    @property
    def n_excluded(self) -> int:
        return self.data.n_excluded

    def text(self) -> str:
        """What the command line and the callback print: table, runs, excluded count, paths."""
        return (
            f"{self.markdown}\n"
            f"runs: {self.data.describe()} (excluded from the statistics: {self.n_excluded})\n"
            f"table: {self.out_dir / 'table.md'} (.csv, .tex)\n"
            f"figures: {self.figure_dir if self.figures else '(not drawn)'}\n"
        )


def run_analysis(
    paths: str | os.PathLike | Sequence[str | os.PathLike] | None = None,
    *,
    wandb: str | None = None,
    out: str | os.PathLike,
    group: str | None = None,
    tags: list[str] | None = None,
    cache_dir: str | os.PathLike | None = None,
    refresh: bool = False,
    band: str = "minmax",
    end_window: int = 1,
    figures: bool = True,
) -> AnalysisResult:
    """Load runs (local ``paths`` or a ``wandb`` spec), write ``table.{md,csv,tex}``, ``runs.csv`` and figures.

    ``out/figures/curves_vs_{step,rollouts,tokens}.{png,svg}``. Returns an
    :class:`AnalysisResult`; raises when no run is found.
    """
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
    out_dir = Path(out)
    table = comparison_table(data)
    files = list(write_table(table, out_dir).values())
    runs_csv = out_dir / "runs.csv"
    data.runs.to_csv(runs_csv, index=False)
    files.append(runs_csv)
    fig_dir = out_dir / "figures"
    if figures:
        from dapo_exp.analysis.curves import write_figures

        files += write_figures(data, fig_dir, band=band)
    return AnalysisResult(data, table, table_markdown(table), out_dir, fig_dir, files, figures)
