"""Benchmarks: runnable modules that print their figures (``python -m dapo_exp.benchmarks.<name>``).

They are measurements, not tests: nothing here asserts. Each prints the command,
the date and the machine next to its table, so a figure pasted into the docs (docs/results/benchmarks.md)
or the experiment log says where it came from.
"""

# The shrunken toy of the benchmarks' smoke modes (--quick): tests/helpers.py's sizes (SMALL) (4 prompts x 4
# responses per step, 8 held-out problems x 2 samples), every evaluation that size, the final one too.
SHRUNKEN_TOY = ("train.prompts_per_step=4", "rollout.n=4", "train.mini_batch_size=8", "train.micro_batch_size=4",
                "task.arith_n_eval=8", "eval.problems=null", "eval.final_problems=null", "eval.final_samples=null",
                "eval.k=2", "eval.every=0")
