"""Compare the metric rows of two sets of runs value by value, timing aside.

``python -m dapo_exp.benchmarks.compare_runs A B`` pairs the run directories under ``A`` and
``B`` by their relative path (every directory holding a ``metrics.jsonl``) and compares their
rows in order: the same steps, the same keys, equal values, for every key but wall-clock ones
(``timing_s/*``, the ``*_per_s`` throughputs and the GPU memory peaks ``perf/gpu_mem*``). With ``--also X::Y`` it compares run ``X``
with run ``Y`` of the same side as well (a killed-and-resumed run against its uninterrupted
twin). With ``--new-metrics-ok`` a metric that only ``B``'s rows hold (one a change added) is listed
as added, not counted as a difference. Prints the number of values compared and each difference;
exits 1 on any difference or on a run present on one side only. ``sweeps/checks/refactor_check.sh``
and ``sweeps/checks/slot_check.sh`` make the runs.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path


def is_timing(key: str) -> bool:
    return key.startswith(("timing_s/", "perf/gpu_mem")) or key.endswith("_per_s")


def rows(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]


def runs(root: Path) -> dict[str, Path]:
    return {str(p.parent.relative_to(root)): p.parent for p in sorted(root.rglob("metrics.jsonl"))}


def compare(a: Path, b: Path, name: str, added: set[str] | None = None) -> tuple[int, list[str]]:
    """(values compared, differences) between the rows of runs ``a`` and ``b``; with ``added`` (a set), the
    metrics only ``b``'s rows hold are put there instead of counted as differences."""
    ra, rb = rows(a), rows(b)
    if len(ra) != len(rb):
        return 0, [f"{name}: {len(ra)} rows vs {len(rb)}"]
    n, diffs = 0, []
    for i, (x, y) in enumerate(zip(ra, rb)):
        keys = sorted(k for k in set(x) | set(y) if not is_timing(k))
        for k in keys:
            if added is not None and k not in x:
                added.add(k)
                continue
            n += 1
            vx, vy = x.get(k, "<missing>"), y.get(k, "<missing>")
            same = vx == vy or (isinstance(vx, float) and isinstance(vy, float) and math.isnan(vx) and math.isnan(vy))
            if not same:
                diffs.append(f"{name} row {i} (step {x.get('step')}): {k} {vx!r} vs {vy!r}")
    return n, diffs


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("a", type=Path)
    p.add_argument("b", type=Path)
    p.add_argument("--also", action="append", default=[], metavar="X::Y",
                   help="also compare run X with run Y within each side (relative paths)")
    p.add_argument("--new-metrics-ok", action="store_true",
                   help="list the metrics only B's rows hold as added instead of counting them as differences")
    args = p.parse_args(argv)
    added: set[str] | None = set() if args.new_metrics_ok else None
    ra, rb = runs(args.a), runs(args.b)
    total, diffs = 0, [f"{name}: only in {args.a if name in ra else args.b}" for name in sorted(set(ra) ^ set(rb))]
    pairs = [(ra[n], rb[n], n) for n in sorted(set(ra) & set(rb))]
    for spec in args.also:
        x, y = spec.split("::", 1)
        pairs += [(side[x], side[y], f"{x} vs {y} ({label})") for side, label in ((ra, "A"), (rb, "B"))]
    for x, y, name in pairs:
        n, d = compare(x, y, name, added)
        total, diffs = total + n, diffs + d
    for d in diffs:
        print(d)
    if added:
        print(f"metrics only B logs (added): {', '.join(sorted(added))}")
    print(f"{len(pairs)} run pairs, {total} metric values compared (timing aside), {len(diffs)} differences")
    return 1 if diffs else 0


if __name__ == "__main__":
    sys.exit(main())
