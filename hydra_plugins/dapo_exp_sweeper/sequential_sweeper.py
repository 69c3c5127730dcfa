"""``hydra/sweeper=sequential``: a sweep that adds seeds until each comparison is decided.

``python run.py -m fixes=grpo,clip hydra/sweeper=sequential experiment=toy_fast`` runs the configurations'
seeds in rounds through the configured launcher, reads the runs back after each round and stops each
comparison when its anytime-valid interval decides it (:mod:`dapo_exp.analysis.sequential_sweep` reads
and records, :mod:`dapo_exp.analysis.sequential` is the statistics). It prints the rule at the start and one
line per comparison per round, and writes ``<sweep>/sequential.json``. Re-running the same command
resumes it: the recorded rounds replay on the seeds the record gives them (finished runs are not launched
again; a killed run resumes from its checkpoint), so the decisions are the same, and new rounds are appended.
The record is append-only: a re-run under another rule (``alpha``, ``margin``, ...) or with other
configurations is refused, naming what the record holds.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

from hydra.core.utils import JobReturn
from hydra.errors import HydraException
from hydra.plugins.launcher import Launcher
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf

log = logging.getLogger(__name__)


class SequentialSweeper(Sweeper):
    """Seeds in rounds until every comparison is decided (or its seed budget is spent)."""

    def __init__(self, alpha: float = 0.05, margin: float = 5.0, phi: float = 0.1, first_seeds: int = 3,
                 max_seeds: int = 20, round_seeds: int | None = None, params: dict[str, str] | None = None) -> None:
        from dapo_exp.analysis.sequential_sweep import settings

        super().__init__()
        try:
            self.rule, self.round_seeds = settings({"alpha": alpha, "margin": margin, "phi": phi,
                                                    "first_seeds": first_seeds, "max_seeds": max_seeds,
                                                    "round_seeds": round_seeds})
        except ValueError as exc:
            raise HydraException(str(exc)) from None
        # the fixed design's default seeds (conf/config.yaml: hydra.sweeper.params.seed) do not apply here
        self.params = {k: v for k, v in (params or {}).items() if k != "seed"}
        self.config: DictConfig | None = None
        self.launcher: Launcher | None = None
        self.hydra_context: HydraContext | None = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        from hydra.core.plugins import Plugins

        self.hydra_context, self.config = hydra_context, config
        self.launcher = Plugins.instance().instantiate_launcher(hydra_context=hydra_context,
                                                                task_function=task_function, config=config)

    def _configurations(self, arguments: list[str]) -> list[list[str]]:
        """The configurations the command's ``arguments`` (after the sweeper's ``params``) expand to, as the
        basic sweeper would expand them (:func:`dapo_exp.hydra_setup.expand_sweep`; ``glob(...)`` resolved
        against the config tree); seeds are the sweeper's to add, and one configuration compares nothing."""
        from hydra.core.override_parser.overrides_parser import OverridesParser

        from dapo_exp.analysis.sequential_sweep import ONE_CONFIGURATION, SEEDS_REFUSED
        from dapo_exp.hydra_setup import expand_sweep

        parser = OverridesParser.create(config_loader=self.hydra_context.config_loader)
        overrides = parser.parse_overrides([f"{k}={v}" for k, v in self.params.items()] + list(arguments))
        if any(o.get_key_element().lstrip("+~") == "seed" for o in overrides):
            raise HydraException(SEEDS_REFUSED)
        configs = expand_sweep(overrides)
        if len(configs) < 2:
            raise HydraException(ONE_CONFIGURATION)
        return configs

    def _per_round(self, active: int) -> int:
        """Seeds added per round to each configuration still running: ``round_seeds``, else enough to
        fill the launcher's workers."""
        if self.round_seeds is not None:
            return self.round_seeds
        launcher = OmegaConf.select(self.config, "hydra.launcher", default=None) or {}
        target = str(launcher.get("_target_", ""))
        workers = launcher.get("jobs") or launcher.get("n_jobs") or launcher.get("array_parallelism")
        if workers is None and target.endswith("ParallelLauncher"):
            from hydra_plugins.dapo_exp_launcher.parallel_launcher import available_cores

            workers = launcher.get("cores") or available_cores()
        return max(1, math.ceil(int(workers or 1) / max(1, active)))

    def sweep(self, arguments: list[str]) -> Any:
        from dapo_exp.analysis import sequential_sweep as ss

        configs = self._configurations(arguments)
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        common = set.intersection(*(set(c) for c in configs))  # the overrides every configuration shares
        names = [" ".join(o for o in c if o not in common) for c in configs]
        try:
            recorded = ss.recorded_rounds(sweep_dir, self.rule, names)  # replayed on their seeds, then appended to
        except ValueError as exc:
            raise HydraException(str(exc)) from None
        sweep_dir.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(self.config, sweep_dir / "multirun.yaml")
        print(f"[sequential] {len(configs)} configurations; {self.rule.text()}", flush=True)
        seeds: list[set[int]] = [set() for _ in configs]
        active, rounds, returns, job_idx, round_no = set(range(len(configs))), [], [], 0, 0
        while active:
            round_no += 1
            replay = recorded[round_no - 1]["seeds"] if round_no <= len(recorded) else None
            batch = self._next_batch(configs, seeds, active, round_no, [replay[n] for n in names] if replay else None)
            results, job_idx = self._launch(batch, job_idx)
            returns.append(results)
            dirs = [[self._job_dir(c + [f"seed={s}"]) for s in sorted(own)] for c, own in zip(configs, seeds)]
            comps = ss.read_round(sweep_dir, dirs, seeds, names, self.rule)
            spent = [len(s) >= self.rule.max_seeds for s in seeds]
            for c in comps:
                print(c.line(round_no, spent[c.a] and spent[c.b]), flush=True)
            active = {i for c in comps if c.state == "undecided" for i in (c.a, c.b) if not spent[i]}
            rounds.append(ss.round_record(round_no, seeds, names, comps))
            try:
                ss.write_record(sweep_dir, self.rule, rounds, done=not active)
            except ValueError as exc:  # a replayed round that no longer reads as recorded (its runs changed)
                raise HydraException(f"hydra/sweeper=sequential: {exc}") from None
        print(f"[sequential] done after {round_no} round(s): "
              + "; ".join(f"{c.label_a} vs {c.label_b} {c.state} ({c.n} seeds)" for c in comps), flush=True)
        return returns

    def _next_batch(self, configs: list[list[str]], seeds: list[set[int]], active: set[int], round_no: int,
                    replay: list[list[int]] | None = None) -> list[list[str]]:
        """The jobs of the next round (the seeds are recorded as launched); ``replay``: each configuration's seeds
        after this round as the record holds them (a re-run replays a recorded round on its seeds)."""
        batch = []
        for i in sorted(active):
            n = self.rule.first_seeds if round_no == 1 else self._per_round(len(active))
            new = (sorted(set(replay[i]) - seeds[i]) if replay is not None
                   else range(len(seeds[i]), min(self.rule.max_seeds, len(seeds[i]) + n)))
            seeds[i].update(new)
            batch += [configs[i] + [f"seed={s}"] for s in new]
        return batch

    def _job_dir(self, job: list[str]) -> Path:
        from dapo_exp.analysis.callback import job_dir

        return job_dir(self.config, job)

    def _launch(self, batch: list[list[str]], job_idx: int) -> tuple[list[JobReturn], int]:
        """Launch the jobs of ``batch`` not already finished (a resumed sweep skips them)."""
        from dapo_exp.analysis.callback import finished_jobs

        done = {tuple(j) for j in finished_jobs(self.config, batch)}
        todo = [j for j in batch if tuple(j) not in done]
        if done:
            print(f"[sequential] {len(done)} run(s) of this round already finished: not run again", flush=True)
        if not todo:
            return [], job_idx
        results = list(self.launcher.launch(todo, initial_job_idx=job_idx))
        for r in results:
            _ = r.return_value  # a job that raised (not one run.py recorded as failed) ends the sweep, as Hydra's
        return results, job_idx + len(todo)
