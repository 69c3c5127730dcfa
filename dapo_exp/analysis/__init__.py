"""Analysis of ablation runs: runs -> DataFrames -> the comparison table and curves.

A library: functions return DataFrames and matplotlib Figures; the notebooks,
the command line (``python -m dapo_exp.analysis``) and the Hydra callback only
call it. It reads run directories (:mod:`dapo_exp.rundir`) and W&B; it never
imports the trainer, the rollout engines or torch.

Typical use::

    from dapo_exp import analysis as A
    data = A.load_runs("multirun/four_presets")        # or A.load_wandb("entity/project/group")
    table = A.comparison_table(data)                    # numeric, one row per configuration
    print(A.table_markdown(table))
    fig = A.plot_curves(data, x="rollouts")             # compute-matched curves
    A.write_table(table, "out"); A.write_figures(data, "out/figures")

    eff = A.fit_effects(data)                           # main effects + two-way interactions, aliasing
    con = A.configuration_contrasts(data)               # a ladder's rungs, or all pairs (Holm)
    A.write_effects(eff, "out"); A.write_forest(eff, "out/figures", contrasts=con)

Modules: ``runs`` (local runs, the frames), ``wandb_reader`` (W&B online and
offline), ``stats`` (t intervals), ``table``, ``curves``, ``samples`` (rollout
inspection), ``design`` (two-level designs, aliasing), ``effects`` (which fix
mattered), ``contrasts`` (a ladder's rungs, each against the one below; an irregular set's pairs, Holm),
``bootstrap`` (seeds, problems, samples), ``planning`` (seeds needed),
``verdicts`` (what "no difference shown" ruled out: MDE, equivalence, r; the one-seed line),
``wandb_writer`` (the analysis as a W&B run), ``report`` (everything at once),
``cli``, ``callback``.

The names below are imported on first use, so that ``dapo_exp.analysis.callback``
(instantiated by Hydra for every run) does not pull in pandas or matplotlib.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "runs": (
        "RunRecord",
        "RunSet",
        "find_run_dirs",
        "latest_sweep",
        "load_runs",
        "read_run_dir",
        "records_to_runset",
        "history_wide",
    ),
    "wandb_reader": ("WandbRun", "load_wandb", "read_offline", "fetch_online", "parse_wandb_file", "to_record"),
    "stats": ("Interval", "t_interval", "paired_difference", "welch_difference", "difference"),
    "table": (
        "TABLE_METRICS",
        "TableMetric",
        "LADDER",
        "PAPER_AIME24",
        "PAPER_HEADER",
        "paper_block",
        "comparison_table",
        "format_table",
        "table_markdown",
        "table_latex",
        "write_table",
        "order_labels",
        "baseline_label",
    ),
    "curves": (
        "CURVE_METRICS",
        "X_AXES",
        "label_color",
        "label_colors",
        "xy_frame",
        "curve_frame",
        "plot_curves",
        "write_figures",
    ),
    "samples": ("load_samples", "sample_stats", "sample_examples", "format_examples"),
    "design": ("SWITCH_OPTIONS", "fractional_design", "full_factorial", "job_overrides", "describe_design"),
    "effects": ("Effects", "fit_effects", "format_effects", "effects_markdown", "write_effects", "plot_effects",
                "forest_figure", "write_forest"),
    "contrasts": ("configuration_switches", "ladder", "contrast_kind", "rung_contrasts", "pairwise_contrasts",
                  "holm", "configuration_contrasts", "contrasts_text", "contrasts_markdown", "write_contrasts",
                  "plot_contrasts"),
    "bootstrap": ("SampleCube", "eval_cube", "replicate_means", "config_intervals", "problem_share",
                  "crossed_components"),
    "planning": ("plan", "format_plan", "pilot_variances", "seeds_paired", "seeds_unpaired", "half_widths"),
    "verdicts": ("compare", "mde_paired", "mde_unpaired", "rerun_command", "one_seed_line"),
    "wandb_writer": ("log_summary_run", "summary_group"),
    "report": ("AnalysisResult", "run_analysis"),
}
_WHERE = {name: mod for mod, names in _EXPORTS.items() for name in names}
__all__ = sorted([*_WHERE, "SWITCHES"])


def __getattr__(name: str) -> Any:
    if name == "SWITCHES":  # the registered fixes, read when asked (extensions register later)
        from dapo_exp.fixes import switch_names

        return switch_names()
    if name in _WHERE:
        value = getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
