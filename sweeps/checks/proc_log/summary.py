"""Summarise a per-process CPU log (sitecustomize.py beside this file): CPU seconds by kind of process, then the
costliest command lines. ``python sweeps/checks/proc_log/summary.py <procs.tsv> [--top N]``."""

import argparse

import pandas as pd


def kind(argv: str) -> str:
    """What a logged process was, from its command line."""
    words = argv.split()
    first = words[0] if words else ""
    if first.endswith("run.py"):
        return "python run.py -m (a sweep; in-process jobs included)" if words[1:2] == ["-m"] else "python run.py"
    if first == "-c":
        return "pytest-xdist workers (the in-process tests)"
    if "/pip/" in first:
        return "pip (the installs)"
    if "submitit" in first:
        return "submitit jobs"
    if "ipykernel" in argv:
        return "notebook kernels"
    if "pytest" in first:
        return "pytest commands"
    return first.rsplit("/", 1)[-1] or "(no argv)"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("log")
    ap.add_argument("--top", type=int, default=20)
    args = ap.parse_args()
    t = pd.read_csv(args.log, sep="\t", names=["pid", "ppid", "cpu", "children_cpu", "wall", "argv"],
                    quoting=3, keep_default_na=False)
    t["kind"] = t.argv.map(kind)
    print(f"{len(t)} processes, {t.cpu.sum():.0f} CPU-s of their own\n")
    by = t.groupby("kind").agg(processes=("cpu", "size"), cpu_s=("cpu", "sum")).sort_values("cpu_s", ascending=False)
    print(by.round(0).to_markdown())
    print()
    top = t.sort_values("cpu", ascending=False).head(args.top)
    print(top[["cpu", "wall", "argv"]].assign(argv=top.argv.str.slice(0, 160)).to_markdown(index=False))


if __name__ == "__main__":
    main()
