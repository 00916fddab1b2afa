"""Configuration of the trainer (one process per trainable model): `TrainerSettings`, what a swarm
description's `[models.<name>.trainer]` may set, and `TrainerConfig`, the whole process's
(`swarmrl serve trainer --help`), which adds what `swarmrl up` places."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from swarmrl.core.config import ServiceConfig, Settings
from swarmrl.schemas import DEFAULT_GROUP_SIZE


class TrainerSettings(Settings):
    """How one model trains: optimiser, groups and batches, loss, compute."""

    # Optimiser ---------------------------------------------------------------------------------
    lr: float = Field(default=1e-4, gt=0)
    """AdamW learning rate (peak of `lr_scheduler`); suits the tiny bootstrap models, 1B ones want ~1e-6."""
    lr_scheduler: Literal["constant", "linear", "cosine"] = "constant"
    """Learning-rate schedule after `warmup_steps`; `linear` and `cosine` decay to 0 at `max_steps`."""
    warmup_steps: int = Field(default=0, ge=0)
    """Trainer steps of linear learning-rate warmup from 0."""
    mixed_precision: Literal["auto", "no", "bf16"] | None = "auto"
    """`bf16`: forward and backward under bf16 autocast, weights and optimizer state fp32. `auto`: bf16
    from 100M parameters on (`swarmrl.core.precision`). None: what `accelerate launch`'s config says."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    max_grad_norm: float = 1.0
    """Gradient norm clip per optimizer update; 0 disables clipping (the norm is still reported)."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass: less memory, ~30% slower."""
    lora_rank: int = Field(default=0, ge=0)
    """Rank of a LoRA adapter (peft) trained instead of all weights (0: all weights). Checkpoints then
    hold the adapter only, which engines load over the base they serve."""
    lora_alpha: float = Field(default=0.0, ge=0)
    """LoRA scaling numerator (update = alpha / rank x B A); 0: twice the rank."""
    lora_targets: str = "all-linear"
    """Modules that get an adapter: `all-linear` (all but the output head) or names, `q_proj,v_proj`."""

    # Groups and batches ------------------------------------------------------------------------
    num_repeat: int = Field(default=DEFAULT_GROUP_SIZE, ge=2)
    """Episodes per GRPO group, unless its client declared a size on `begin`."""
    group_timeout_s: float = Field(default=300.0, gt=0)
    """A group not ready this long after its first sample is flushed: trained with at least
    `min_group_size` complete episodes, else dropped."""
    stall_warn_s: float = Field(default=20.0, gt=0)
    """Warn (log line naming the client, `stalled_groups` counter) about a group short of its size
    with no new episode for this long, instead of only at the group timeout."""
    min_group_size: int = Field(default=2, ge=2)
    """Fewest complete episodes a timed-out group needs to be trained (one episode has no baseline)."""
    skip_zero_adv_groups: bool = True
    """Drop groups whose rewards are all equal (zero advantages only dilute the token mean)."""
    per_episode_norm: bool = False
    """Normalise advantages over episodes (each counts once) instead of over samples."""
    batch_groups: int = Field(default=4, ge=1)
    """Groups per training step (one step = one policy version); with `min_batch_groups`, the most."""
    min_batch_groups: int = Field(default=0, ge=0)
    """Fewest trainable groups a step waits for; a free trainer then takes every ready group, up to
    `batch_groups` (0: `batch_groups`). Keeps steps frequent late in a run
    (bench/results/peers-probe-min-batch-groups.md), but small steps are noisy and can collapse
    held-out success (bench/results/up/calculator-min-batch-groups-1.md; see `rollback_window`)."""
    batch_wait_s: float = Field(default=0.0, ge=0)
    """With `min_batch_groups`: how long a free trainer holding fewer than `batch_groups` trainable
    groups waits for more before stepping (bench/results/peers-probe-batch-wait.md)."""

    rollback_window: int = Field(default=0, ge=0)
    """Groups the collapse guard (`guard.py`) averages the train reward over; 0: no guard. When it
    falls `rollback_drop` below the best window's, the trainer reloads the best window's newest
    checkpoint and serves it as a new version (bench/results/guard-replay.md). One process only."""
    rollback_drop: float = Field(default=0.5, gt=0)
    """How far (in reward units) a window's mean reward must fall below the best for a rollback."""

    # Loss --------------------------------------------------------------------------------------
    clip_eps_low: float = Field(default=0.2, ge=0)
    """PPO ratio clip below: ratio >= 1 - clip_eps_low."""
    clip_eps_high: float = Field(default=0.28, ge=0)
    """PPO ratio clip above: ratio <= 1 + clip_eps_high (higher, as in DAPO)."""
    max_staleness: int = Field(default=4, ge=0)
    """Drop samples whose oldest generated token is more than this many versions behind the policy."""
    is_cap: float = Field(default=2.0, gt=0)
    """Cap of the truncated token-level importance weight applied to off-policy tokens."""
    kl_coef: float = Field(default=0.0, ge=0)
    """Weight of the k3 KL estimator to the initial model; 0 loads no reference model."""

    # Compute -----------------------------------------------------------------------------------
    max_tokens_per_micro_batch: int = Field(default=512, ge=2)
    """Tokens per packed micro-batch row (a longer sample gets a row of its own; samples are cut only
    past the model's context length). Small rows are fastest on CPU; on GPU raise it to fill memory."""
    prefix_sharing: bool = True
    """Lay micro-batches out as prefix trees, computing shared prefixes once (`batching.pack_shared`);
    False packs samples side by side (`batching.pack`)."""
    grad_accum: int = Field(default=0, ge=0)
    """Micro-batches per optimizer update; 0: one update per step."""
    epochs: int = Field(default=1, ge=1)
    """Passes over each step's samples (PPO epochs); later updates are clipped against the weights
    the step began with."""
    keep_checkpoints: int = Field(default=3, ge=1)
    """Checkpoints kept on disk (older ones are deleted)."""
    share_weights: bool = False
    """Also put every version's files into NATS's object store (`swarm-weights`) for engines that
    cannot read `run_dir` (`services/common/objects.py`, `infra/multihost.md`)."""
    optimizer_state_every: int = Field(default=0, ge=0)
    """Steps between saves of the optimizer state beside a checkpoint. 0: every step below 100M
    trained parameters, every 10 above (bench/results/real-model.md). A resume takes the newest state
    at or before its checkpoint."""

    # NATS --------------------------------------------------------------------------------------
    fetch_batch: int = Field(default=256, ge=1)
    """Messages per pull-consumer fetch."""
    ack_wait_s: float = Field(default=30.0, gt=0)
    """Ack wait of the durable consumer (held samples are kept alive every third of it): how long a
    dead trainer's samples take to come back."""
    drop_report_s: float = Field(default=0.5, gt=0)
    """Samples dropped untrained are reported and acked this long after the first of them, unless a
    step reports them sooner; until then they count as backlog (bench/results/swarm-drops.md)."""

    @model_validator(mode="after")
    def _check(self) -> TrainerSettings:
        if self.min_group_size > self.num_repeat:
            raise ValueError(f"min_group_size {self.min_group_size} > num_repeat {self.num_repeat}")
        if self.min_batch_groups > self.batch_groups:
            raise ValueError(
                f"min_batch_groups {self.min_batch_groups} > batch_groups {self.batch_groups}: a step "
                "never takes more than batch_groups groups"
            )
        return self


class TrainerConfig(ServiceConfig, TrainerSettings):
    """`swarmrl serve trainer --model NAME --model-path DIR [...]`."""

    model: str = "tiny"
    """Name of the trainable model: reads `swarm.samples.<model>`, writes KV `swarm-models[<model>]`."""
    model_path: str
    """Initial HF model directory (weights, config, tokenizer); version 0 points at it."""
    run_dir: str = "runs/default"
    """Run directory; checkpoints go to `<run_dir>/checkpoints/<model>/step-<N>/`."""
    seed: int = 0
    """Seed for torch/numpy/random."""
    max_steps: int = Field(default=0, ge=0)
    """Stop after this many steps in total (counting resumed ones); 0 runs forever."""
    replica: str = ""
    """This process's name among the model's trainer replicas: the lease holder trains, the others
    stand by (`lead.py`). Empty: the only trainer, no lease."""

    @model_validator(mode="after")
    def _check_steps(self) -> TrainerConfig:
        if self.lr_scheduler != "constant" and self.max_steps <= 0:
            raise ValueError(
                f"lr_scheduler {self.lr_scheduler!r} decays to 0 at max_steps: give max_steps > 0"
            )
        return self
