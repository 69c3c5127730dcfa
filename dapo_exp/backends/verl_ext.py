"""Overlong Filtering on verl 0.9.1: an agent loop that takes truncated responses out of the loss.

Imported inside verl's processes only (it imports verl): ``backend=verl`` with
``overlong_filtering=enabled`` sets ``actor_rollout_ref.model.external_lib=dapo_exp.backends.verl_ext``,
which verl imports wherever it builds the model config (``HFModelConfig.__post_init__`` ->
``import_external_libs``), its agent-loop workers included; importing this module registers
:class:`OverlongFilteringAgentLoop` in verl's agent-loop registry, and
``actor_rollout_ref.rollout.agent.default_agent_loop`` selects it.

Why an agent loop (and not a policy loss from ``register_policy_loss``): verl's V1 trainer takes the
loss mask of every response from the agent loop's ``response_mask`` (``loss_mask = response_mask``),
and its token-mean normaliser is the mini-batch's ``loss_mask.sum()``, computed by the engine
before the loss function is called. A policy loss sees one micro-batch and could only zero the
numerator. Zeroing ``response_mask`` here removes a truncated response from both, exactly as
:func:`dapo_exp.objective.overlong_filtering` does, and leaves its reward (placed by the reward
loop from the response length, not the mask) in its group's advantage statistics: the native
trainer's semantic choice 4 ("mask, not drop"). verl already uses ``response_mask = 0`` for tokens
that are not trained on (tool outputs), so nothing downstream is surprised by it.

One difference, documented in docs/explanation/verl-backend.md: with ``seq-mean-token-mean`` verl divides by the
mini-batch's responses including fully masked ones (``global_batch_size``), ours by the responses
that keep a token; ``token-mean`` and ``seq-mean-token-sum-norm`` are identical.
"""

from __future__ import annotations

from typing import Any

import torch
from verl.experimental.agent_loop.agent_loop import AgentLoopOutput, register
from verl.experimental.agent_loop.single_turn_agent_loop import SingleTurnAgentLoop

from dapo_exp import objective
from dapo_exp.backends.verl import FILTERED_LINE, OF_AGENT_LOOP


def is_truncated(response_ids: list[int], max_len: int, eos_ids: set[int]) -> bool:
    """The native engines' definition: no EOS before the cap, i.e. the response holds ``max_len``
    tokens and its last one is not an end-of-sequence token (generation stops at the first EOS)."""
    return len(response_ids) >= max_len and (not response_ids or int(response_ids[-1]) not in eos_ids)


def filter_output(output: AgentLoopOutput, *, max_len: int, eos_ids: set[int]) -> AgentLoopOutput:
    """Zero the ``response_mask`` of a truncated response with :func:`dapo_exp.objective.overlong_filtering`
    (the native function, on a one-row batch); record the flag in ``extra_fields["truncated"]``."""
    truncated = is_truncated(output.response_ids, max_len, eos_ids)
    mask = torch.tensor([output.response_mask], dtype=torch.int64)
    output.response_mask = objective.overlong_filtering(mask, torch.tensor([truncated]))[0].tolist()
    output.extra_fields["truncated"] = truncated
    return output


def eos_token_ids(tokenizer: Any, model_path: str | None) -> set[int]:
    """The tokenizer's EOS plus the model's generation-config EOS ids (what vLLM stops on), as the
    native HF engine collects them."""
    ids: list = []
    if model_path:
        try:
            from transformers import GenerationConfig

            eos = GenerationConfig.from_pretrained(model_path).eos_token_id
            ids += list(eos) if isinstance(eos, (list, tuple)) else [eos]
        except (OSError, ValueError):  # no generation_config.json: the tokenizer's EOS only
            pass
    ids.append(getattr(tokenizer, "eos_token_id", None))
    return {int(i) for i in ids if i is not None}


@register(OF_AGENT_LOOP)
class OverlongFilteringAgentLoop(SingleTurnAgentLoop):
    """verl's single-turn agent loop, then :func:`filter_output` (``algo.overlong_filtering=true``)."""

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        output = await super().run(sampling_params, **kwargs)
        if not hasattr(self, "_eos_ids"):
            self._eos_ids = eos_token_ids(self.tokenizer, self.config.actor_rollout_ref.model.get("path"))
        output = filter_output(output, max_len=self.response_length, eos_ids=self._eos_ids)
        if output.extra_fields["truncated"]:  # the run's log shows the filter at work (a test reads it)
            print(f"{FILTERED_LINE} ({len(output.response_ids)} tokens, loss mask {sum(output.response_mask)})",
                  flush=True)
        return output
