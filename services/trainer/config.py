"""Configuration of the trainer service (one process per trainable model): `TrainerSettings`, what
a swarm description's `[models.<name>.trainer]` may set, and `TrainerConfig`, the process's whole
configuration (`swarmrl serve trainer --help`), which adds what `swarmrl up` places."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from swarmrl.core.config import ServiceConfig, Settings
from swarmrl.schemas import DEFAULT_GROUP_SIZE


class TrainerSettings(Settings):
    """How one model trains: optimiser, groups and batches, loss, compute."""

    # Optimiser ---------------------------------------------------------------------------------
    lr: float = Field(default=1e-4, gt=0)
    """AdamW learning rate (peak of `lr_scheduler`). The default suits the tiny bootstrap models;
    models of a billion parameters want about 1e-6."""
    lr_scheduler: Literal["constant", "linear", "cosine"] = "constant"
    """Learning-rate schedule over trainer steps (transformers' `get_scheduler`), after `warmup_steps`
    of linear warmup from 0; `linear` and `cosine` decay to 0 at `max_steps`."""
    warmup_steps: int = Field(default=0, ge=0)
    """Trainer steps of linear learning-rate warmup (0: none)."""
    mixed_precision: Literal["auto", "no", "bf16"] | None = "auto"
    """`bf16`: forward and backward under bf16 autocast (CPU and GPU, through Accelerate); the
    weights and the optimizer state stay fp32. `auto`: bf16 for a model of at least 100M parameters,
    `no` below (`swarmrl.core.precision`). None: what `accelerate launch`'s config says."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    max_grad_norm: float = 1.0
    """Gradient norm clip per optimizer update; 0 disables clipping (the norm is still reported)."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass (less memory, ~30% slower); for large models on GPU."""
    lora_rank: int = Field(default=0, ge=0)
    """Rank of a LoRA adapter (peft) trained instead of all weights; 0 trains all weights. With LoRA a
    checkpoint holds the adapter only, and engines load it as an adapter of the base they serve."""
    lora_alpha: float = Field(default=0.0, ge=0)
    """LoRA scaling numerator (the update is alpha / rank x B A); 0: twice the rank."""
    lora_targets: str = "all-linear"
    """Modules that get an adapter: `all-linear` (every linear layer but the output head), or module
    names separated by commas (`q_proj,v_proj`)."""

    # Groups and batches ------------------------------------------------------------------------
    num_repeat: int = Field(default=DEFAULT_GROUP_SIZE, ge=2)
    """Episodes per GRPO group: a group is ready once it holds this many complete episodes (a group
    whose client declared its size on `begin` has that size)."""
    group_timeout_s: float = Field(default=300.0, gt=0)
    """A group not ready this long after its first sample is flushed: trained if it has at least
    `min_group_size` complete episodes, otherwise its samples are dropped (acked and counted)."""
    stall_warn_s: float = Field(default=20.0, gt=0)
    """Warn (log line naming the client, and the `stalled_groups` counter) about a group that has had
    no new episode for this long while short of its size: a client playing fewer episodes per group
    than the group size trains nothing, and hears so in seconds instead of at the group timeout."""
    min_group_size: int = Field(default=2, ge=2)
    """Fewest complete episodes a timed-out group needs to be trained (one episode has no baseline)."""
    skip_zero_adv_groups: bool = True
    """Drop groups whose rewards are all equal (all advantages are 0; without KL they only dilute the
    token mean). When false they are trained (only the KL term then acts on them)."""
    per_episode_norm: bool = False
    """Normalise advantages over episodes (each episode counts once) instead of over samples (an
    episode that yielded several samples weighs more in the group mean/std)."""
    batch_groups: int = Field(default=4, ge=1)
    """Groups per training step (one step = one policy version); with `min_batch_groups`, the most."""
    min_batch_groups: int = Field(default=0, ge=0)
    """Fewest trainable groups a step waits for; a free trainer then takes every ready group, up to
    `batch_groups`. 0: `batch_groups` (every step the same size). 1: the trainer steps whenever a
    group is ready, so a step takes the groups that arrived during the previous one. Late in a run,
    when most groups have equal rewards and are dropped, steps of a fixed `batch_groups` wait for
    many groups to be played and grow rare, while steps of the groups ready stay frequent
    (bench/results/peers-probe-min-batch-groups.md). Not the default: steps of one group are
    noisier, and can collapse held-out success within a minute
    (bench/results/up/calculator-min-batch-groups-1.md); `rollback_window` brings such a fall back."""
    batch_wait_s: float = Field(default=0.0, ge=0)
    """With `min_batch_groups`: how long a free trainer that holds at least `min_batch_groups`
    trainable groups, and fewer than `batch_groups`, waits for more before it steps with those
    (0: it steps at once). Early in a run groups with unequal rewards come fast and steps stay full;
    late, when they are rare, the wait runs out and steps of fewer groups keep the trainer busy. 0 by
    default: a wait of 1 s made late steps rarer and the best held-out success later
    (bench/results/peers-probe-batch-wait.md)."""

    rollback_window: int = Field(default=0, ge=0)
    """Groups the collapse guard averages the train reward over (`guard.py`); 0: no guard. When a
    window of groups made by newer versions has a mean reward `rollback_drop` below the best window's,
    the trainer loads the checkpoint of the best window's newest version back (weights and optimizer
    state, kept on disk for this) and serves it as a new version. For runs whose steps are small
    (`min_batch_groups`), whose held-out success can fall in a few versions and not come back
    (bench/results/guard-replay.md replays recorded runs through it). One training process only (a
    trainer under `accelerate launch` refuses it)."""
    rollback_drop: float = Field(default=0.5, gt=0)
    """How far (in reward units) a window's mean reward must fall below the best window's for the
    collapse guard (`rollback_window`) to roll back."""

    # Loss --------------------------------------------------------------------------------------
    clip_eps_low: float = Field(default=0.2, ge=0)
    """PPO ratio clip below: ratio >= 1 - clip_eps_low."""
    clip_eps_high: float = Field(default=0.28, ge=0)
    """PPO ratio clip above: ratio <= 1 + clip_eps_high (a higher upper clip, as in DAPO)."""
    max_staleness: int = Field(default=4, ge=0)
    """Samples whose oldest generated token is more than this many versions behind the current policy
    are dropped (acked and counted). 0 keeps only samples of the current version."""
    is_cap: float = Field(default=2.0, gt=0)
    """Cap of the truncated token-level importance weight applied to off-policy tokens."""
    kl_coef: float = Field(default=0.0, ge=0)
    """Weight of the k3 KL estimator to the initial model; 0 loads no reference model."""

    # Compute -----------------------------------------------------------------------------------
    max_tokens_per_micro_batch: int = Field(default=512, ge=2)
    """Tokens per packed micro-batch row: samples are laid side by side up to it, and a longer sample
    gets a row of its own (samples are truncated, and counted, only past the model's context length,
    its config's `max_position_embeddings`). Attention over a packed row costs (row length)^2 with sdpa
    (the block-diagonal mask is dense), so on CPU rows of a few samples are fastest; on GPU raise it
    to fill memory."""
    prefix_sharing: bool = True
    """Lay each micro-batch out as a prefix tree: samples sharing a prefix (a GRPO group's prompt, an
    episode's timelines) compute it once (`batching.pack_shared`); the loss and gradients are those
    of samples computed apart. False packs samples side by side (`batching.pack`)."""
    grad_accum: int = Field(default=0, ge=0)
    """Micro-batches accumulated into one optimizer update. 0: one update per step over all its
    micro-batches. N: a step makes ceil(micro_batches / N) updates (PPO mini-batches)."""
    epochs: int = Field(default=1, ge=1)
    """Passes over each step's samples (TRL's `num_iterations`, PPO's epochs), each of its updates
    (`grad_accum`); every update after the first is clipped against the weights the step began with.
    More than 1 learns more from each sample, at that many times the trainer's compute per step."""
    keep_checkpoints: int = Field(default=3, ge=1)
    """Checkpoints kept on disk (older ones are deleted; engines get time to load the newest)."""
    share_weights: bool = False
    """Also put every version's served files (weights, config, tokenizer) into NATS's object store
    (bucket `swarm-weights`, the newest 3 versions kept) before naming it in KV, for engines on hosts
    that cannot read `run_dir`: such an engine fetches the version from there into its own
    `$SWARMRL_HOME/weights/` (`services/common/objects.py`; `infra/multihost.md`). Off, every engine
    must see the checkpoint paths this trainer puts in KV."""
    optimizer_state_every: int = Field(default=0, ge=0)
    """Steps between saves of the optimizer state beside a checkpoint's weights (step 0 included).
    0: every step while the trained weights are under 100M parameters (an adapter, a tiny model),
    every 10 steps above: for a model trained in full the state is twice the weights (1 GB at 135M
    parameters) and writing it every step doubled a step's time (`bench/results/real-model.md`). A
    resumed (or rolled back) trainer takes its checkpoint's weights, which are exact, and the newest
    optimizer state at or before it."""

    # NATS --------------------------------------------------------------------------------------
    fetch_batch: int = Field(default=256, ge=1)
    """Messages per pull-consumer fetch."""
    ack_wait_s: float = Field(default=30.0, gt=0)
    """Ack wait of the durable consumer; held samples get an in-progress signal every third of it.
    After a crash, the samples the dead trainer held come back this long after its death."""
    drop_report_s: float = Field(default=0.5, gt=0)
    """Samples dropped untrained (stale, zero advantage, ...) are reported on `swarm.metrics.drops`
    and acked this long after the first of them, if no step reported them sooner. Until acked they
    count as backlog for the gateway's admission control: late in a run, when most groups have zero
    advantage, a long delay holds more of them than the backlog bound and new groups wait
    (bench/results/swarm-drops.md: 5 s against 0.5 s)."""

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
    """Seed for torch/numpy/random (set before the model is loaded)."""
    max_steps: int = Field(default=0, ge=0)
    """Stop after this many steps in total (counting resumed ones); 0 runs forever."""
    replica: str = ""
    """This process's name among the model's trainer processes (`[replicas] trainer` > 1): the one
    that holds the lead lease trains, the others wait with the model loaded and take over when it dies
    (`services/trainer/lead.py`). Empty: the only trainer, no lease."""

    @model_validator(mode="after")
    def _check_steps(self) -> TrainerConfig:
        if self.lr_scheduler != "constant" and self.max_steps <= 0:
            raise ValueError(
                f"lr_scheduler {self.lr_scheduler!r} decays to 0 at max_steps: give max_steps > 0"
            )
        return self
