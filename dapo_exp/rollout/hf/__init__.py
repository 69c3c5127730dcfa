"""The transformers rollout engine (``rollout.engine=hf``) and the sampling loops it can use:
``generate``, a static-KV-cache loop (eager or compiled, :mod:`.static_decode`) and a fused
one-token step over a Llama/Qwen2 model's own weights (:mod:`.fused_decode`)."""

from dapo_exp.rollout.hf.engine import HFEngine

__all__ = ["HFEngine"]
