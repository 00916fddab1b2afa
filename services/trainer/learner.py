"""The optimizer step (torch + Accelerate): scored samples in, updated weights and stats out.

`Learner` owns the model, the optimizer and the optional frozen reference model, prepared by
`Accelerator()` (DDP/FSDP under `accelerate launch`); the service calls it in a worker thread. With
several processes, process 0 `broadcast`s each step, every process trains its `shard` with the same
number of forward passes (FSDP gathers collectively), and all take part in `save`. An update whose
loss or gradient norm is not finite is not applied, and non-finite weights are never saved: both
decisions are collective.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import logging
import math
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch
from accelerate import Accelerator
from accelerate.utils import broadcast_object_list, gather_object, set_seed
from transformers import AutoModelForCausalLM, get_scheduler

from swarmrl.core.precision import BF16_MIN_PARAMETERS, resolve_mixed_precision
from swarmrl.services.trainer.batching import MicroBatch, Scored, empty_micro_batch, pack, pack_shared, shard
from swarmrl.services.trainer.checkpoint import (
    ADAPTER_CONFIG,
    STATE_FILE,
    TrainerState,
    copy_tokenizer_files,
    optimizer_source,
)
from swarmrl.services.trainer.config import TrainerConfig
from swarmrl.services.trainer.grpo import token_loss
from swarmrl.services.trainer.tree_attention import TREE_ATTENTION, tree_for

log = logging.getLogger("swarmrl.trainer.learner")

# Per-step sums, reduced over processes in one collective.
_SUMS = "loss tokens computed_tokens trained_tokens clipped kl off_tokens is_weight unknown_behaviour".split()


class NonFiniteWeights(RuntimeError):
    """The weights hold NaN or ±inf: nothing may be saved or served from them."""


@dataclass
class StepResult:
    """What one `train_step` did: its statistics, and the samples it refused to learn from."""

    stats: dict[str, float]  # step statistics, over the applied optimizer updates only (so they are finite)
    skipped: dict[str, str]
    """Sample id -> reason (`nonfinite: ...`) for every sample of an update not applied."""

    @property
    def learned(self) -> bool:
        """At least one update was applied: the weights changed and are worth a checkpoint."""
        return self.stats["skipped_updates"] < self.stats["updates"]


class Learner:
    def __init__(
        self, cfg: TrainerConfig, weights: str | Path, accelerator: Accelerator | None = None
    ) -> None:
        self.cfg = cfg
        self.accelerator = accelerator or Accelerator(
            mixed_precision=resolve_mixed_precision(cfg.mixed_precision, cfg.model_path)
        )
        set_seed(cfg.seed)
        model = load_trainable(cfg, weights)
        self.vocab_size = cast(torch.nn.Embedding, model.get_input_embeddings()).num_embeddings
        self.context_len = int(getattr(model.config, "max_position_embeddings", 0) or 0) or None
        """The longest sample the model can take; None: its config does not say."""
        # Logits only where a token is trained save most of the [tokens x vocab] memory.
        plain = model.get_base_model() if hasattr(model, "get_base_model") else model  # under peft
        self._keep_logits = "logits_to_keep" in inspect.signature(plain.forward).parameters
        trainable = [p for p in model.parameters() if p.requires_grad]  # with LoRA: the adapter's
        big = sum(p.numel() for p in trainable) >= BF16_MIN_PARAMETERS
        self._optimizer_every = cfg.optimizer_state_every or (10 if big else 1)
        optimizer = torch.optim.AdamW(trainable, lr=cfg.lr, weight_decay=cfg.weight_decay, fused=True)
        self.model, self.optimizer = self.accelerator.prepare(model, optimizer)
        self._fresh_optimizer = copy.deepcopy(self.optimizer.state_dict())
        """The optimizer's state before any update: what a rollback to the base model restores."""
        # Not prepared: Accelerate would step it once per process, not once per trainer step.
        schedule = "constant_with_warmup" if cfg.lr_scheduler == "constant" else cfg.lr_scheduler
        self.scheduler = get_scheduler(
            schedule, self.optimizer, num_warmup_steps=cfg.warmup_steps, num_training_steps=cfg.max_steps
        )
        self.ref: torch.nn.Module | None = None
        if cfg.kl_coef > 0:  # the reference is the base model, never a resumed checkpoint
            ref = AutoModelForCausalLM.from_pretrained(
                cfg.model_path, dtype=torch.float32, attn_implementation=TREE_ATTENTION
            ).eval()
            ref.requires_grad_(False)
            self.ref = self.accelerator.prepare_model(ref, evaluation_mode=True)
        self.check_weights(f"loaded from {weights}")  # version 0 or a resumed one is served as is

    # Several processes ---------------------------------------------------------------------------
    @property
    def is_main(self) -> bool:
        return self.accelerator.is_main_process

    def broadcast(self, payload: Any) -> Any:
        """Process 0 sends `payload` (a step's work, or None to stop); the others receive it."""
        if self.accelerator.num_processes == 1:
            return payload
        return broadcast_object_list([payload], from_process=0)[0]

    def shard(self, items: list[Scored]) -> list[Scored]:
        acc = self.accelerator
        return shard(items, acc.num_processes, acc.process_index, self.cfg.prefix_sharing)

    def _all_sum(self, values: list[float]) -> list[float]:
        t = torch.tensor(values, dtype=torch.float64, device=self.accelerator.device)
        return self.accelerator.reduce(t, reduction="sum").tolist()  # a copy on one process

    # Training ------------------------------------------------------------------------------------
    def train_step(self, items: list[Scored], version: int) -> StepResult:
        """One policy step on this process's `items`, all its optimizer updates; tokens generated by
        a version older than `version` are off-policy."""
        started = time.perf_counter()
        cfg, acc = self.cfg, self.accelerator
        mbs = (pack_shared if cfg.prefix_sharing else pack)(items, cfg.max_tokens_per_micro_batch)
        # Every process runs as many micro-batches as the one with most (one process: gather is a no-op).
        n_mb = max(int(acc.gather(torch.tensor([len(mbs)], device=acc.device)).max()), 1)
        mbs += [empty_micro_batch() for _ in range(n_mb - len(mbs))]
        per_update = cfg.grad_accum or n_mb
        updates = [list(range(i, min(i + per_update, n_mb))) for i in range(0, n_mb, per_update)]
        updates *= cfg.epochs
        self.model.train()  # gradient checkpointing only runs in train mode; RL models have no dropout
        # Several updates need the proximal logprobs of the weights the step started from.
        prox = [self._logprobs(self.model, mb) for mb in mbs] if len(updates) > 1 else [None] * n_mb
        sums = dict.fromkeys(_SUMS, 0.0)
        grad_norms = []
        skipped: dict[str, str] = {}
        for k, update in enumerate(updates):
            part = self._backward([mbs[i] for i in update], [prox[i] for i in update], version)
            norm, reason = self._apply(part["loss"], f"update {k + 1}/{len(updates)}")
            if reason is not None:
                skipped |= dict.fromkeys((sid for i in update for sid in mbs[i].sample_ids), reason)
                continue
            grad_norms.append(norm)
            sums = {name: sums[name] + part[name] for name in _SUMS}
        if grad_norms:  # the schedule counts trainer steps that changed the weights
            self.scheduler.step()
        # each process knows only its own shard's samples
        skipped = {sid: why for d in gather_object([skipped]) for sid, why in d.items()}
        total = dict(zip(_SUMS, self._all_sum([sums[k] for k in _SUMS]), strict=True))
        trained = max(total["trained_tokens"], 1.0)
        stats = {
            "loss": total["loss"] / trained,
            "tokens": total["tokens"],  # the samples' tokens
            "computed_tokens": total["computed_tokens"],  # what the forward passes computed
            "trained_tokens": total["trained_tokens"],
            "clip_frac": total["clipped"] / trained,
            "kl": total["kl"] / trained,
            "off_policy_frac": total["off_tokens"] / trained,
            "is_weight_mean": total["is_weight"] / max(total["off_tokens"], 1.0),
            "unknown_behaviour_frac": total["unknown_behaviour"] / trained,
            "grad_norm": max(grad_norms, default=0.0),
            "updates": float(len(updates)),
            "skipped_updates": float(len(updates) - len(grad_norms)),
            "micro_batches": float(n_mb),
            "update_s": time.perf_counter() - started,
        }
        return StepResult(stats, skipped)

    def _backward(
        self, mbs: list[MicroBatch], prox: list[torch.Tensor | None], version: int
    ) -> dict[str, float]:
        """Accumulate the gradients of one optimizer update over `mbs`; returns its sums (`_SUMS`)."""
        acc = self.accelerator
        (n_tokens,) = self._all_sum([float(sum(mb.trained_tokens for mb in mbs))])
        # DDP/FSDP average gradients over processes; scale so the result is the global token mean.
        scale = acc.num_processes / max(n_tokens, 1.0)
        sums = dict.fromkeys(_SUMS, 0.0)
        for j, (mb, p) in enumerate(zip(mbs, prox, strict=True)):
            sync = j == len(mbs) - 1
            with contextlib.nullcontext() if sync else acc.no_sync(self.model):
                acc.backward(self._micro_loss(mb, version, p, sums) * scale)
        return sums

    def _apply(self, loss: float, update: str) -> tuple[float, str | None]:
        """Clip and apply the accumulated gradients, or drop them if the update's loss (summed over
        processes) or gradient norm (the same on every process) is not finite; returns the norm and
        the reason for a drop."""
        (total,) = self._all_sum([loss])
        max_norm = self.cfg.max_grad_norm or float("inf")
        norm = float(self.accelerator.clip_grad_norm_(self.model.parameters(), max_norm))
        reason = None
        if not math.isfinite(total):
            reason = f"nonfinite: loss {total} in optimizer {update}, not applied"
        elif not math.isfinite(norm):
            reason = f"nonfinite: grad norm {norm} in optimizer {update}, not applied"
        if reason is None:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return norm, reason

    def _micro_loss(
        self, mb: MicroBatch, version: int, prox: torch.Tensor | None, sums: dict[str, float]
    ) -> torch.Tensor:
        cfg = self.cfg
        logp = self._logprobs(self.model, mb, grad=True)
        dev = logp.device
        unknown = torch.isnan(mb.behaviour)
        off_policy = ((mb.versions >= 0) & (mb.versions < version)).to(dev)
        ref = self._logprobs(self.ref, mb) if self.ref is not None else None
        out = token_loss(
            logp, mb.behaviour.to(dev), mb.advantages.to(dev), off_policy, prox=prox, ref_logp=ref,
            clip_low=cfg.clip_eps_low, clip_high=cfg.clip_eps_high, is_cap=cfg.is_cap, kl_coef=cfg.kl_coef,
        )  # fmt: skip
        off = off_policy & ~unknown.to(dev)
        sums["loss"] += float(out.loss.detach().sum())
        sums["tokens"] += mb.sample_tokens
        sums["computed_tokens"] += mb.tokens if mb.sample_ids else 0
        sums["trained_tokens"] += mb.trained_tokens
        sums["clipped"] += float(out.clipped.sum())
        sums["kl"] += float(out.kl.sum())
        sums["off_tokens"] += float(off.sum())
        sums["is_weight"] += float(out.is_weight[off].sum())
        sums["unknown_behaviour"] += float(unknown.sum())
        return out.loss.sum()

    def logprobs(self, mb: MicroBatch) -> torch.Tensor:
        """The trained model's logprob of every trained token of `mb` (no gradient)."""
        return self._logprobs(self.model, mb)

    def _logprobs(self, model: torch.nn.Module, mb: MicroBatch, grad: bool = False) -> torch.Tensor:
        """Logprob of every trained token of `mb` under `model`, [trained_tokens]."""
        dev = self.accelerator.device
        # A tree position predicts one token per branch below it: compute its logits once.
        keep, inverse = torch.unique(mb.pred_pos.to(dev), return_inverse=True)
        kwargs: dict[str, Any] = {"logits_to_keep": keep} if self._keep_logits else {}
        with contextlib.nullcontext() if grad else torch.no_grad():
            out = model(
                input_ids=mb.input_ids.to(dev),
                position_ids=mb.position_ids.to(dev),
                tree=tree_for(mb.segments, mb.tokens, dev),
                use_cache=False,
                **kwargs,
            )
            logits = (out.logits[0] if self._keep_logits else out.logits[0, keep])[inverse].float()
            targets = mb.targets.to(dev)
            return logits.gather(-1, targets[:, None]).squeeze(-1) - torch.logsumexp(logits, dim=-1)

    # Checkpoints ---------------------------------------------------------------------------------
    def check_weights(self, what: str) -> None:
        """Raise `NonFiniteWeights` if a parameter of any process holds NaN or ±inf (collective)."""
        named = [(n, p) for n, p in self.model.named_parameters() if p.requires_grad]
        ok = torch.stack([torch.isfinite(_local(p)).all() for _, p in named]).tolist()  # one sync
        bad = [name for (name, _), fine in zip(named, ok, strict=True) if not fine]
        (n_bad,) = self._all_sum([float(len(bad))])
        if n_bad:
            raise NonFiniteWeights(
                f"weights {what}: {int(n_bad)} parameter tensors hold NaN or inf "
                f"(on process {self.accelerator.process_index}: {bad[:3]})"
            )

    def save(self, final: Path, state: TrainerState) -> None:
        """Write a complete checkpoint to `final` (collective); `NonFiniteWeights`, writing nothing,
        if the weights are not finite."""
        acc = self.accelerator
        self.check_weights(f"for {final.name}")
        tmp = final.with_name(final.name + ".tmp")
        if self.is_main:
            for p in (tmp, final):
                if p.exists():  # a leftover of a crash, or a step redone after one
                    shutil.rmtree(p)
            tmp.mkdir(parents=True)
        acc.wait_for_everyone()
        state_dict = acc.get_state_dict(self.model)  # collective under FSDP: gathers a full state dict
        acc.unwrap_model(self.model).save_pretrained(tmp, state_dict=state_dict, is_main_process=self.is_main)
        if state.step % self._optimizer_every == 0:
            torch.save(self.optimizer.state_dict(), tmp / f"optimizer-rank{acc.process_index}.pt")
        torch.save(self.scheduler.state_dict(), tmp / f"scheduler-rank{acc.process_index}.pt")
        acc.wait_for_everyone()
        if self.is_main:
            copy_tokenizer_files(self.cfg.model_path, tmp)
            state.write(tmp)
            tmp.rename(final)
        acc.wait_for_everyone()

    def load_optimizer(self, checkpoint: Path) -> None:
        """Restore this process's optimizer state (`optimizer_source`; fresh if there is none) and
        the schedule's from `checkpoint`; the world size must match the one that saved them."""
        source = optimizer_source(checkpoint)
        if source is None:
            log.warning("no optimizer state at or before %s: AdamW starts fresh", checkpoint)
            self.optimizer.load_state_dict(copy.deepcopy(self._fresh_optimizer))
        else:
            path = source / f"optimizer-rank{self.accelerator.process_index}.pt"
            if not path.is_file():
                raise FileNotFoundError(
                    f"{path} missing: was {source} saved by a different number of processes?"
                )
            # Our own file; under FSDP2 the state holds DTensors, which the weights-only unpickler rejects.
            self.optimizer.load_state_dict(torch.load(path, map_location="cpu", weights_only=False))
        sched = checkpoint / f"scheduler-rank{self.accelerator.process_index}.pt"
        if sched.is_file():  # checkpoints from before schedules start the schedule over
            self.scheduler.load_state_dict(torch.load(sched, map_location="cpu", weights_only=False))

    def restore(self, weights: str | Path) -> None:
        """Load `weights` (a checkpoint, or the base model directory: a fresh optimizer) into the live
        model in place, with its optimizer and schedule state. One training process only."""
        if self.accelerator.num_processes > 1:
            raise NotImplementedError("a rollback in place runs on one training process only")
        model = self.accelerator.unwrap_model(self.model)
        if self.cfg.lora_rank:
            from peft import set_peft_model_state_dict
            from safetensors.torch import load_file

            set_peft_model_state_dict(model, load_file(Path(weights) / "adapter_model.safetensors"))
        else:
            loaded = AutoModelForCausalLM.from_pretrained(weights, dtype=torch.float32)
            model.load_state_dict(loaded.state_dict())
        if (Path(weights) / STATE_FILE).is_file():  # a checkpoint, not the base model
            self.load_optimizer(Path(weights))
        else:
            self.optimizer.load_state_dict(copy.deepcopy(self._fresh_optimizer))
        self.check_weights(f"restored from {weights}")


def load_trainable(cfg: TrainerConfig, weights: str | Path) -> Any:
    """The model to train from `weights`: a full HF model directory, or a LoRA adapter's checkpoint
    over the base `cfg.model_path`; a LoRA run from a full directory gets a fresh adapter."""
    adapter = (Path(weights) / ADAPTER_CONFIG).is_file()
    if adapter and not cfg.lora_rank:
        raise ValueError(f"{weights} holds a LoRA adapter, and this trainer trains all weights (lora_rank 0)")
    # Under bf16 autocast a LoRA run's frozen base is kept in bf16 (the adapter stays fp32).
    frozen_bf16 = cfg.lora_rank and resolve_mixed_precision(cfg.mixed_precision, cfg.model_path) == "bf16"
    model = AutoModelForCausalLM.from_pretrained(
        cfg.model_path if adapter else weights,
        dtype=torch.bfloat16 if frozen_bf16 else torch.float32,
        attn_implementation=TREE_ATTENTION,
    )
    if cfg.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    if not cfg.lora_rank:
        return model
    from peft import LoraConfig, PeftModel, get_peft_model

    if adapter:
        return PeftModel.from_pretrained(model, weights, is_trainable=True)
    targets = cfg.lora_targets if cfg.lora_targets == "all-linear" else cfg.lora_targets.split(",")
    lora = LoraConfig(
        r=cfg.lora_rank, lora_alpha=cfg.lora_alpha or 2 * cfg.lora_rank, target_modules=targets,
        lora_dropout=0.0, bias="none", task_type="CAUSAL_LM",
    )  # fmt: skip
    return get_peft_model(model, lora)


def _local(p: torch.Tensor) -> torch.Tensor:
    """This process's shard of a parameter: under FSDP2 it is a DTensor, whose reductions are collective."""
    to_local = getattr(p, "to_local", None)
    return to_local() if to_local is not None else p
