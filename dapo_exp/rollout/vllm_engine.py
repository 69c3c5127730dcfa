"""Rollouts with vLLM's offline ``LLM``, colocated in the trainer's process (``rollout=vllm``).

One process holds both the trainer's ``torch`` model and vLLM's copy of it. After
each optimizer step the trainer's tensors are pushed into vLLM's model in place
(:meth:`VLLMEngine.sync_weights`: ``collective_rpc("reload_weights",
weights_iterator=...)``, no disk round trip).

Choices, and why:

- **In-process engine.** ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` (set here unless the
  caller set it) keeps vLLM's engine core and its single worker in this process,
  so the weights iterator is handed over as Python objects. With the
  multi-process engine a generator of tensors cannot be shipped, so it is refused.
- **Which log-probs the engine reports.** vLLM's default (``raw_logprobs``) is the
  log-softmax of the model's logits *before* temperature and top-p. We start vLLM
  with ``logprobs_mode="processed_logprobs"``: the log-probs of the distribution
  the tokens were actually drawn from (after temperature, after top-p
  renormalisation). That is what truncated importance sampling needs, and, at
  ``top_p = 1`` (training), it equals the trainer's
  ``token_logprobs(..., temperature=T)``, so the mismatch metrics compare like
  with like. With ``top_p < 1`` the engine's value is the renormalised nucleus
  probability (>= the trainer's), so the gap includes the truncation. On CUDA
  this mode disables FlashInfer's fused sampler (vLLM falls back to its PyTorch
  sampler); pass ``logprobs_mode="raw_logprobs"`` to trade the metric for speed
  (the numbers are then at temperature 1).
- **Seeds.** Every prompt gets its own ``SamplingParams`` seed derived from
  ``spec.seed`` and the prompt's index; vLLM gives the ``n`` children of a prompt
  ``seed + j``, so prompt seeds are spaced by ``n``. The same call on the same
  weights returns the same samples. With ``SamplingSpec.keys`` (keyed randomness,
  :mod:`dapo_exp.keyed`) the seed of prompt ``i``'s request comes from its key instead
  (:func:`dapo_exp.keyed.vllm_seed`), so it does not depend on the prompt's place in the batch
  or on the other requests. The coupling is per request, not per token: vLLM's own sampler
  draws from its per-request generator, so two arms share a request's samples only while
  they share its every sampling step (same logits, same draws consumed); the first token that
  differs gives different draws after it.
- **Prefix cache.** It holds keys/values computed with the old weights, so it is
  cleared after every weight sync.
- **Sleep.** ``sleep()`` / ``wake()`` release and restore vLLM's GPU memory
  (weights offloaded to host RAM, KV cache dropped; ``LLM.sleep(level=1)``) only
  on CUDA with ``enable_sleep=True``. On CPU they are no-ops: vLLM's CPU worker
  has no sleep mode, and its KV cache is a fixed host buffer
  (``VLLM_CPU_KVCACHE_SPACE`` GiB, set to 1 here unless the caller set it).
- **Threads (CPU).** vLLM's CPU worker replaces ``torch.set_num_threads`` with a
  no-op for the whole process; the constructor puts the real function and the
  previous thread count back so the trainer keeps control of its threads. vLLM's
  CPU engine is meant to step with one intra-op thread (its
  ``set_torch_threads_for_runtime``; more threads spin-wait between its many small
  ops): ``generate`` and ``sync_weights`` run with ``cpu_threads`` (default 1)
  threads and restore the trainer's count afterwards (docs: benchmarks, for the
  throughput with one thread and with two).
- **CPU head sizes.** vLLM's CPU attention kernels need ``head_dim`` in
  {32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512}; a tiny model with
  ``hidden_size / num_heads = 24`` loads but fails at the first forward.

vLLM is imported lazily (inside :class:`VLLMEngine`), so this module imports
without it; the pure mismatch helpers live in :mod:`dapo_exp.rollout.mismatch`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from dapo_exp.rollout.engine import Generations, SamplingSpec

_SEED_MOD = 2**31 - 1  # vLLM seeds are ints; keep them in int32 range on every backend


def prompt_seed(base: int, prompt_index: int, n: int) -> int:
    """The seed of prompt ``prompt_index``'s request; its ``n`` responses use ``seed + j`` (vLLM's rule)."""
    span = _SEED_MOD - n
    return (base * 1_000_003 + prompt_index * n) % span


def _named_tensors(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """The trainer's weights in checkpoint (HF) names, unwrapped from torch.compile / DDP."""
    inner = getattr(model, "_orig_mod", model)  # torch.compile
    inner = getattr(inner, "module", inner)  # DistributedDataParallel
    for name, t in inner.state_dict().items():
        yield name, t.detach()


def _hf_config(model_path: str):
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(model_path)
    except (OSError, ValueError):
        return None


def _check_cpu_head_dim(config) -> None:
    """vLLM's CPU attention kernels exist for a few head sizes only; say so before a long start-up fails."""
    if config is None or not getattr(config, "num_attention_heads", None):
        return
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    try:
        from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

        supported = list(CPUAttentionBackend.get_supported_head_sizes())
    except (ImportError, AttributeError):
        return
    if head_dim not in supported:
        raise ValueError(
            f"vLLM on CPU supports head_dim in {supported}, but this model has head_dim={head_dim} "
            f"(hidden_size={config.hidden_size} / num_attention_heads={config.num_attention_heads}); "
            "for the tiny model choose model.hidden_size / model.num_heads accordingly "
            "(e.g. 96 / 3), or use rollout=hf"
        )


class VLLMEngine:
    """:class:`~dapo_exp.rollout.engine.RolloutEngine` backed by ``vllm.LLM`` in this process.

    Args:
        model_path: a local directory (or HF id) with the model *and* tokenizer in
            HF format; the trainer's model must have the same architecture and
            parameter names (weights are pushed by name).
        seed: vLLM's global seed (per-request seeds come from ``SamplingSpec.seed``).
        dtype: ``auto`` | ``float32`` | ``bfloat16`` | ``float16`` (vLLM's weights;
            pushed trainer tensors are cast to it).
        gpu_memory_utilization: fraction of GPU memory vLLM may take (weights + KV
            cache); ignored on CPU.
        enable_sleep: on CUDA, start vLLM with sleep mode so :meth:`sleep` frees its
            memory during training; ignored on CPU.
        enforce_eager: no CUDA graphs / torch.compile (fast start-up).
        max_model_len: prompt + response tokens per sequence; lowered to the model's
            ``max_position_embeddings`` when larger (vLLM refuses it otherwise);
            :meth:`generate` checks every call against the result.
        logprobs_mode: which log-probs vLLM reports (see the module docstring).
        kv_cache_gib_cpu: ``VLLM_CPU_KVCACHE_SPACE`` default on CPU (if unset).
        cpu_threads: torch intra-op threads while vLLM works on CPU (``None``: leave as is).
    """

    def __init__(
        self,
        model_path: str,
        *,
        seed: int,
        dtype: str = "auto",
        gpu_memory_utilization: float = 0.5,
        enable_sleep: bool = False,
        enforce_eager: bool = True,
        max_model_len: int = 2048,
        logprobs_mode: str = "processed_logprobs",
        kv_cache_gib_cpu: int = 1,
        cpu_threads: int | None = 1,
    ) -> None:
        if os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0") != "0":
            raise RuntimeError(
                "VLLMEngine needs vLLM in this process (in-place weight sync): unset "
                "VLLM_ENABLE_V1_MULTIPROCESSING or set it to 0"
            )
        self.on_cuda = torch.cuda.is_available()
        if not self.on_cuda:
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(kv_cache_gib_cpu))
        self.enable_sleep = bool(enable_sleep and self.on_cuda)
        hf_config = _hf_config(model_path)
        max_positions = getattr(hf_config, "max_position_embeddings", None)
        self.max_model_len = min(max_model_len, max_positions or max_model_len)
        self.model_path = model_path
        self._asleep = False  # everything released
        self._weights_awake = True

        real_set_num_threads, n_threads = torch.set_num_threads, torch.get_num_threads()
        from vllm import LLM

        if not self.on_cuda:
            _check_cpu_head_dim(hf_config)

        t0 = time.perf_counter()
        self.llm = LLM(
            model=model_path,
            seed=seed,
            dtype=dtype,
            gpu_memory_utilization=gpu_memory_utilization,
            enable_sleep_mode=self.enable_sleep,
            enforce_eager=enforce_eager,
            max_model_len=self.max_model_len,
            logprobs_mode=logprobs_mode,
        )
        self.startup_s = time.perf_counter() - t0
        if torch.set_num_threads is not real_set_num_threads:  # vLLM's CPU worker patched it
            torch.set_num_threads = real_set_num_threads
            torch.set_num_threads(n_threads)
        self.cpu_threads = None if self.on_cuda else cpu_threads
        self.last_sync_ms = float("nan")

    @contextmanager
    def _engine_threads(self):
        """Run vLLM's work with ``cpu_threads`` torch threads (CPU), then give the trainer its count back."""
        if self.cpu_threads is None:
            yield
            return
        before = torch.get_num_threads()
        torch.set_num_threads(self.cpu_threads)
        try:
            yield
        finally:
            torch.set_num_threads(before)

    # ------------------------------------------------------------------ #
    def generate(self, prompt_ids: list[list[int]], spec: SamplingSpec) -> Generations:
        """Sample ``spec.n`` responses per prompt; rows group-major (prompt ``i``, response ``j`` at ``i*n+j``)."""
        from vllm import SamplingParams

        if self._asleep or not self._weights_awake:
            raise RuntimeError("VLLMEngine.generate called while asleep: call wake() first")
        longest = max((len(p) for p in prompt_ids), default=0)
        if longest + spec.max_new_tokens > self.max_model_len:
            raise ValueError(
                f"longest prompt ({longest}) + max_new_tokens ({spec.max_new_tokens}) exceeds the engine's "
                f"max_model_len ({self.max_model_len}); raise the engine's max_model_len"
            )
        if spec.keys is not None and len(spec.keys) != len(prompt_ids):
            raise ValueError(f"SamplingSpec.keys has {len(spec.keys)} keys for {len(prompt_ids)} prompts")
        from dapo_exp.keyed import vllm_seed

        params = [
            SamplingParams(
                n=spec.n,
                temperature=0.0 if spec.greedy else spec.temperature,  # vLLM decodes greedily at 0
                top_p=1.0 if spec.greedy else spec.top_p,
                max_tokens=spec.max_new_tokens,
                seed=prompt_seed(spec.seed, i, spec.n) if spec.keys is None else vllm_seed(spec.keys[i], spec.n),
                logprobs=0,  # the sampled token's log-prob only
                detokenize=False,  # the trainer works on ids
            )
            for i in range(len(prompt_ids))
        ]
        prompts = [{"prompt_token_ids": list(p)} for p in prompt_ids]
        t0 = time.perf_counter()
        with self._engine_threads():
            outputs = self.llm.generate(prompts, params, use_tqdm=False)
        seconds = time.perf_counter() - t0

        response_ids: list[list[int]] = []
        truncated: list[bool] = []
        logprobs: list[list[float]] = []
        for out in outputs:
            completions = sorted(out.outputs, key=lambda c: c.index)
            if len(completions) != spec.n:
                raise RuntimeError(f"vLLM returned {len(completions)} completions for n={spec.n}")
            for c in completions:
                ids = list(c.token_ids)
                response_ids.append(ids)
                # "length": max_tokens (or max_model_len) reached without EOS; "stop": EOS
                truncated.append(c.finish_reason == "length")
                logprobs.append([step[t].logprob for step, t in zip(c.logprobs, ids)])
        n_tokens = sum(len(r) for r in response_ids)
        stats = {
            "gen_tokens": float(n_tokens),
            "gen_seconds": seconds,
            "gen_tokens_per_s": n_tokens / max(seconds, 1e-9),
        }
        return Generations(response_ids=response_ids, truncated=truncated, sampled_logprobs=logprobs, stats=stats)

    def sync_weights(self, model: torch.nn.Module) -> None:
        """Copy ``model``'s current weights into vLLM's model in place (by HF parameter name).

        vLLM's ``Qwen2ForCausalLM.load_weights`` (and its peers) fuse q/k/v and
        gate/up projections as they load, exactly as from a checkpoint. The prefix
        cache (keys/values of the old weights) is cleared. On CUDA with sleep mode,
        a sleeping engine has its weights woken first (the KV cache stays released
        until :meth:`wake`).
        """
        if self.enable_sleep and not self._weights_awake:
            self.llm.wake_up(tags=["weights"])
            self._weights_awake = True
        t0 = time.perf_counter()
        with torch.no_grad(), self._engine_threads():
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": _named_tensors(model)})
        if self.on_cuda:
            torch.cuda.synchronize()
        self.llm.reset_prefix_cache()
        self.last_sync_ms = (time.perf_counter() - t0) * 1e3

    def sleep(self) -> None:
        """Release vLLM's GPU memory (weights to host RAM, KV cache dropped). No-op on CPU or without sleep mode."""
        if not self.enable_sleep or self._asleep:
            return
        self.llm.sleep(level=1)
        self._asleep, self._weights_awake = True, False

    def wake(self) -> None:
        """Undo :meth:`sleep` (restores whatever :meth:`sync_weights` has not already woken)."""
        if not self.enable_sleep or not self._asleep:
            return
        self.llm.wake_up(tags=None if not self._weights_awake else ["kv_cache"])
        self._asleep, self._weights_awake = False, True

    def close(self) -> None:
        """Shut the engine down and free its memory, so that the next job of a sweep run in the
        same process (Hydra's basic launcher) does not find this one's engine holding the GPU."""
        llm = getattr(self, "llm", None)
        if llm is None:
            return
        engine_core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
        if engine_core is not None and hasattr(engine_core, "shutdown"):
            engine_core.shutdown()
        self.llm = None
        del llm
        import gc

        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
