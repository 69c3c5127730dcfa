"""Rollouts: the engine interface (:mod:`.engine`), the engines, groups and scoring
(:mod:`.groups`), Dynamic Sampling (:mod:`.dynamic_sampling`) and mismatch metrics.

:data:`ENGINES` maps ``rollout.engine`` to a factory
``fn(*, cfg, model, tokenizer, model_path) -> RolloutEngine``; a new engine is one
class implementing :class:`~dapo_exp.rollout.engine.RolloutEngine`, one factory
registered here (or from your own code) and ``conf/rollout/<name>.yaml``.
"""

from __future__ import annotations

from typing import Any

from dapo_exp.registry import Registry

ENGINES: Registry = Registry("rollout engine", "rollout.engine")


@ENGINES.register("hf")
def _hf(*, cfg: Any, model: Any, tokenizer: Any, model_path: str) -> Any:
    from dapo_exp.rollout.hf.engine import HFEngine

    return HFEngine(model, tokenizer, cfg.rollout.gen_batch_size, decode=cfg.rollout.decode)


@ENGINES.register("vllm")
def _vllm(*, cfg: Any, model: Any, tokenizer: Any, model_path: str) -> Any:
    from dapo_exp.rollout.vllm_engine import VLLMEngine

    return VLLMEngine(
        model_path,
        seed=cfg.seed,
        dtype=cfg.model.dtype,
        gpu_memory_utilization=cfg.rollout.vllm_gpu_memory_utilization,
        enable_sleep=cfg.rollout.vllm_sleep,
        enforce_eager=cfg.rollout.vllm_enforce_eager,
        max_model_len=cfg.task.max_prompt_len + max(cfg.rollout.max_response_len, cfg.eval.max_response_len or 0),
    )


def make_engine(*, cfg: Any, model: Any, tokenizer: Any, model_path: str) -> Any:
    """The engine named by ``rollout.engine`` (an unknown name fails listing the choices)."""
    return ENGINES.pick(cfg.rollout.engine)(cfg=cfg, model=model, tokenizer=tokenizer, model_path=model_path)
