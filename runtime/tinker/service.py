"""The Tinker service behind the HTTP routes (app.py): sessions, the training model, checkpoints,
samplers and futures, over rlcore's trainer world (TrainerService, through TrainerClient) and a
sampling engine (sampler.py).

Several training models (one per create_model, each with its own adapter, optimizer state and
checkpoints) share one trainer world, taking turns (turns.py: the world changes hands between a
model's optim_step and its next forward_backward, saving one model's state and restoring the
other's). A model's training requests run one at a time in the order they arrive (the SDK sends a
model's requests in seq_id order and waits for each to be accepted; client/config turns its
parallel chunk sends off); a request sent again with a seq_id already taken gets the first one's
future.
Sampling runs on its own thread, beside training. Checkpoints are named
`tinker://<model_id>/weights/<name>` (training state: weights and optimizer) and
`tinker://<model_id>/sampler_weights/<name>` (an HF folder of the weights), recorded with the
training runs by records.py, so a restarted server still lists and finds them. Error lines name
the workdir and the base models' folders by placeholders, and listings name no server path.
"""

from __future__ import annotations

import os
import re
import shutil
import threading
import time
import uuid
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from ...client.trainer import TrainerClient
from ...core.config.loader import to_yaml
from .access import CALLER, sees
from .errors import NotFound, UserError
from .losses import loss_sum, plan_loss, required_inputs, trainer_step
from .models import model_config, spec_of, state_mb
from .records import Checkpoint, ModelSpec, Records
from .sampler import DROPPED, Sampler
from .turns import TrainTurns
from .wire import decode_datums, forward_backward_output, loss_config

FINISHED_KEPT = 10_000
"""Results of finished futures kept for the client to fetch (a client may fetch one again)."""
SAMPLE_THREADS = 64
"""Sampling requests served at once (they share engine calls: sampler.py); as many as client/config
lets the SDK send."""
MAX_MODELS = 8
"""Training models a server holds at once by default (`rlcore tinker serve --max-models`)."""
UNNAMED_KEPT = 3
"""Unnamed sampler weights (save_weights_and_get_sampling_client, one per RL step) kept per model by
default (`rlcore tinker serve --keep-samplers`): older folders are deleted, and their samplers answer
that their weights were dropped."""


@dataclass
class Result:
    """A finished future: JSON, protobuf bytes, or an error line with its category."""

    json: dict[str, Any] | None = None
    proto: bytes | None = None
    error: str | None = None
    category: str = "user"


class TinkerService:
    def __init__(
        self, trainer: TrainerClient, base_models: dict[str, str], workdir: str, device: str, dtype: str,
        max_model_len: int, strategy: str, keep_samplers: int = UNNAMED_KEPT, max_models: int = MAX_MODELS,
        max_model_mb: float = 0.0,
    ):  # fmt: skip
        """`max_model_mb` > 0: the most weights and optimizer state one model may train (models.state_mb)."""
        self.trainer, self.base_models, self.workdir = trainer, base_models, os.path.abspath(workdir)
        self.device, self.dtype, self.max_model_len, self.strategy = device, dtype, max_model_len, strategy
        os.makedirs(self.workdir, exist_ok=True)
        self.lock = threading.Lock()
        self.sessions: dict[str, float] = {}
        self.owners: dict[str, str] = {}
        """session or sampler -> the tenant that created it (access.py)."""
        self.models: dict[str, ModelSpec] = {}
        self.seq_requests: OrderedDict[tuple[str, int], str] = OrderedDict()
        self.samplers: dict[str, tuple[str, str]] = {}
        """sampling session -> (base model name, the HF folder its weights are in)."""
        self.futures: OrderedDict[str, Future] = OrderedDict()
        self._futures_lock = threading.Lock()
        self._engine_lock = threading.Lock()
        self.unnamed: dict[str, list[str]] = {}
        """model -> its unnamed sampler folders, oldest first."""
        self.keep_samplers, self.max_model_mb = keep_samplers, max_model_mb
        self.turns = TrainTurns(
            trainer, self._configure, lambda m: self._save_as(m, "turn"), lambda why: Result(error=why), max_models
        )
        self.sample_queue = ThreadPoolExecutor(SAMPLE_THREADS, thread_name_prefix="tinker-sample")
        self.records = Records(self.workdir)
        self._sampler: Sampler | None = None

    # ------------------------------------------------------------------ sessions and models

    def create_session(self) -> str:
        session = f"s{uuid.uuid4().hex[:12]}"
        with self.lock:
            self.sessions[session] = time.time()
            self.owners[session] = CALLER.get()
        return session

    def heartbeat(self, session: str) -> None:
        with self.lock:
            if session not in self.sessions or not sees(self.owners.get(session, "")):
                raise NotFound(f"session_id: no session {session} on this server")
            self.sessions[session] = time.time()

    def finish_session(self, session: str) -> None:
        """The session ends, and its training models with it (their turns and saved states; their
        checkpoints stay)."""
        with self.lock:
            if not sees(self.owners.get(session, "")):
                raise NotFound(f"session_id: no session {session} on this server")
            self.sessions.pop(session, None)
            gone = [m for m in self.models if m.startswith(f"{session}:train:")]
            for model_id in gone:
                del self.models[model_id]
        for model_id in gone:
            self.turns.drop(model_id)
            shutil.rmtree(os.path.join(self._model_dir(model_id), "turn"), ignore_errors=True)

    def base_path(self, name: str, field_name: str = "base_model") -> str:
        path = self.base_models.get(name)
        if path is None:
            raise UserError(f"{field_name}: {name} is not served here; served: {', '.join(self.base_models)}")
        return path

    def model(self, model_id: str) -> ModelSpec:
        with self.lock:
            spec = self.models.get(model_id)
        if spec is None or not sees(self.records.owner(model_id)):
            raise NotFound(f"model_id: no model {model_id} on this server")
        self.records.touched(model_id)
        return spec

    def spec_of(self, base_model: str, lora: Any) -> ModelSpec:
        return spec_of(base_model, lora, self.base_path(base_model))

    def create_model(self, model_id: str, spec: ModelSpec) -> str:
        """Queue the model's construction (its first turn); the future's request id."""
        self._admit(model_id, spec)

        def run() -> dict[str, Any]:
            try:
                self.turns.hold(model_id, spec, fresh=True)
            except Exception:
                self._unadmit(model_id)
                raise
            return {"model_id": model_id}

        return self._train(model_id, None, run, creates=True)

    def _admit(self, model_id: str, spec: ModelSpec) -> None:
        if self.max_model_mb and (mb := state_mb(spec, self.base_path(spec.base_model))) > self.max_model_mb:
            what = f"a rank-{spec.lora_rank} adapter" if spec.lora_rank else "full fine-tuning"
            raise UserError(
                f"create_model: {what} of {spec.base_model} trains {mb:.1f} MB of weights and optimizer state; "
                f"this server allows {self.max_model_mb:g} MB per model (rlcore tinker serve --max-model-mb): "
                "ask for a lower rank"
            )
        with self.lock:
            self.turns.admit(model_id, self.models)
            self.models[model_id] = spec
        self.records.started(model_id, spec, CALLER.get())

    def _unadmit(self, model_id: str) -> None:
        """A model whose creation failed frees its place (--max-models)."""
        with self.lock:
            self.models.pop(model_id, None)

    def _configure(self, model_id: str, spec: ModelSpec) -> None:
        """Build `model_id` on the trainer world (turns.py calls it when the model's turn comes)."""
        cfg = model_config(model_id, spec, self.base_path(spec.base_model), self.max_model_len, self.dtype,
                           self.strategy, self.device)  # fmt: skip
        self.trainer.configure(to_yaml(cfg), checkpoint_dir=self._model_dir(model_id), total_steps=1_000_000)

    def _model_dir(self, model_id: str) -> str:
        return os.path.join(self.workdir, "models", _safe(model_id))

    def _save_as(self, model_id: str, name: str) -> str:
        """The holder's state as the folder `name` of its model's folder (replaced if there): `turn`
        (its state between turns, turns.py) or `named/<name>` (a checkpoint its client names), so that
        neither ever shares the trainer's step folder with the other."""
        folder, _ = self.trainer.save_checkpoint()
        dest = os.path.join(self._model_dir(model_id), name)
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        shutil.rmtree(dest, ignore_errors=True)
        os.replace(folder, dest)
        return dest

    def info(self, model_id: str) -> dict[str, Any]:
        spec = self.model(model_id)
        path = self.base_path(spec.base_model)
        return {
            "model_id": model_id,
            "model_data": {"arch": None, "model_name": spec.base_model, "tokenizer_id": path},
            "is_lora": spec.lora_rank > 0, "lora_rank": spec.lora_rank or None, "model_name": spec.base_model,
            "type": "get_info",
        }  # fmt: skip

    # ------------------------------------------------------------------ training requests

    def forward_backward(self, request: Any) -> str:
        model_id = request.model_id
        self.model(model_id)
        datums = decode_datums(request, required_inputs(request.loss_fn))
        plan = plan_loss(request.loss_fn, loss_config(request), datums)
        limit = self.max_model_len
        for d, datum in enumerate(datums):
            if len(datum.tokens) > limit:
                raise UserError(f"data[{d}]: {len(datum.tokens) - 1} input tokens and a target exceed the served "
                                f"context of {limit} tokens")  # fmt: skip

        def run() -> Result:
            # the learner's log-probs of the targets, before the update (the same weights)
            logprobs = self.trainer.compute_logprobs(plan.sequences)
            value = loss_sum(plan, logprobs)  # the loss's formula on the log-probs the response returns
            step = None if request.forward_only else trainer_step(plan, logprobs)
            if step is not None:
                out = self.trainer.forward_backward(
                    step.sequences, step.loss, normalize_tokens=1.0, clip_ratio_low=step.clip_ratio_low,
                    clip_ratio_high=step.clip_ratio_high,
                )  # fmt: skip
                self.turns.trained()
                if step is plan:  # a surrogate (gspo's) has the loss's gradient, not its value
                    value = out.loss
            tokens = float(sum(len(s.response_token_ids) for s in plan.sequences))
            return Result(proto=forward_backward_output(logprobs, {"loss:sum": value, "num_tokens:sum": tokens}))

        return self._train(model_id, request.seq_id, run)

    def optim_step(self, model_id: str, seq_id: int | None, params: Any) -> str:
        self.model(model_id)
        if getattr(params, "type", "adam") not in ("adam", "adamw"):
            raise UserError(f"optim_params: {params.type} is not served (AdamW only)")
        adam = {"learning_rate": params.learning_rate, "beta1": params.beta1, "beta2": params.beta2,
                "eps": params.eps, "weight_decay": params.weight_decay, "grad_clip_norm": params.grad_clip_norm}  # fmt: skip

        def run() -> dict[str, Any]:
            self.turns.stepping(model_id)
            out = self.trainer.optim_step(adam=adam)
            return {"metrics": {"grad_norm:mean": out.grad_norm, "lr:mean": out.lr, "step:max": float(out.global_step)}}

        return self._train(model_id, seq_id, run)

    def save_weights(self, model_id: str, seq_id: int | None, name: str, overwrite: bool = False) -> str:
        spec = self.model(model_id)
        path = self._path(model_id, "weights", name, overwrite)

        def run() -> dict[str, Any]:
            folder = self._save_as(model_id, os.path.join("named", name))
            self._record(Checkpoint(path, "weights", folder, model_id, spec))
            return {"path": path, "type": "save_weights"}

        return self._train(model_id, seq_id, run)

    def save_for_sampler(self, model_id: str, seq_id: int | None, name: str | None, session_seq: int | None,
                         session: str | None) -> str:  # fmt: skip
        spec = self.model(model_id)
        if name is None and session_seq is None:
            raise UserError("path: name the sampler weights (or give sampling_session_seq_id)")
        label = name if name is not None else f"sampler-{uuid.uuid4().hex[:8]}"
        path = self._path(model_id, "sampler_weights", label)
        owner = CALLER.get()  # the training thread acts for it

        def run() -> dict[str, Any]:
            folder = os.path.join(self.workdir, "sampler_weights", _safe(model_id), label)
            self.trainer.export_weights(folder)
            self._record(Checkpoint(path, "sampler_weights", folder, model_id, spec))
            out: dict[str, Any] = {"path": path, "type": "save_weights_for_sampler"}
            if name is None:  # save_weights_and_get_sampling_client: a sampler of these weights at once
                sampler = f"{session or model_id.split(':')[0]}:sample:{session_seq}"
                with self.lock:
                    self.samplers[sampler] = (spec.base_model, folder)
                    self.owners[sampler] = owner
                    kept = self.unnamed.setdefault(model_id, [])
                    kept.append(folder)
                    dropped = kept[: -self.keep_samplers]
                    del kept[: -self.keep_samplers]
                for old in dropped:
                    self._drop(old)
                out["sampling_session_id"] = sampler
            return out

        return self._train(model_id, seq_id, run)

    def load_weights(self, model_id: str, seq_id: int | None, path: str, optimizer: bool, create: bool) -> str:
        """Restore a training checkpoint into `model_id`: a new model built from it (`create`, the
        SDK's create_training_client_from_state) or an existing one."""
        ckpt = self.checkpoint(path, "weights")
        if create:
            self._admit(model_id, ckpt.spec)
        else:
            self.model(model_id)

        def run() -> dict[str, Any]:
            try:
                if create:
                    self.turns.hold(model_id, ckpt.spec, fresh=True)
                self.trainer.load_checkpoint(ckpt.folder, weights_only=not optimizer)
            except Exception:
                if create:
                    self._unadmit(model_id)
                raise
            return {"path": path, "model_id": model_id, "type": "load_weights"}

        return self._train(model_id, seq_id, run, creates=create)

    def _train(self, model_id: str, seq_id: int | None, fn: Any, creates: bool = False) -> str:
        """Queue `fn` in the model's turn (turns.py); a (model, seq_id) already queued gets its first
        future. Unless it `creates` the model, the model takes the trainer world first."""

        def in_turn() -> Any:
            if not creates:
                self.turns.hold(model_id, self.model(model_id))
            return fn()

        with self.lock:
            if seq_id is not None and (model_id, seq_id) in self.seq_requests:
                return self.seq_requests[(model_id, seq_id)]
            request_id = self._submit(in_turn, model_id)
            if seq_id is not None:
                self.seq_requests[(model_id, seq_id)] = request_id
                while len(self.seq_requests) > FINISHED_KEPT:
                    self.seq_requests.popitem(last=False)
        return request_id

    # ------------------------------------------------------------------ checkpoints

    def _path(self, model_id: str, kind: str, name: str, overwrite: bool = False) -> str:
        if not name or "/" in name or not re.fullmatch(r"[\w.:+=@-]+", name):
            raise UserError(f"path: '{name}' is not a checkpoint name (letters, digits and . _ - : + = @; no /)")
        path = f"tinker://{model_id}/{kind}/{name}"
        if self.records.taken(path) and not overwrite:
            raise UserError(f"path: {path} exists; save under another name" +
                            (" (or with overwrite)" if kind == "weights" else ""))  # fmt: skip
        return path

    def checkpoint(self, path: str, kind: str | None = None) -> Checkpoint:
        ckpt = self.records.checkpoint(path, kind)
        if not sees(self.records.owner(ckpt.model_id)):
            raise NotFound(f"path: no checkpoint {path} on this server")
        return ckpt

    def _record(self, ckpt: Checkpoint) -> None:
        self.records.record(ckpt)

    def delete_checkpoint(self, model_id: str, checkpoint_id: str) -> None:
        """The RestClient's delete_checkpoint: the record, and its folder unless another checkpoint's
        record names it too (two saves of one step share a training folder); a sampler of it then
        says its weights were dropped; the live model keeps training."""
        ckpt = self.checkpoint(self.records.find(model_id, checkpoint_id).tinker_path)
        with self.lock:
            for kept in self.unnamed.values():
                if ckpt.folder in kept:
                    kept.remove(ckpt.folder)
        if self.records.forget(ckpt.tinker_path):
            self._drop(ckpt.folder)

    def _drop(self, folder: str) -> None:
        """Delete a checkpoint folder and its record (a sampler still naming it says so)."""
        self.records.forget_folder(folder)
        sampler = self._sampler
        if sampler is not None:
            with sampler.lock:  # not while the engine loads it
                shutil.rmtree(folder, ignore_errors=True)
        else:
            shutil.rmtree(folder, ignore_errors=True)

    # ------------------------------------------------------------------ sampling

    def create_sampler(self, session: str, seq: int, model_path: str | None, base_model: str | None) -> str:
        if model_path is not None:
            ckpt = self.checkpoint(model_path)
            if ckpt.kind != "sampler_weights":
                raise UserError(f"model_path: {model_path} is a training checkpoint; sample from "
                                "save_weights_for_sampler's path")  # fmt: skip
            target = (ckpt.spec.base_model, ckpt.folder)
        elif base_model is not None:
            target = (base_model, self.base_path(base_model))
        else:
            raise UserError("model_path or base_model: one is needed")
        sampler = f"{session}:sample:{seq}"
        with self.lock:
            self.samplers[sampler] = target
            self.owners[sampler] = CALLER.get()
        return sampler

    def sampler(self, sampler_id: str) -> tuple[str, str]:
        with self.lock:
            target = self.samplers.get(sampler_id)
            owner = self.owners.get(sampler_id, "")
        if target is None or not sees(owner):
            raise NotFound(f"sampling_session_id: no sampler {sampler_id} on this server")
        return target

    def sample(self, request: Any) -> str:
        if request.sampling_session_id is None:
            raise UserError("sampling_session_id: required (create a sampling client first)")
        base_model, folder = self.sampler(request.sampling_session_id)
        if not os.path.isdir(folder):
            raise UserError(DROPPED)
        prompt: list[int] = []
        for c, chunk in enumerate(request.prompt.chunks):
            if getattr(chunk, "type", None) != "encoded_text":
                raise UserError(f"prompt.chunks[{c}]: {chunk.type} chunks are not served (text tokens only)")
            prompt.extend(chunk.tokens)
        for name in ("topk_sample_logprobs", "prompt_alt_tokens_k"):
            if getattr(request, name):
                raise UserError(f"{name}: not served (0 only)")
        if request.topk_prompt_logprobs < 0:
            raise UserError(f"topk_prompt_logprobs: must be >= 0; got {request.topk_prompt_logprobs}")
        if request.target_prompt_logprobs is not None or request.prompt_logprobs_last_n is not None:
            raise UserError("target_prompt_logprobs / prompt_logprobs_last_n: not served")
        engine = self._engine(base_model)

        def run() -> Result:
            return Result(
                proto=engine.sample(folder, prompt, request.sampling_params, request.num_samples,
                                    bool(request.prompt_logprobs), request.topk_prompt_logprobs)  # fmt: skip
            )

        return self._submit(run)

    def _engine(self, base_model: str) -> Sampler:
        path = self.base_path(base_model)
        with self._engine_lock:  # not self.lock: building it takes seconds, and routes read state meanwhile
            if self._sampler is None or self._sampler.base_path != path:
                self._sampler = None  # the previous one's memory goes before the next one loads
                self._sampler = Sampler(path, self.device, self.dtype, self.max_model_len)
            return self._sampler

    # ------------------------------------------------------------------ futures

    def _submit(self, fn: Any, model_id: str | None = None) -> str:
        """Queue `fn`: in `model_id`'s training turn, or (None) on the sampling threads."""
        request_id = uuid.uuid4().hex
        if model_id is None:
            future = self.sample_queue.submit(self._answer, fn)
        else:
            future = self.turns.submit(model_id, lambda: self._answer(fn))
        with self._futures_lock:
            self.futures[request_id] = future
            while len(self.futures) > FINISHED_KEPT and next(iter(self.futures.values())).done():
                self.futures.popitem(last=False)  # the oldest finished results go first
        return request_id

    def _answer(self, fn: Any) -> Result:
        """_as_result of `fn`, its error line without the server's paths (its workdir and the base
        models' folders, which a client names by their served names)."""
        result = _as_result(fn)
        if result.error is not None:
            result.error = self.public(result.error)
        return result

    def public(self, message: str) -> str:
        for name, path in sorted(self.base_models.items(), key=lambda kv: -len(kv[1])):
            message = message.replace(os.path.abspath(path), f"<{name}>").replace(path, f"<{name}>")
        return message.replace(self.workdir, "<workdir>")

    def future(self, request_id: str) -> Future:
        with self._futures_lock:
            fut = self.futures.get(request_id)
        if fut is None:
            raise NotFound(f"request_id: no request {request_id} on this server (or its result was dropped)")
        return fut

    def close(self) -> None:
        self.turns.close()
        self.sample_queue.shutdown(wait=False, cancel_futures=True)


def _as_result(fn: Any) -> Result:
    """Run a queued request: its JSON or protobuf answer, or the error that ended it in one line."""
    from ...client.base import RpcError

    try:
        out = fn()
    except (UserError, NotFound) as e:
        return Result(error=str(e))
    except RpcError as e:  # the trainer refused it (bad input) or failed
        user = getattr(e, "code", None) is not None and e.code.name in ("INVALID_ARGUMENT", "FAILED_PRECONDITION")
        return Result(error=f"trainer: {e}", category="user" if user else "server")
    except Exception as e:
        return Result(error=f"{type(e).__name__}: {e}", category="server")
    return out if isinstance(out, Result) else Result(json=out)


def _safe(name: str) -> str:
    return re.sub(r"[^\w.-]", "_", name)
