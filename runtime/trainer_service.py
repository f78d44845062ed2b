"""TrainerService (proto/rlcore/v1/trainer.proto) on rank 0 of a trainer world: validate each
request completely (a bad request never reaches the other ranks), broadcast the command, run it on
this rank too, answer. `rlcore trainer serve` (trainer_serve.py) starts the world; the Commander runs each command on
every rank (trainer_world.py).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import threading
from typing import Any

import torch.distributed as dist

from ..backends import check_strategy_runs
from ..backends.base import AdamHparams
from ..core.checkpoint import TRAINER_STATE, CheckpointError, resumable_checkpoint, verify_checkpoint
from ..core.config import ConfigError, from_yaml
from ..core.config.plan import StagePlan, filled, plan_stage
from ..core.config.validate import validate_config
from ..core.rpc.address import is_host_port
from ..core.rpc.convert import experience_from_proto
from ..core.rpc.errors import FailedPrecondition, InvalidArgument, Unavailable, require
from ..core.types import Experience
from ..proto.v1 import trainer_pb2, trainer_pb2_grpc
from .commands import (
    Command,
    ConfigureCall,
    ExportWeightsCall,
    ForwardBackwardCall,
    LoadCheckpointCall,
    LogprobsCall,
    OptimStepCall,
    SaveCheckpointCall,
    SyncWeightsCall,
    TrainStepCall,
)
from .trainer_world import Commander
from .training import POLICY_TERMS, SequenceSpec, StageTraining, sequence_spec

POLICY_LOSSES = tuple(POLICY_TERMS)
LOSSES = (*POLICY_LOSSES, "cross_entropy", "dpo", "bradley_terry")
SERVICE_NAME = trainer_pb2.DESCRIPTOR.services_by_name["TrainerService"].full_name


# ---------------------------------------------------------------------------------------------- validation


def _check_ids(ids: list[int], vocab_size: int, field: str) -> None:
    bad = next((x for x in ids if not 0 <= x < vocab_size), None)
    require(bad is None, field, f"token id {bad} is outside the vocabulary [0, {vocab_size})")


def _check_finite(values: list[float], field: str) -> None:
    require(all(math.isfinite(v) for v in values), field, "values must be finite")


def validate_sequence(
    msg: trainer_pb2.TrainSequence, field: str, loss: str, vocab_size: int, max_model_len: int
) -> SequenceSpec:
    """Check one TrainSequence against the model and the loss; expand per-sequence values."""
    prompt, response = list(msg.prompt_token_ids), list(msg.response_token_ids)
    n = len(response)
    require(n > 0, f"{field}.response_token_ids", "must be non-empty")
    require(
        len(prompt) + n <= max_model_len,
        field,
        f"prompt + response is {len(prompt) + n} tokens; model.max_model_len is {max_model_len}",
    )
    _check_ids(prompt, vocab_size, f"{field}.prompt_token_ids")
    _check_ids(response, vocab_size, f"{field}.response_token_ids")
    mask = list(msg.loss_mask) or [1.0] * n
    require(len(mask) == n, f"{field}.loss_mask", f"has {len(mask)} values for {n} response tokens")
    require(all(0.0 <= v <= 1.0 for v in mask), f"{field}.loss_mask", "values must be in [0, 1]")
    advantages, old = list(msg.advantages), list(msg.old_logprobs)
    policy = loss in POLICY_LOSSES
    if advantages or policy:
        require(
            len(advantages) in (1, n),
            f"{field}.advantages",
            f"needs 1 value or {n} (one per response token) for loss {loss}; got {len(advantages)}",
        )
        _check_finite(advantages, f"{field}.advantages")
    if old or policy:
        require(len(old) == n, f"{field}.old_logprobs", f"has {len(old)} values for {n} response tokens")
        _check_finite(old, f"{field}.old_logprobs")
    return sequence_spec(prompt, response, mask, advantages, old if policy else None)


def validate_forward_backward(
    request: trainer_pb2.ForwardBackwardRequest, vocab_size: int, max_model_len: int
) -> ForwardBackwardCall:
    require(request.loss in LOSSES, "loss", f"must be one of {', '.join(LOSSES)}; got '{request.loss}'")
    require(len(request.sequences) > 0, "sequences", "must be non-empty")
    temperature = _temperature(request.temperature)
    norm = request.normalize_tokens
    require(math.isfinite(norm) and norm >= 0, "normalize_tokens", f"must be >= 0; got {norm}")
    seqs = [
        validate_sequence(s, f"sequences[{i}]", request.loss, vocab_size, max_model_len)
        for i, s in enumerate(request.sequences)
    ]
    require(any(sum(s.loss_mask) > 0 for s in seqs), "sequences", "no response token has loss_mask > 0")
    require(
        request.loss not in ("dpo", "bradley_terry") or len(seqs) % 2 == 0, "sequences",
        f"loss {request.loss} takes (chosen, rejected) pairs, pair k at 2k and 2k+1; got an odd count ({len(seqs)})",
    )  # fmt: skip
    clip: list[float | None] = []
    for name in ("clip_ratio_low", "clip_ratio_high"):
        if not request.HasField(name):
            clip.append(None)
            continue
        value = getattr(request, name)
        require(request.loss in POLICY_LOSSES, name, f"applies to the policy losses only, not {request.loss}")
        upper = 1.0 if name == "clip_ratio_low" else math.inf
        require(math.isfinite(value) and 0 <= value < upper, name, f"must be in [0, {upper}); got {value}")
        clip.append(value)
    return ForwardBackwardCall(seqs, request.loss, temperature, norm, (clip[0], clip[1]))


def validate_optim_step(request: trainer_pb2.OptimStepRequest) -> OptimStepCall:
    if not request.HasField("adam"):
        return OptimStepCall()
    a = request.adam
    require(math.isfinite(a.learning_rate) and a.learning_rate >= 0, "adam.learning_rate",
            f"must be >= 0; got {a.learning_rate}")  # fmt: skip
    for name in ("beta1", "beta2"):
        value = getattr(a, name)
        require(0 <= value < 1, f"adam.{name}", f"must be in [0, 1); got {value}")
    require(math.isfinite(a.eps) and a.eps > 0, "adam.eps", f"must be > 0; got {a.eps}")
    require(math.isfinite(a.weight_decay) and a.weight_decay >= 0, "adam.weight_decay",
            f"must be >= 0; got {a.weight_decay}")  # fmt: skip
    require(math.isfinite(a.grad_clip_norm) and a.grad_clip_norm >= 0, "adam.grad_clip_norm",
            f"must be >= 0 (0 clips nothing); got {a.grad_clip_norm}")  # fmt: skip
    return OptimStepCall(AdamHparams(a.learning_rate, (a.beta1, a.beta2), a.eps, a.weight_decay, a.grad_clip_norm))


def validate_compute_logprobs(
    request: trainer_pb2.ComputeLogprobsRequest, vocab_size: int, max_model_len: int, has_reference: bool
) -> LogprobsCall:
    require(len(request.sequences) > 0, "sequences", "must be non-empty")
    temperature = _temperature(request.temperature)
    seqs = []
    for i, s in enumerate(request.sequences):
        require(
            len(s.prompt_token_ids) > 0,
            f"sequences[{i}].prompt_token_ids",
            "must be non-empty: a response token is scored given the tokens before it",
        )
        seqs.append(validate_sequence(s, f"sequences[{i}]", "cross_entropy", vocab_size, max_model_len))
    if request.reference and not has_reference:
        raise FailedPrecondition(
            "reference=true scores with the reference model, which the configured stage does not build: "
            "configure one with a KL term (algorithm.kl_loss_coef > 0, or use_kl_in_reward)"
        )
    return LogprobsCall(seqs, temperature, request.reference)


def _temperature(value: float) -> float:
    temperature = value or 1.0
    require(math.isfinite(temperature) and temperature > 0, "temperature", f"must be > 0; got {temperature}")
    return temperature


def validate_configure(request: trainer_pb2.ConfigureRequest) -> ConfigureCall:
    require(bool(request.config_yaml.strip()), "config_yaml", "must be a non-empty rlcore config")
    require(request.total_steps >= 1, "total_steps", f"must be >= 1; got {request.total_steps}")
    try:
        cfg = from_yaml(request.config_yaml)
        validate_config(cfg, check_paths=False)
        cfg = filled(cfg)
    except ConfigError as e:
        raise InvalidArgument("config_yaml", str(e)) from None
    except Exception as e:  # malformed YAML, keys the schema lacks, wrong types (yaml/OmegaConf errors)
        raise InvalidArgument("config_yaml", " ".join(str(e).split()) or type(e).__name__) from None
    field = "model_path" if request.model_path else "config_yaml"
    model_path = os.path.abspath(request.model_path or cfg.model.model_path)
    require(
        os.path.isfile(os.path.join(model_path, "config.json")),
        field,
        f"'{model_path}' has no config.json (an HF model folder on the trainer's machine is needed)",
    )
    ckpt = request.checkpoint_dir or os.path.join(cfg.checkpoint_root_dir, cfg.project, cfg.name)
    plan = plan_stage(cfg, served=True)
    if request.plan_json:
        plan = agreed_plan(request.plan_json, plan)
    return ConfigureCall(cfg, plan, model_path, os.path.abspath(ckpt), int(request.total_steps))


def agreed_plan(plan_json: str, ours: StagePlan) -> StagePlan:
    """The client's plan of the stage (its index and name), once it agrees with the one this service
    made from the same config; FailedPrecondition names the first decision that differs."""
    try:
        theirs = json.loads(plan_json)
        require(isinstance(theirs, dict), "plan_json", "must be a JSON object (a StagePlan)")
    except json.JSONDecodeError as e:
        raise InvalidArgument("plan_json", f"is not JSON: {e}") from None
    mine = ours.as_dict()
    for key, value in mine.items():
        if key in ("index", "name"):
            continue
        given = json.loads(json.dumps(theirs.get(key)))  # tuples and lists compare alike
        if given != json.loads(json.dumps(value)):
            raise FailedPrecondition(
                f"plan_json.{key}: the client planned {given!r}, this service plans {value!r} from the same "
                "config: client and service disagree on the shape of the run (run the same rlcore version on both)"
            )
    return dataclasses.replace(ours, index=int(theirs.get("index", 0)), name=str(theirs.get("name", ours.name)))


def validate_experiences(
    request: trainer_pb2.TrainStepRequest, vocab_size: int, max_model_len: int
) -> list[Experience]:
    require(len(request.experiences) > 0, "experiences", "must be non-empty")
    exps = []
    for i, msg in enumerate(request.experiences):
        field = f"experiences[{i}]"
        e = experience_from_proto(msg, field)
        total = len(e.prompt_token_ids) + len(e.response_token_ids)
        require(
            total <= max_model_len,
            field,
            f"prompt + response is {total} tokens; model.max_model_len is {max_model_len}",
        )
        _check_ids(e.prompt_token_ids, vocab_size, f"{field}.prompt_token_ids")
        _check_ids(e.response_token_ids, vocab_size, f"{field}.response_token_ids")
        _check_finite(e.logprobs, f"{field}.logprobs")
        exps.append(e)
    return exps


def _check_checkpoint(path: str, world_size: int) -> None:
    require(os.path.isfile(os.path.join(path, TRAINER_STATE)), "path", f"'{path}' is not a checkpoint folder")
    missing = [r for r in range(world_size) if not os.path.isfile(os.path.join(path, f"rng_rank{r}.pt"))]
    require(
        not missing,
        "path",
        f"'{path}' was written by fewer trainer ranks than the {world_size} serving now; restart with as many",
    )


# ---------------------------------------------------------------------------------------------- rank 0


class TrainerServicer(trainer_pb2_grpc.TrainerServiceServicer):
    """TrainerService on rank 0: validate, broadcast the command, run it here, answer."""

    def __init__(self, command: Commander):
        self.command = command
        self.world = command.world
        self._lock = threading.Lock()
        self._closed = False

    def _run(self, call: Command) -> Any:
        """Run `call` on every rank; the caller holds the lock and has validated it."""
        if self._closed:
            raise Unavailable("the trainer is shutting down")
        return self.command(call)

    def _configured(self) -> StageTraining:
        if self.world.training is None:
            raise FailedPrecondition("call Configure first")
        return self.world.training

    def shutdown(self) -> None:
        """Release the other ranks from their command loop (once)."""
        with self._lock:
            if not self._closed:
                self._closed = True
                self.command.shutdown()

    def Configure(self, request, context):
        call = validate_configure(request)
        try:
            check_strategy_runs(call.cfg.trainer.strategy, self.world.device)
        except RuntimeError as e:
            raise FailedPrecondition(str(e)) from None
        with self._lock:
            out = self._run(call)
        return trainer_pb2.ConfigureResponse(**out, plan_json=json.dumps(call.plan.as_dict()))

    def ForwardBackward(self, request, context):
        with self._lock:
            t = self._configured()
            call = validate_forward_backward(request, self.world.vocab_size, t.cfg.model.max_model_len)
            if t.reward_model != (call.loss == "bradley_terry"):
                raise FailedPrecondition(
                    f"loss {call.loss} on a stage that trains a {'reward model' if t.reward_model else 'policy'}: "
                    "bradley_terry trains a reward model (Configure with algorithm.algorithm_type reward_model), "
                    "the other losses a policy"
                )
            if call.loss == "dpo" and not t.needs_ref:
                raise FailedPrecondition(
                    "loss dpo compares the policy with the reference model, which the configured stage does "
                    "not build: Configure with algorithm.algorithm_type dpo"
                )
            out = self._run(call)
        return trainer_pb2.ForwardBackwardResponse(**out)

    def ComputeLogprobs(self, request, context):
        with self._lock:
            t = self._configured()
            call = validate_compute_logprobs(
                request, self.world.vocab_size, t.cfg.model.max_model_len, t.needs_ref
            )
            out = self._run(call)
        return trainer_pb2.ComputeLogprobsResponse(
            sequences=[trainer_pb2.ResponseLogprobs(logprobs=lps) for lps in out]
        )

    def OptimStep(self, request, context):
        call = validate_optim_step(request)
        with self._lock:
            self._configured()
            out = self._run(call)
        return trainer_pb2.OptimStepResponse(**out)

    def TrainStep(self, request, context):
        with self._lock:
            t = self._configured()
            if not t.explores:
                raise FailedPrecondition(
                    "TrainStep runs an RL step; Configure with algorithm.algorithm_type grpo "
                    "(or train SFT with ForwardBackward(loss=cross_entropy) + OptimStep)"
                )
            exps = validate_experiences(request, self.world.vocab_size, t.cfg.model.max_model_len)
            out = self._run(TrainStepCall(exps))
        return trainer_pb2.TrainStepResponse(**out)

    def SaveCheckpoint(self, request, context):
        require(request.explore_step >= 0, "explore_step", f"must be >= 0; got {request.explore_step}")
        with self._lock:
            self._configured()
            out = self._run(SaveCheckpointCall(request.export_hf, int(request.explore_step)))
        return trainer_pb2.SaveCheckpointResponse(**out)

    def LoadCheckpoint(self, request, context):
        with self._lock:
            t = self._configured()
            try:
                path = (
                    os.path.abspath(request.path)
                    if request.path
                    else resumable_checkpoint(t.stage_dir, t.cfg.trainer.resume_fallback)
                )
            except CheckpointError as e:
                raise FailedPrecondition(str(e)) from None
            if path is None:
                return trainer_pb2.LoadCheckpointResponse()
            _check_checkpoint(path, dist.get_world_size())
            if request.weights_only and not t.strategy.can_reset_optimizer:
                raise FailedPrecondition(
                    f"weights_only: strategy {t.cfg.trainer.strategy} cannot restart its optimizer; load with "
                    "the optimizer's state (weights_only false) or train with fsdp or fsdp2"
                )
            try:
                verify_checkpoint(path)
            except CheckpointError as e:
                raise InvalidArgument("path", str(e)) from None
            state = self._run(LoadCheckpointCall(path, request.weights_only))
        return trainer_pb2.LoadCheckpointResponse(
            path=path, global_step=state.global_step, explore_step=state.explore_step
        )

    def GetState(self, request, context):
        t = self.world.training  # read without the lock: a long TrainStep must not block status calls
        if t is None:
            return trainer_pb2.GetStateResponse(configured=False, world_size=dist.get_world_size())
        return trainer_pb2.GetStateResponse(
            configured=True, global_step=t.state.global_step, policy_version=t.state.policy_version,
            strategy=t.cfg.trainer.strategy, world_size=dist.get_world_size(), model_path=self.world.model_path,
        )  # fmt: skip

    def ExportWeights(self, request, context):
        require(bool(request.folder), "folder", "must name the folder to write (on the trainer's file system)")
        with self._lock:
            self._configured()
            out = self._run(ExportWeightsCall(request.folder))
        return trainer_pb2.ExportWeightsResponse(**out)

    def SyncWeights(self, request, context):
        endpoints = list(request.endpoints)
        require(len(endpoints) > 0, "endpoints", "must be non-empty")
        for i, e in enumerate(endpoints):
            require(is_host_port(e), f"endpoints[{i}]", f"must be host:port; got '{e}'")
        require(len(set(endpoints)) == len(endpoints), "endpoints", "lists a worker more than once")
        with self._lock:
            if self._configured().reward_model:
                raise FailedPrecondition(
                    "the configured stage trains a reward model, which no rollout engine holds: sync a policy's stage"
                )
            out = self._run(SyncWeightsCall(endpoints))
        if "failed" in out:
            raise FailedPrecondition(f"the weight sync failed: {out['failed']}")
        return trainer_pb2.SyncWeightsResponse(**out)
