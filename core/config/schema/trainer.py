"""The `trainer` section (with megatron's) and `synchronizer`."""

from __future__ import annotations

from dataclasses import dataclass, field

from .fields import bounded, choice


@dataclass
class MegatronConfig:
    """Parallel layout of `trainer.strategy: megatron`; the data-parallel size is what remains:
    ranks / (tensor_model_parallel_size * pipeline_model_parallel_size * context_parallel_size)."""

    tensor_model_parallel_size: int = bounded(1, ge=1)
    """Ranks that split each layer's matrices (attention heads, MLP columns, vocabulary)."""
    pipeline_model_parallel_size: int = bounded(1, ge=1)
    """Ranks that split the layers into consecutive stages."""
    context_parallel_size: int = bounded(1, ge=1)
    """Ranks that split each packed micro-batch's sequences between them (each rank holds 2 of every
    sequence's 2 x size chunks; attention gathers the rest): a sequence that many times longer than
    one rank's budget trains. Needs trainer.use_remove_padding."""
    expert_model_parallel_size: int = bounded(1, ge=1)
    """Ranks that split a MoE model's experts between them (each rank holds num_experts / size of
    every MoE layer's experts; tokens travel to their experts' ranks and back by all-to-all); the
    attention and the rest stay data-parallel over those ranks. 1 for a dense model."""
    use_distributed_optimizer: bool = True
    """Shard optimizer state and master weights over the data-parallel ranks (ZeRO-1)."""
    optimizer_offload_fraction: float = bounded(0.0, ge=0.0, le=1.0)
    """The share of the optimizer's state (master weights and Adam's moments) kept and stepped on the
    CPU (megatron-core's HybridDeviceOptimizer: gradients copied to the host, updated parameters
    back); 0 keeps it all on the device. Needs a GPU."""


@dataclass
class FsdpConfig:
    """Where `trainer.strategy: fsdp2` (or `fsdp`) keeps the policy: CPU memory in place of the
    device's, paid for in copies each step."""

    param_offload: bool = False
    """The policy's parameters, gradients and optimizer state live on the CPU (FSDP2's
    CPUOffloadPolicy; FSDP1's CPUOffload, GPU only): each block's parameters are copied to the device
    for its forward and backward, its gradients copied back, and the optimizer steps on the CPU."""


@dataclass
class TinkerConfig:
    """How a run meets the Tinker service its trainer.remote names (tinker://...)."""

    base_model: str | None = None
    """The base model's name on the service, trained and sampled there (unset: model.model_path,
    which is read here for the tokenizer and the tasks' prompts either way)."""
    api_key_env: str = "TINKER_API_KEY"
    """The environment variable holding the service's API key (the SDK's own default)."""


@dataclass
class TrainerConfig:
    strategy: str = choice("fsdp2", "rlcore.backends:STRATEGIES")
    """Training strategy (`--strategy` on the command line overrides it)."""
    total_steps: int | None = bounded(None, ge=1)
    """Stop after this many optimizer steps (null: when the buffer is exhausted)."""
    save_interval: int = bounded(0, ge=0)
    """Checkpoint every N optimizer steps (0: only at the end of the stage)."""
    max_checkpoints_to_keep: int | None = bounded(None, ge=1)
    """Delete older checkpoints beyond this many (null: keep all)."""
    resume_fallback: bool = True
    """On resume, a newest checkpoint that fails verification (a file missing, truncated or
    changed since it was written) is named in a warning and the previous good one is used; false:
    stop with that error instead."""
    save_hf_checkpoint: str = choice("last", ("last", "always", "never"))
    """Also export HF format (loadable by from_pretrained): with the last checkpoint, every one, or never."""
    grad_clip: float = bounded(1.0, ge=0.0)
    """Max global gradient norm (0 disables clipping)."""
    max_token_len_per_gpu: int = bounded(16384, gt=0)
    """Micro-batch token budget per rank: sequences are grouped so each forward stays under it (the
    sum of their lengths when packed, else rows x the longest); a micro-batch split over S ranks
    (ulysses_sequence_parallel_size, megatron.context_parallel_size) holds up to S times it."""
    use_remove_padding: bool = True
    """Pack each micro-batch's sequences end to end with no padding for every forward (policy,
    reference, critic; RL, SFT and DPO): attention stays within each sequence, so the numbers are the
    padded ones up to float rounding, and a long tail of lengths no longer costs padding. false: pad
    every row to the micro-batch's longest."""
    ulysses_sequence_parallel_size: int = bounded(1, ge=1)
    """fsdp and fsdp2: ranks that split each packed micro-batch's tokens between them (Ulysses
    sequence parallelism: attention trades token slices for heads by all-to-all), so a sequence this
    many times longer than one rank's memory allows trains; the ranks of a group share one
    data-parallel share. Must divide the trainer ranks and the model's attention heads; needs
    use_remove_padding."""
    balance_batch: bool = True
    """Deal a mini-batch's sequences to the data-parallel ranks so their token counts balance
    (longest first, to the least loaded rank), and group each rank's share into micro-batches by
    length; false: contiguous shares in rollout order. The loss is normalised over the whole batch
    either way."""
    gradient_checkpointing: bool = False
    """Recompute activations in backward to save memory."""
    freeze_router: bool = False
    """MoE models (Qwen3-MoE): the routers' weights are not trained (no gradient, no optimizer
    state), so the experts each token goes to move only with the hidden states; one knob against
    the routing drift between the engine's and the trainer's passes in RL. Every strategy."""
    router_aux_loss_coef: float = bounded(0.0, ge=0.0)
    """MoE models: the weight of the routers' load-balancing loss (core/moe_balance.py, the same on
    every strategy) added to the policy's loss in every update, SFT's too; 0 (the default, as RL
    usually runs): none. Reported as actor/router_aux_loss."""
    max_restarts: int = bounded(0, ge=0)
    """How often a failed trainer world is restarted (every node's ranks, by torchrun) to resume
    from its last verified checkpoint, the explorer's and the experience buffer's position
    included; the launch's rollout workers keep running. 0: a failure ends the launch."""
    remote: str | None = None
    """host:port of a TrainerService started with `rlcore trainer serve`, or tinker://host:port
    (tinker+https://host/path) of a Tinker service (`rlcore tinker serve`, or Tinker itself): the loop
    runs in the launch process and drives that trainer instead of starting a trainer world."""
    tinker: TinkerConfig = field(default_factory=TinkerConfig)
    """Only read with trainer.remote tinker://..."""
    megatron: MegatronConfig = field(default_factory=MegatronConfig)
    """Only read by `strategy: megatron`."""
    fsdp_config: FsdpConfig = field(default_factory=FsdpConfig)
    """Only read by `strategy: fsdp2` and `fsdp`."""
    offload_untrained_models: bool = False
    """fsdp2 and fsdp (GPU only): the reference model (which no step trains) lives on the CPU, each
    block's parameters copied to the device for its forward."""


@dataclass
class SynchronizerConfig:
    sync_method: str = choice("auto", "rlcore.weights:SYNC_METHODS")
    """How weights reach the engines: nccl (a process group between trainer rank 0 and the rollout
    workers' engine processes: NCCL on GPU, gloo on CPU), checkpoint (rank 0 writes an HF folder
    the workers load: a shared file system instead of a group), memory (engine in trainer rank 0's
    process, mode colocate), auto (memory for colocate, nccl otherwise). A decoupled run (modes train
    and explore, the same value in both launches): auto publishes every version as a folder the
    explorer's workers load; nccl pushes every version after the first to the workers the explorer
    registers, over a process group (a folder again whenever no group forms)."""
    bucket_mb: int = bounded(64, gt=0)
    """Weights are packed into buckets of this many MiB, one broadcast each."""
    sync_interval: int = bounded(1, ge=1)
    """Sync after every N optimizer steps (sync_style fixed)."""
    sync_offset: int = bounded(0, ge=0)
    """Delay the first sync by this many steps."""
    sync_timeout: float = bounded(1200.0, gt=0.0)
    """Seconds each phase of a sync (group forming, announce, transfer, load) may take before it is
    an error naming the worker and the phase."""
    sync_style: str = choice("fixed", ("fixed", "explorer_driven", "trainer_driven"))
    """Who decides when to sync: fixed (every sync_interval steps after sync_offset),
    trainer_driven (after every optimizer step: the engines never lag), explorer_driven (just
    before the explorer would generate with weights older than max_staleness allows: the fewest
    syncs)."""
    max_staleness: int | None = bounded(None, ge=0)
    """Train only on experiences at most this many policy versions older than the weights being
    trained; older ones are dropped and counted (rollout/stale_dropped). None: no bound. A run on
    the experience buffer (mode explore/train, asynchronous both): the explorer explores only with
    weights at most this many versions older than the optimizer step that will train on what it
    explores (one version per optimizer step, buffer.train_batch_size deciding how many an explore
    step takes), and the trainer drops older experiences only with algorithm.sample_strategy:
    staleness_control."""
    rollout_ahead: int = bounded(0, ge=0, le=1)
    """1: the rollout workers generate the next step's experiences while the trainer trains on this
    step's (one step off-policy: they are sync_interval versions old when trained on); the step then
    takes about the longer of the two instead of their sum. 0: generate, then train. Mode both."""
    asynchronous: bool = False
    """Mode both: explore in a thread of the trainer's process, on the rollout workers, up to
    max_staleness steps (default 1) ahead of the weights they hold, while the trainer trains on what
    came before; the two meet in an in-memory experience buffer, and the workers load the weights
    the trainer publishes after each sync_interval steps (as in a decoupled run, within one launch).
    The trainer evaluates on an engine of its own."""
    lora_sync: str = choice("auto", ("auto", "adapter", "merged"))
    """With LoRA (model.lora_configs): adapter sends only each adapted layer's factors and scale, which
    the engines merge into the base weights they read from their model folder (a rank-16 adapter of
    a 7B model: about 40 MB against 15 GB); merged sends the merged weights. auto: adapter to rollout
    workers whose engine merges adapters (engine_type hf; sync_method nccl or checkpoint), merged
    to an engine in the trainer's process (no wire to spare), to vLLM, and to a decoupled run's
    explorer and its published folders, which explorers also start from."""
    checksums: bool = False
    """Every bucket carries a CRC-32 that each engine checks before loading anything; a mismatch
    fails the sync and the engine keeps its last good version (nccl only)."""
    probe: bool = False
    """After each sync, compare the engine's greedy log-probs on a fixed prompt with the trainer's
    (with trainer.remote, the trainer's come from its ComputeLogprobs)."""
    probe_tolerance: float = bounded(0.0, ge=0.0)
    """Largest mean |log-prob difference| the probe accepts; 0: by dtype (1e-3 float32, 5e-2
    bfloat16/float16)."""
