"""A trainer world as every rank holds it: the commands rank 0 gives and every rank runs.

Rank 0 (the loop's LocalTrainer under `rlcore launch`, or TrainerService under `rlcore trainer
serve`) broadcasts each command with a `Commander`; the other ranks run them in `follow`. So every
rank calls the same TrainerWorld methods with the same arguments in the same order, and the
strategy's collectives line up. `init_world` is how every trainer rank joins its torchrun world,
and `exit_world` how it leaves.
"""

from __future__ import annotations

import datetime
import gc
import logging
import math
import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NoReturn

import torch
import torch.distributed as dist

from ..core.batch import shard
from ..core.checkpoint import TrainerState
from ..core.config import RLCoreConfig
from ..core.fast_exit import exit_now
from ..core.hf_export import HF_DIR, export_hf
from ..core.step_metrics import rollout_report
from ..core.types import Experience
from ..core.watchdog import deadline
from .commands import (
    Command,
    ConfigureCall,
    ExportWeightsCall,
    ForwardBackwardCall,
    LoadCheckpointCall,
    LogprobsCall,
    OptimStepCall,
    ProbeCall,
    PublishWeightsCall,
    RolloutCall,
    SaveCheckpointCall,
    ShutdownCall,
    StartEnginesCall,
    SyncWeightsCall,
    TrainStepCall,
)
from .failure import one_line
from .training import StageTraining

if TYPE_CHECKING:
    from ..rollout.local import LocalRollout
    from ..weights.base import WeightSource, WeightTransport
    from ..weights.sender import WeightSender

log = logging.getLogger("rlcore.trainer_world")

IDLE_TIMEOUT = datetime.timedelta(days=7)
"""Timeout of the group commands travel on. Ranks > 0 wait there for the next command for as long
as rank 0 explores, evaluates or (serving) no client calls, so it has to outlast idle time. It is
a gloo group: idle ranks block on the CPU, never in a spinning NCCL kernel; the default group
keeps its usual timeout for the work itself."""


def world_backend(device: str) -> str:
    """The trainer world's default-group backend. On CUDA it runs NCCL for CUDA tensors and gloo for
    CPU ones: the loop all-reduces small CPU tensors (micro-batch counts, log-prob gap metrics),
    which an NCCL-only group refuses ("No backend type associated with device type cpu")."""
    return "cpu:gloo,cuda:nccl" if device == "cuda" else "gloo"


def init_world(device: str, timeout_s: float | None = None) -> None:
    """Join the torchrun world this process was started in (on CUDA, on its LOCAL_RANK's GPU);
    `timeout_s` bounds each collective (cluster.collective_timeout_s; None: torch's default)."""
    if device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    timeout = None if timeout_s is None else datetime.timedelta(seconds=timeout_s)
    dist.init_process_group(backend=world_backend(device), timeout=timeout)


def exit_world(code: int) -> NoReturn:
    """End a rank whose work is done and written: destroy its process groups, run the atexit
    handlers (multiprocessing reaps any children it started there), flush Python's and C's output
    buffers, and exit with `code` without the interpreter's finalization.

    Why not a plain return: destroy_process_group does not free a gloo group that anything still
    references (importing torch._dynamo, as transformers and FSDP do, takes ten references to the
    default group; building an FSDP strategy leaves one or two more after it is freed), so the
    group's worker threads live on into finalization. The last of them to run a collective releases
    its tensors a moment after the collective returns; when that release needs the GIL after
    finalization has begun, Python 3.11 ends the thread mid-C++ and the process aborts ("terminate
    called without an active exception", SIGABRT) with every result already on disk. Seen in 5 of
    270 two-rank float16 FSDP parity runs on two busy cores, and once in CI."""
    if dist.is_initialized():  # trainer_rank.py and trainer_serve.py have destroyed theirs already
        dist.destroy_process_group()
    exit_now(code)


SenderFactory = Callable[[list[str], RLCoreConfig, str], "WeightSender"]
"""(endpoints, the stage's config, the workers' token or "" for the run's) -> a sender to them."""
"""Rank 0's way to reach rollout workers: endpoints and the stage config -> a WeightSender."""


class TrainerWorld:
    """The training side as every rank holds it, plus this rank's in-process engine (if the stage
    runs one: `start_engines`) and the stage's weight transports."""

    def __init__(self, device: str, make_sender: SenderFactory | None = None):
        self.device = device
        self.training: StageTraining | None = None
        self.engine: LocalRollout | None = None
        self.model_path = ""
        self.vocab_size = 0
        self.weights = "none"
        """The configured stage's weight transport (its plan's)."""
        self.lora_sync = ""
        """With LoRA, whether pushes after a transport's first carry the adapter alone (its plan's)."""
        self._make_sender = make_sender  # rank 0 only
        self._transports: dict[tuple[str, ...], WeightTransport] = {}

    def _t(self) -> StageTraining:
        assert self.training is not None, "rank 0 checks Configure before broadcasting"
        return self.training

    def configure(self, call: ConfigureCall) -> dict[str, Any]:
        self.close_stage()
        self.training = None  # free the previous model and optimizer before building the next
        gc.collect()
        if self.device == "cuda":
            torch.cuda.empty_cache()
        self.training = StageTraining(
            call.cfg, call.checkpoint_dir, call.model_path, self.device, call.total_steps, call.plan.passes
        )
        self.model_path = call.model_path
        self.weights = call.plan.weights
        self.lora_sync = call.plan.lora_sync
        self.vocab_size = int(self.training.strategy.hf_config().vocab_size)
        return {
            "strategy": call.cfg.trainer.strategy,
            "world_size": dist.get_world_size(),
            "num_parameters": _num_parameters(self.training.strategy),
        }

    def start_engines(self, call: StartEnginesCall) -> bool:
        """Build the stage's in-process engine in rank 0, or in every rank; returns whether rank 0's
        came from an earlier stage (and so holds that stage's weights until the first sync)."""
        t = self._t()
        if call.every_rank or dist.get_rank() == 0:
            from ..rollout.local import LocalRollout

            self.engine = LocalRollout(t.cfg, self.model_path, self.device)
        box = [self.engine is not None and self.engine.reused]
        dist.broadcast_object_list(box, src=0)
        return bool(box[0])

    def forward_backward(self, call: ForwardBackwardCall) -> dict[str, Any]:
        return self._t().train_sequences(
            call.sequences, call.loss, call.temperature, call.normalize_tokens, call.clip
        )

    def compute_logprobs(self, call: LogprobsCall) -> list[list[float]]:
        return self._t().logprobs(call.sequences, call.temperature, call.reference)

    def optim_step(self, call: OptimStepCall) -> dict[str, Any]:
        t = self._t()
        grad_norm, lr = t.optimizer_step(call.adam)
        return {"grad_norm": grad_norm, "lr": lr, "global_step": t.state.global_step}

    def train_step(self, call: TrainStepCall) -> dict[str, Any]:
        t = self._t()
        metrics = t.train_experiences(call.experiences)
        return {"metrics": metrics, "global_step": t.state.global_step}

    def save_checkpoint(self, call: SaveCheckpointCall) -> dict[str, str]:
        path = self._t().save(call.export_hf, call.explore_step)
        return {"path": path, "hf_path": os.path.join(path, HF_DIR) if call.export_hf else ""}

    def load_checkpoint(self, call: LoadCheckpointCall) -> TrainerState:
        state = self._t().load(call.path)
        if call.weights_only:
            self._t().strategy.reset_optimizer()
        return state

    def sync_weights(self, call: SyncWeightsCall) -> dict[str, Any]:
        """Push the current weights to the engines: the rollout workers at `endpoints` (rank 0
        sends), or with none this stage's in-process engines. Every rank walks the weights, also
        when rank 0 cannot reach the workers, so the ranks stay in step: rank 0 then answers
        {"failed": one line} instead of raising, every rank having finished the command."""
        from ..backends.common.collectives import on_ranks
        from ..weights import build_transport
        from ..weights.adapter import AdapterSource
        from ..weights.base import Endpoints

        t, endpoints = self._t(), call.endpoints
        start = time.perf_counter()
        key = (call.transport, *endpoints)
        failure: Exception | None = None
        transport = self._transports.get(key)
        first = transport is None
        if transport is None:
            sender = None
            if endpoints and self._make_sender is not None:  # rank 0
                try:
                    sender = self._make_sender(endpoints, t.cfg, call.token)
                except Exception as e:
                    failure = e
            where = Endpoints(self.engine, sender, os.path.join(t.stage_dir, "weight_sync"), self.model_path)
            transport = build_transport(call.transport or self.weights, where)
        try:
            # a backstop: each phase of the push has sync_timeout of its own, and a worker that misses
            # one is an error the loop handles (it syncs again with the workers that answer)
            backstop = 2 * t.cfg.synchronizer.sync_timeout + 30
            source: WeightSource = t.strategy
            if self.lora_sync == "adapter" and not call.transport:  # the stage's own engines (not an explorer's)
                # only rank 0 rebuilds its transport after a failed push: every rank walks the bases then
                source = AdapterSource(t.strategy, with_base=on_ranks(first, every=False))  # type: ignore[arg-type]
            with deadline(backstop, "a weight sync", "synchronizer.sync_timeout"):
                stats = transport.push(source, t.state.global_step)
            if failure is not None:
                raise failure
        except Exception as e:
            transport.close()  # its group may be broken; the next call forms a new one
            self._transports.pop(key, None)
            return {"failed": one_line(e)}
        self._transports[key] = transport
        t.state.policy_version = transport.version
        return {
            "policy_version": transport.version,
            "num_bytes": int(stats.get("num_bytes", 0)),
            "seconds": stats.get("total_s", time.perf_counter() - start),
        }

    def publish_weights(self, call: PublishWeightsCall) -> dict[str, Any]:
        """Write the current weights as the next version in `folder` for the explorers of a
        decoupled run (transports/publish.py); every rank walks the weights, rank 0 writes."""
        from ..weights import build_transport
        from ..weights.base import Endpoints

        t, folder = self._t(), call.folder
        start = time.perf_counter()
        key = ("publish", folder)
        transport = self._transports.get(key)
        if transport is None:
            os.makedirs(folder, exist_ok=True)
            transport = build_transport("publish", Endpoints(folder=folder, tokenizer_dir=self.model_path))
            self._transports[key] = transport
        stats = transport.push(t.strategy, t.state.global_step)
        return {
            "policy_version": transport.version,
            "num_bytes": int(stats.get("num_bytes", 0)),
            "seconds": stats.get("total_s", time.perf_counter() - start),
        }

    def export_weights(self, call: ExportWeightsCall) -> dict[str, Any]:
        """The current weights as an HF folder at `folder` (written beside it, then renamed over it):
        every rank walks the weights, rank 0 writes."""
        import shutil

        t, folder = self._t(), os.path.abspath(call.folder)
        rank0 = dist.get_rank() == 0
        partial = folder + ".partial"
        if rank0:
            shutil.rmtree(partial, ignore_errors=True)
            os.makedirs(partial)
        export_hf(t.strategy.iter_full_weights(), partial, t.export_config(), self.model_path, write=rank0)
        dist.barrier()
        if not rank0:
            return {}
        shutil.rmtree(folder, ignore_errors=True)
        os.replace(partial, folder)
        size = sum(e.stat().st_size for e in os.scandir(folder) if e.name.endswith(".safetensors"))
        return {"folder": folder, "num_bytes": size}

    def rollout(self, call: RolloutCall) -> tuple[list[Experience], dict[str, float], str | None] | None:
        """The engines in every rank: each rank generates its contiguous share (whole groups)
        within explorer.max_timeout (a seeded prompt samples the same in any rank). Rank 0 gets all experiences in task order, the
        rollout's metrics (engines that generated, the slowest rank's timings) and the first
        failure of any rank ("Kind:message", for rank 0 to raise outside the command: every rank
        has finished it)."""
        rank, world = dist.get_rank(), dist.get_world_size()
        assert self.engine is not None, "engines started in every rank"
        mine = shard(call.tasks, rank, world)
        local: tuple[list[Experience], dict[str, float], str | None] = ([], {}, None)
        if mine:
            try:  # engines seed each prompt by itself: the shares sample what one engine would
                with deadline(call.timeout, "a rollout batch", "explorer.max_timeout"):
                    exps = self.engine.run(mine, call.sampling, call.spec, call.timeout)
                local = (exps, dict(self.engine.timing), None)
            except ValueError as e:  # bad input: not retried
                local = ([], {}, f"ValueError:{e}")
            except Exception as e:  # an engine failure: the explorer may retry the whole batch
                local = ([], {}, f"RuntimeError:rank {rank}: {type(e).__name__}: {e}")
        parts: list[Any] = [None] * world
        dist.all_gather_object(parts, local)
        if rank != 0:
            return None
        failed = next((err for _, _, err in parts if err), None)
        exps = [e for part, _, _ in parts for e in part]
        return exps, rollout_report(sum(1 for part, _, _ in parts if part), [t for _, t, _ in parts]), failed

    def probe(self, call: ProbeCall) -> list[tuple[str, list[int], list[float]]]:
        """Every rank's engine greedy-decodes the probe prompt; all answers on every rank."""
        assert self.engine is not None, "engines started in every rank"
        mine = [(f"rank {dist.get_rank()}", tokens, lp) for _, tokens, lp in self.engine.probe(call.prompt, call.max_tokens)]
        parts: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(parts, mine)
        return [a for part in parts for a in part]

    def close_stage(self) -> None:
        """Release the stage's transports and engine (before the next stage, and at the end)."""
        for transport in self._transports.values():
            transport.close()
        self._transports = {}
        if self.engine is not None:
            self.engine.close()
            self.engine = None


METHODS: dict[type, Callable[[TrainerWorld, Any], Any]] = {
    ConfigureCall: TrainerWorld.configure,
    StartEnginesCall: TrainerWorld.start_engines,
    ForwardBackwardCall: TrainerWorld.forward_backward,
    LogprobsCall: TrainerWorld.compute_logprobs,
    OptimStepCall: TrainerWorld.optim_step,
    TrainStepCall: TrainerWorld.train_step,
    SaveCheckpointCall: TrainerWorld.save_checkpoint,
    LoadCheckpointCall: TrainerWorld.load_checkpoint,
    SyncWeightsCall: TrainerWorld.sync_weights,
    PublishWeightsCall: TrainerWorld.publish_weights,
    ExportWeightsCall: TrainerWorld.export_weights,
    RolloutCall: TrainerWorld.rollout,
    ProbeCall: TrainerWorld.probe,
}
"""The method each command runs (commands.py): one call type per method, dispatched by type."""


def run_command(world: TrainerWorld, call: Command) -> Any:
    return METHODS[type(call)](world, call)


class Commander:
    """Rank 0's side of the command channel: run a TrainerWorld method on every rank."""

    def __init__(self, world: TrainerWorld, group: Any):
        self.world, self.group = world, group
        self.interrupted = False
        """A command raised here: the other ranks may be inside it still (or gone)."""

    def __call__(self, call: Command) -> Any:
        try:  # a send that failed leaves the channel broken too: no shutdown after it
            dist.broadcast_object_list([call], src=0, group=self.group)
            return run_command(self.world, call)
        except BaseException:
            self.interrupted = True
            raise

    def shutdown(self) -> None:
        """Release the other ranks from `follow`."""
        dist.broadcast_object_list([ShutdownCall()], src=0, group=self.group)


def command_group(send_timeout_s: float | None = None) -> Any:
    """The gloo group commands travel on (every rank creates it, right after init_world).

    A timeout is each process's own: the ranks that wait for commands wait IDLE_TIMEOUT, while
    rank 0 may give `send_timeout_s` (cluster.collective_timeout_s) to bound its sends. A command
    larger than the socket buffers (a batch of sequences) is sent only as fast as the others take
    it, so a follower whose link was cut would hold rank 0 in the send for IDLE_TIMEOUT."""
    timeout = IDLE_TIMEOUT if send_timeout_s is None else datetime.timedelta(seconds=send_timeout_s)
    return dist.new_group(backend="gloo", timeout=timeout)


def follow(world: TrainerWorld, group: Any, keep_serving: bool) -> None:
    """Ranks > 0: run what rank 0 broadcasts until it says shutdown. `keep_serving`: a failed
    command is logged and the next awaited (rank 0 fails the same way and answers its client);
    otherwise it ends the rank."""
    while True:
        box: list[Any] = [None]
        dist.broadcast_object_list(box, src=0, group=group)
        call = box[0]
        if isinstance(call, ShutdownCall):
            world.close_stage()
            return
        try:
            run_command(world, call)
        except Exception:
            if not keep_serving:
                raise
            log.exception("%s failed", type(call).__name__)


def _num_parameters(strategy: Any) -> int:
    """From the announced full shapes (sharded strategies hold only slices); a tied LM head is the
    embedding, not a second matrix."""
    tied = bool(getattr(strategy.hf_config(), "tie_word_embeddings", False))
    return sum(
        math.prod(shape)
        for name, _, shape in strategy.weight_specs()
        if not (tied and name == "lm_head.weight")
    )
