"""Command line.

``python -m dapo_exp.analysis <sweep dir | run dirs...> --out DIR`` (or ``--wandb
entity/project[/group]``): writes table.md / table.csv / table.tex, runs.csv,
effects.md / .csv / .tex (when switches vary), figures/curves_vs_*.{png,svg} and
figures/effects_forest.{png,svg} under ``--out``, and prints the tables.

``--margin M`` (default 5 pp): the equivalence margin of the differences to the baseline; each
"no difference shown" then gives its MDE and "equivalent within ±M" or "not shown equivalent"
(:mod:`dapo_exp.analysis.verdicts`). A sweep with one seed per configuration gets a first line
saying nothing can be concluded and the command that adds the seeds ``plan`` recommends.

Subcommands:

- ``python -m dapo_exp.analysis plan <pilot sweep dir | table.csv> --delta 5``: seeds needed
  for power 0.8, paired and unpaired, the seeds to add and the half-widths N seeds would give
  (:mod:`dapo_exp.analysis.planning`); ``--paired-sd SD`` (a measured sd of per-seed differences,
  pp; from one seed per configuration a default measured on the fractional sweep stands in)
  and ``--correlation R`` (for unpaired counts without a between-seed sd);
- ``python -m dapo_exp.analysis design fractional|full``: the configurations of a two-level
  design as Hydra overrides, one line each (:mod:`dapo_exp.analysis.design`);
- ``python -m dapo_exp.analysis study <sweep dir> --study clip_higher``: one fix against its
  ablation on its testbed regime, the mechanism metrics paired by seed
  (:mod:`dapo_exp.analysis.studies`); writes study.md / study.csv and the curves. ``--margin M``
  (accuracy, points) and ``--margin-for METRIC=M`` (other metrics, their unit) set the equivalence
  margins; the study's positive control is reported when its runs are in the sweep.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from dapo_exp.analysis.curves import BANDS


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m dapo_exp.analysis",
        description="Comparison table and curves of GRPO/DAPO ablation runs.",
    )
    p.add_argument("paths", nargs="*", help="a sweep directory (searched recursively) or run directories")
    p.add_argument(
        "--wandb",
        metavar="SPEC",
        help="entity/project[/group] (online, wandb.Api, cached) or a local directory of offline W&B runs",
    )
    p.add_argument("--group", help="W&B group (when not in SPEC)")
    p.add_argument("--tags", nargs="*", default=None, help="W&B tags a run must all have")
    p.add_argument("--out", help="output directory (default: <sweep dir>/analysis, or analysis_out/)")
    p.add_argument("--cache-dir", help="W&B download cache (default ~/.cache/dapo_exp/wandb or $DAPO_WANDB_CACHE)")
    p.add_argument("--refresh", action="store_true", help="download W&B runs again, ignoring the cache")
    p.add_argument("--band", choices=tuple(BANDS), default="ci", help="band of the curves (ci: the 95%% t interval the table uses)")
    p.add_argument(
        "--end-window", type=int, default=1, help="training metrics 'at the end' = mean of the last N logged values"
    )
    p.add_argument("--no-figures", action="store_true", help="table only")
    p.add_argument(
        "--ci",
        choices=("t", "bootstrap"),
        default="t",
        help="intervals of final accuracy, its differences and the effects: t over seeds (default), or the "
        "hierarchical bootstrap over seeds, problems and samples (needs eval_samples.jsonl)",
    )
    p.add_argument("--bootstrap-reps", type=int, default=2000, help="bootstrap replicates (default 2000)")
    p.add_argument("--bootstrap-seed", type=int, default=0, help="bootstrap random seed (default 0)")
    p.add_argument(
        "--bootstrap-levels",
        default="seed,problem,sample",
        help="levels resampled, comma-separated, from seed,problem,sample (default: all three)",
    )
    p.add_argument(
        "--effects-model",
        choices=("two-way", "main"),
        default="two-way",
        help="effects: main effects and two-way interactions (default) or main effects only",
    )
    p.add_argument(
        "--margin",
        type=float,
        default=None,
        help="equivalence margin in percentage points for the differences to the baseline (two one-sided tests; "
        "default 5): 'no difference shown' then says 'equivalent within ±m' or 'not shown equivalent'",
    )
    p.add_argument(
        "--wandb-log",
        action="store_true",
        help="log the table, effects and figures as a W&B run (job_type analysis) in the sweep's group",
    )
    p.add_argument("--wandb-project", default="dapo-exp", help="W&B project of the summary run")
    p.add_argument("--wandb-mode", choices=("offline", "online"), default="offline", help="W&B mode (default offline)")
    p.add_argument("--wandb-group", help="W&B group of the summary run (default: the sweep's)")
    return p


def design_main(argv: list[str]) -> int:
    from dapo_exp.analysis.design import DESIGNS, describe_design, job_overrides, make_design

    p = argparse.ArgumentParser(
        prog="python -m dapo_exp.analysis design",
        description="Print the configurations of a two-level design over the five switches as Hydra overrides.",
    )
    p.add_argument("name", choices=DESIGNS, help="fractional: 2^(5-1), e = abcd (16); full: 2^5 (32)")
    p.add_argument("--describe", action="store_true", help="print the design's aliasing instead of the overrides")
    p.add_argument("--switches", help="comma-separated registered switches to use as the factors instead of "
                   "DAPO's five (e.g. dr_grpo_adv,gspo,top_entropy: 2^(k-1) or 2^k); they must combine")
    args = p.parse_args(argv)
    switches = None if args.switches is None else [s.strip() for s in args.switches.split(",") if s.strip()]
    try:
        d = make_design(args.name, switches)
    except ValueError as e:
        p.error(str(e))
    print(describe_design(d, list(d.columns)).text() if args.describe else "\n".join(job_overrides(d)))
    return 0


def _number_or_map(text: str | None, option: str):
    """``4.4`` -> 4.4; ``a=1,b=2`` -> {"a": 1.0, "b": 2.0}; None -> None (ValueError when malformed)."""
    if text is None:
        return None
    try:
        if "=" not in text:
            return float(text)
        return {k.strip(): float(v) for k, v in (item.rsplit("=", 1) for item in text.split(",") if item)}
    except ValueError:
        raise ValueError(f"{option} {text!r}: give a number or key=number[,key=number]") from None


def plan_main(argv: list[str]) -> int:
    from dapo_exp.analysis.planning import DEFAULT_DELTA, DEFAULT_METRICS, DEFAULT_N, format_plan, plan

    p = argparse.ArgumentParser(
        prog="python -m dapo_exp.analysis plan",
        description="Seeds needed to detect a difference of --delta with power 0.8, from a pilot sweep's variances.",
    )
    p.add_argument("pilot", nargs="+", help="pilot sweep directory (or run dirs), or a table.csv of the analysis")
    p.add_argument("--delta", type=float, default=DEFAULT_DELTA,
                   help=f"difference to detect, in the table's unit (pp for accuracy; default {DEFAULT_DELTA:g})")
    p.add_argument("--paired-sd", default=None, metavar="SD",
                   help="sd of per-seed differences between two configurations, in the table's unit (pp for "
                        "accuracy), e.g. measured on another sweep: one number for every metric, or "
                        "key=sd,key=sd; replaces the pilot's (default: the pilot's, or, from one seed per "
                        "configuration, the one measured on the 2026-11-22 fractional sweep)")
    p.add_argument("--correlation", type=float, default=0.0, metavar="R",
                   help="correlation of two configurations' per-seed values, for the unpaired counts when the pilot "
                        "has no between-seed sd: sd per arm = paired sd / sqrt(2 (1 - R)) (default 0)")
    p.add_argument("--power", type=float, default=0.8)
    p.add_argument("--alpha", type=float, default=0.05)
    p.add_argument("--metrics", default=",".join(DEFAULT_METRICS), help="table metric keys, comma-separated")
    p.add_argument("--n", default=",".join(map(str, DEFAULT_N)), help="seed counts for the half-widths")
    args = p.parse_args(argv)
    src = args.pilot[0] if len(args.pilot) == 1 else args.pilot
    try:
        paired_sd = _number_or_map(args.paired_sd, "--paired-sd")
        out = plan(src, args.delta, metrics=args.metrics.split(","), ns=[int(x) for x in args.n.split(",")],
                   power=args.power, alpha=args.alpha, paired_sd=paired_sd, correlation=args.correlation)
    except (FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(format_plan(out), end="")
    return 0


def study_main(argv: list[str]) -> int:
    from dapo_exp.analysis.studies import STUDIES, study_figure, study_markdown, study_table

    p = argparse.ArgumentParser(
        prog="python -m dapo_exp.analysis study",
        description="One fix against its ablation on its testbed regime: mechanism metrics paired by seed.",
    )
    p.add_argument("paths", nargs="+", help="the study's sweep directory (or run dirs)")
    p.add_argument("--study", required=True, choices=sorted(STUDIES), help="which fix's study")
    p.add_argument("--out", help="output directory (default: <sweep dir>/study)")
    p.add_argument("--margin", type=float, default=None,
                   help="equivalence margin for held-out accuracy, in points (two one-sided tests; default 5)")
    p.add_argument("--margin-for", action="append", default=[], metavar="METRIC=M",
                   help="equivalence margin of another metric, in that metric's own unit (shares 0-1, tokens, "
                        "nats), e.g. avg/diag/style_step=0.02; repeat or comma-separate")
    args = p.parse_args(argv)
    from dapo_exp.analysis.runs import load_runs

    study = STUDIES[args.study]
    runs = load_runs(args.paths[0] if len(args.paths) == 1 else args.paths)
    from dapo_exp.analysis.verdicts import DEFAULT_MARGIN

    try:
        margins = {}
        for item in ",".join(args.margin_for).split(","):
            if item:
                m = _number_or_map(item, "--margin-for")
                if not isinstance(m, dict):
                    raise ValueError(f"--margin-for {item!r}: give METRIC=M")
                margins.update(m)
        table = study_table(runs, study, margin=DEFAULT_MARGIN if args.margin is None else args.margin,
                            margins=margins)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    out = Path(args.out or Path(args.paths[0]) / "study")
    out.mkdir(parents=True, exist_ok=True)
    text = study_markdown(table, study)
    (out / "study.md").write_text(text)
    table.to_csv(out / "study.csv", index=False)
    fig = study_figure(runs, study)
    for fmt in ("png", "svg"):
        fig.savefig(out / f"study_curves.{fmt}", dpi=130)
    print(text, end="")
    print(f"[dapo-exp] wrote {out}/study.md, study.csv, study_curves.png/svg")
    return 0


SUBCOMMANDS = {"design": design_main, "plan": plan_main, "study": study_main}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in SUBCOMMANDS:
        return SUBCOMMANDS[argv[0]](argv[1:])
    args = build_parser().parse_args(argv)
    if bool(args.paths) == bool(args.wandb):
        build_parser().error("give run/sweep directories or --wandb SPEC (exactly one of them)")
    out = args.out
    if out is None:
        out = str(Path(args.paths[0]) / "analysis") if len(args.paths) == 1 and not args.wandb else "analysis_out"
    from dapo_exp.analysis.report import run_analysis

    try:
        result = run_analysis(
            args.paths or None,
            wandb=args.wandb,
            out=out,
            group=args.group,
            tags=args.tags,
            cache_dir=args.cache_dir,
            refresh=args.refresh,
            band=args.band,
            end_window=args.end_window,
            figures=not args.no_figures,
            ci=args.ci,
            bootstrap={"B": args.bootstrap_reps, "seed": args.bootstrap_seed,
                       "levels": tuple(x for x in args.bootstrap_levels.split(",") if x)},
            effects_model=args.effects_model,
            margin=args.margin,
            wandb_log={"project": args.wandb_project, "mode": args.wandb_mode, "group": args.wandb_group}
            if args.wandb_log
            else None,
        )
    except (FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # a full disk, a read-only sweep folder: one line, the runs untouched
        where = f" {exc.filename}" if getattr(exc, "filename", None) else f" into {out}"
        print(f"error: could not write the analysis{where}: {exc.strerror or exc}. The runs are untouched; free "
              f"some space or write the analysis elsewhere with --out DIR", file=sys.stderr)
        return 1
    print(result.text())
    return 0
