"""The training side of a trainer world that serves TrainerService: what every rank runs.

Rank 0's servicer (trainer_service.py) and the other ranks' command loop (trainer_serve.py) call
the same TrainerWorld methods with the same validated arguments in the same order, so the
strategy's collectives line up. `init_world` is how every trainer rank joins its torchrun world,
here and under `rlcore launch` (worker.py), and `exit_world` how it leaves.
"""

from __future__ import annotations

import atexit
import ctypes
import dataclasses
import gc
import math
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn

import torch
import torch.distributed as dist

from .checkpoint import TrainerState, load_checkpoint, save_checkpoint
from .config import RLCoreConfig, Stage
from .types import Experience

if TYPE_CHECKING:
    from .trainer import StageTrainer


def world_backend(device: str) -> str:
    """The trainer world's default-group backend. On CUDA it runs NCCL for CUDA tensors and gloo for
    CPU ones: the loop all-reduces small CPU tensors (micro-batch counts, log-prob gap metrics),
    which an NCCL-only group refuses ("No backend type associated with device type cpu")."""
    return "cpu:gloo,cuda:nccl" if device == "cuda" else "gloo"


def init_world(device: str) -> None:
    """Join the torchrun world this process was started in (on CUDA, on its LOCAL_RANK's GPU)."""
    if device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group(backend=world_backend(device))


def exit_world(code: int) -> NoReturn:
    """End a rank whose work is done and written: destroy its process groups, run the atexit
    handlers (multiprocessing reaps its children there, e.g. the manager process megatron-core's
    checkpoint writer spawns), flush Python's and C's output buffers, and exit with `code` without the
    interpreter's finalization.

    Why not a plain return: destroy_process_group does not free a gloo group that anything still
    references (importing torch._dynamo, as transformers and FSDP do, takes ten references to the
    default group; building an FSDP strategy leaves one or two more after it is freed), so the
    group's worker threads live on into finalization. The last of them to run a collective releases
    its tensors a moment after the collective returns; when that release needs the GIL after
    finalization has begun, Python 3.11 ends the thread mid-C++ and the process aborts ("terminate
    called without an active exception", SIGABRT) with every result already on disk. Seen in 5 of
    270 two-rank float16 FSDP parity runs on two busy cores, and once in CI."""
    if dist.is_initialized():  # worker.py and trainer_serve.py have destroyed theirs already
        dist.destroy_process_group()
    atexit._run_exitfuncs()  # what a normal exit runs before finalization (logging's shutdown too)
    sys.stdout.flush()
    sys.stderr.flush()
    ctypes.CDLL(None).fflush(None)  # C and C++ libraries' stdio buffers (os._exit skips exit())
    os._exit(code)


# ---------------------------------------------------------------------------------------------- calls
# What rank 0 broadcasts: validated, plain Python (pickled by broadcast_object_list).


@dataclass
class ConfigureCall:
    cfg: RLCoreConfig
    model_path: str
    checkpoint_dir: str
    total_steps: int


@dataclass
class SequenceSpec:
    """One validated TrainSequence; per-token lists have the response's length."""

    prompt: list[int]
    response: list[int]
    loss_mask: list[float]
    advantages: list[float]
    old_logprobs: list[float] | None


@dataclass
class ForwardBackwardCall:
    sequences: list[SequenceSpec]
    loss: str
    temperature: float
    normalize_tokens: float


@dataclass
class LogprobsCall:
    sequences: list[SequenceSpec]
    temperature: float
    reference: bool


class TrainerWorld:
    """The training side as every rank holds it; rank 0's servicer and the other ranks' command
    loop call the same methods with the same arguments in the same order."""

    def __init__(self, device: str, make_sender: Callable[[list[str], RLCoreConfig], Any] | None = None):
        self.device = device
        self.trainer: StageTrainer | None = None
        self.model_path = ""
        self.vocab_size = 0
        self._make_sender = make_sender  # rank 0 only: WeightSender for a list of endpoints
        self._senders: dict[tuple[str, ...], Any] = {}

    def _t(self) -> StageTrainer:
        assert self.trainer is not None, "rank 0 checks Configure before broadcasting"
        return self.trainer

    def configure(self, call: ConfigureCall) -> dict[str, Any]:
        from .trainer import StageTrainer

        self.trainer = None  # free the previous model and optimizer before building the next
        gc.collect()
        if self.device == "cuda":
            torch.cuda.empty_cache()
        self.trainer = StageTrainer(
            Stage(0, "remote", call.cfg), call.checkpoint_dir, call.model_path, self.device,
            export_final_hf=False, with_explorer=False, total_train_steps=call.total_steps,
        )  # fmt: skip
        self.model_path = call.model_path
        self.vocab_size = int(self.trainer.strategy.hf_config().vocab_size)
        return {
            "strategy": call.cfg.trainer.strategy,
            "world_size": dist.get_world_size(),
            "num_parameters": _num_parameters(self.trainer.strategy),
        }

    def forward_backward(self, call: ForwardBackwardCall) -> dict[str, Any]:
        from .algorithms import LossNorm, build_loss
        from .batch import Sequence

        t = self._t()
        seqs = [Sequence(s.prompt, s.response, s.old_logprobs, index=i) for i, s in enumerate(call.sequences)]
        mbs, rows = t._micro(seqs)
        for mb, idx in zip(mbs, rows, strict=True):
            for r, i in enumerate(idx):  # the batch's right-padded layout: response at [p, p + n)
                s = call.sequences[i]
                p, n = len(s.prompt), len(s.response)
                mask = torch.tensor(s.loss_mask, dtype=torch.float32)
                mb["loss_mask"][r, p : p + n] = mask
                mb["advantages"][r, p : p + n] = mask * torch.tensor(s.advantages, dtype=torch.float32)
        algo = t.cfg.algorithm
        if call.loss == "cross_entropy":
            algo = dataclasses.replace(algo, algorithm_type="sft")
        else:  # the KL term needs the reference model, which only an RL config builds
            algo = dataclasses.replace(
                algo, algorithm_type="grpo", kl_loss_fn=algo.kl_loss_fn if t.needs_ref else "none"
            )
        num_tokens = sum(sum(s.loss_mask) for s in call.sequences)
        norm = LossNorm(
            num_tokens=call.normalize_tokens or num_tokens,
            num_seqs=float(sum(1 for s in call.sequences if sum(s.loss_mask) > 0)),
            max_response_len=t.max_response_len,
        )
        loss_fn = build_loss(algo, norm)
        if loss_fn.needs_reference:
            ref = t.strategy.compute_logprobs(mbs, call.temperature, reference=True)
            for mb, lp in zip(mbs, ref, strict=True):
                mb["ref_logprobs"] = lp
        metrics = t.strategy.forward_backward(mbs, loss_fn, call.temperature)
        loss = metrics["sft/loss"] if call.loss == "cross_entropy" else metrics["actor/loss"]
        return {"loss": loss, "metrics": metrics, "num_tokens": int(round(num_tokens))}

    def compute_logprobs(self, call: LogprobsCall) -> list[list[float]]:
        """Each rank scores its data-parallel share; every rank returns all sequences' response
        log-probs, in request order."""
        from .batch import Sequence

        t = self._t()
        seqs = [Sequence(s.prompt, s.response, None, index=i) for i, s in enumerate(call.sequences)]
        mbs, rows = t._micro(seqs)
        mine: dict[int, list[float]] = {}
        for lp, idx in zip(
            t.strategy.compute_logprobs(mbs, call.temperature, call.reference), rows, strict=True
        ):
            for r, i in enumerate(idx):  # the response sits at columns [p, p + n) of its row
                p, n = len(call.sequences[i].prompt), len(call.sequences[i].response)
                mine[i] = lp[r, p : p + n].float().tolist()
        parts: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(parts, mine)  # ranks of one model replica hold the same share
        merged = {i: lps for part in parts for i, lps in part.items()}
        return [merged[i] for i in range(len(call.sequences))]

    def optim_step(self, _: None) -> dict[str, Any]:
        t = self._t()
        lr = t.strategy.current_lr()  # the scheduler moves on inside optimizer_step
        grad_norm = t.strategy.optimizer_step()
        t.state.global_step += 1
        return {"grad_norm": grad_norm, "lr": lr, "global_step": t.state.global_step}

    def train_step(self, exps: list[Experience]) -> dict[str, Any]:
        t = self._t()
        metrics = t.train_experiences(exps)
        return {"metrics": metrics, "global_step": t.state.global_step}

    def save_checkpoint(self, call: tuple[bool, int]) -> dict[str, str]:
        from .hf_export import export_hf

        t = self._t()
        with_hf, explore_step = call
        t.state.explore_step = explore_step
        t.state.kl_ctrl = t.kl_ctrl.state_dict()
        export = None
        if with_hf:

            def export(path: str) -> None:
                weights = t.strategy.iter_full_weights()
                export_hf(weights, path, t.strategy.hf_config(), t.model_path, write=dist.get_rank() == 0)

        path = save_checkpoint(
            t.stage_dir, t.strategy, t.state, t.cfg.trainer.max_checkpoints_to_keep, export
        )
        return {"path": path, "hf_path": os.path.join(path, "hf") if with_hf else ""}

    def load_checkpoint(self, path: str) -> TrainerState:
        t = self._t()
        t.state = load_checkpoint(path, t.strategy)
        t.kl_ctrl.load_state_dict(t.state.kl_ctrl)
        return t.state

    def sync_weights(self, endpoints: list[str]) -> dict[str, Any]:
        """Rank 0 sends over a weight-sync group with the workers, or with synchronizer.sync_method
        checkpoint has them load an HF folder every rank helped write; the other ranks only take
        part in the strategy's gathers. Workers accept only increasing versions, so the version
        announced is the global step, or one past what they serve when that is not newer (a step-0
        sync, a resync)."""
        from .weight_sync import spec_of

        t = self._t()
        start = time.perf_counter()
        by_checkpoint = t.synchronizer.method == "checkpoint"
        folder = t.synchronizer.export_for_workers(t.state.global_step) if by_checkpoint else ""
        weights = iter(()) if by_checkpoint else t.strategy.iter_full_weights()
        if self._make_sender is None:  # ranks > 0; rank 0 keeps the version (it writes trainer state)
            for _ in weights:  # collective: every rank walks the iterator
                pass
            return {}
        key = tuple(endpoints)
        try:
            if key not in self._senders:
                self._senders[key] = self._make_sender(endpoints, t.cfg)
            sender = self._senders[key]
            served = max(c.get_info().policy_version for c in sender.clients)
            version = max(t.state.global_step, served + 1)
            if by_checkpoint:
                sender.send_checkpoint(folder, version)
                t.synchronizer.prune_exports(keep=folder)
                num_bytes = sum(
                    e.stat().st_size for e in os.scandir(folder) if e.name.endswith(".safetensors")
                )
            else:
                specs = [spec_of(*s) for s in t.strategy.weight_specs()]
                num_bytes = int(sender.send(specs, weights, version)["num_bytes"])
        except Exception:
            sender = self._senders.pop(key, None)
            if sender is not None:  # its group may be broken; the next call forms a new one
                sender.close()
            raise
        finally:
            for _ in weights:  # collective: the other ranks walk it to the end whatever happened here
                pass
        t.state.policy_version = version
        return {"policy_version": version, "num_bytes": num_bytes, "seconds": time.perf_counter() - start}


def _num_parameters(strategy: Any) -> int:
    """From the announced full shapes (sharded strategies hold only slices); a tied LM head is the
    embedding, not a second matrix."""
    tied = bool(getattr(strategy.hf_config(), "tie_word_embeddings", False))
    return sum(
        math.prod(shape)
        for name, _, shape in strategy.weight_specs()
        if not (tied and name == "lm_head.weight")
    )
