"""A task's base pass@1 on a model before any training: how hard each level is for this policy.

``python -m dapo_exp.benchmarks.probe [--levels add1,add2] [--problems 32] [--k 4] [overrides ...]`` composes the
run config from the overrides (default ``experiment=smollm2_add2``), and for each ``task.level`` samples ``k``
responses to each of the first ``--problems`` held-out problems at the training sampling settings
(``rollout.temperature``, ``rollout.top_p``, ``rollout.max_response_len``) with the run's own engine and
verifier, and prints one line per level: pass@1 (the mean correctness of the samples, with a 95% interval
over problems), the share of responses with an ``Answer:`` line, and the share cut at the length cap. The
bands the tests hold (tests/test_chat_tasks.py) come from this.
"""

from __future__ import annotations

import argparse
import math
import sys
from typing import Any


def probe(cfg: Any, *, problems: int, k: int, seed: int = 0) -> dict[str, float]:
    """Sample ``k`` responses per held-out problem (the first ``problems``) of ``cfg``'s task from its base
    policy; ``acc`` (pass@1), ``acc_se`` (its standard error over problems), ``answer_line``, ``truncated``."""
    import numpy as np

    from dapo_exp.build import policy_path
    from dapo_exp.models import load_policy
    from dapo_exp.rollout import make_engine
    from dapo_exp.rollout.engine import SamplingSpec
    from dapo_exp.tasks import load_task
    from dapo_exp.tasks.base import render_prompts
    from dapo_exp.tasks.verifier import extract_last_answer, get_verifier

    path = policy_path(cfg)
    chosen = load_task(cfg.task).eval[:problems]
    tok, model = load_policy(path, "float32", "cpu", cfg.model.trust_remote_code)
    engine = make_engine(cfg=cfg, model=model, tokenizer=tok, model_path=path)
    prompts = render_prompts([p.messages or p.prompt for p in chosen], tok, bool(cfg.task.chat_template))
    r = cfg.rollout
    gens = engine.generate(prompts, SamplingSpec(n=k, max_new_tokens=r.max_response_len, temperature=r.temperature,
                                                 top_p=r.top_p, seed=seed))
    texts = tok.batch_decode(gens.response_ids, skip_special_tokens=True)
    with get_verifier(cfg.task.verifier, cfg.task.verifier_timeout_s, 1) as verifier:
        results = verifier.verify_batch(texts, [p.answer for p in chosen for _ in range(k)])
    per_problem = np.array([r.correct for r in results], dtype=float).reshape(len(chosen), k).mean(axis=1)
    engine.close()
    return {"acc": float(per_problem.mean()), "acc_se": float(per_problem.std(ddof=1) / math.sqrt(len(chosen))),
            "answer_line": float(np.mean([extract_last_answer(t) is not None for t in texts])),
            "truncated": float(np.mean(gens.truncated)), "problems": len(chosen), "k": k}


def main(argv: list[str] | None = None) -> int:
    from dapo_exp.hydra_setup import compose_config
    from dapo_exp.tasks.chat_arith import LEVELS

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--levels", default=",".join(LEVELS), help="task.level values, comma-separated")
    ap.add_argument("--problems", type=int, default=32, help="held-out problems per level")
    ap.add_argument("--k", type=int, default=4, help="samples per problem")
    ap.add_argument("overrides", nargs="*", default=["experiment=smollm2_add2"])
    args = ap.parse_args(argv)
    for level in args.levels.split(","):
        cfg = compose_config([*args.overrides, f"task.level={level}", "logger=none"])
        got = probe(cfg, problems=args.problems, k=args.k)
        print(f"{level:6s} pass@1 {got['acc']:.3f} [{got['acc'] - 1.96 * got['acc_se']:.3f}, "
              f"{got['acc'] + 1.96 * got['acc_se']:.3f}]  Answer: line {got['answer_line']:.2f}  truncated "
              f"{got['truncated']:.2f}  ({got['problems']} problems x {got['k']})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
