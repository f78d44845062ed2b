"""trainer.remote tinker://...: rlcore's loop trains through a Tinker service (the official `tinker`
SDK), as a TrainerHandle (handles.py) the loop drives like its own trainers.

    step        the algorithm's rewards and advantages here (rlcore's scoring and advantage
                functions), then per mini-batch one forward_backward with the Tinker loss of
                algorithm.policy_loss_fn (ppo, importance_sampling, cispo, gspo) and one optim_step
                with the lr the configured schedule gives; both submitted without waiting, in order
    loss        Tinker sums its losses over tokens; rlcore aggregates (algorithm.loss_agg_mode over
                the mini-batch): each token's advantage (cross_entropy: its weight) carries its
                aggregation weight (core/algorithms/aggregation.token_weights), so the sum is rlcore's
    old lps     recomputed by a forward of the step's sequences before any update when the plan says
                so (do_old_log_prob_compute), else the sampler's
    weights     save_weights_for_sampler; the rollout workers' tinker engines load the path it
                returns, by the checkpoint transport's requests
    checkpoint  save_state, listed in <stage>/tinker_checkpoints.json; a resume loads the newest
                with its optimizer; a later stage starts from the last one (weights only)

A Tinker service keeps the weights: no HF folder comes back (`tinker checkpoint download` fetches
one from Tinker itself).

The SDK retries a lost connection for ever (its futures poll with backoff up to 30 s; its
RetryConfig gives up after progress_timeout, 2 hours): the launch watches the service instead, by
its health endpoint (`answers`, runtime/service_watch.py), and ends the run when it stops answering.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from typing import Any

import torch

from ...backends.common.schedule import lr_lambda
from ...client.base import ClientOptions
from ...client.trainer import ForwardBackwardResult, OptimStepResult, TrainSequence
from ...core.algorithms import with_preset
from ...core.algorithms.aggregation import LossNorm, token_weights
from ...core.config import RLCoreConfig
from ...core.config.host_checks import tinker_url
from ...core.config.plan import StagePlan
from ...core.config.shape_checks import TINKER_LOSSES, pass_refusal
from ...core.step_metrics import rollout_metrics
from ...core.types import Experience, episode_starts
from ...weights.base import announce
from ...weights.sender import WeightSender, connect
from .. import scoring
from ..handles import RemoteHandle, Restored, Synced
from ..step_sizes import max_response_len, mini_batches, plan_steps

log = logging.getLogger("rlcore.loop")

CLOSE_TIMEOUT_S = 10.0
"""The longest the end of a run waits for the service to close its session."""
RECORD = "tinker_checkpoints.json"
"""The stage's Tinker checkpoints, oldest first: [{path, global_step, explore_step}]."""


class TinkerTrainer(RemoteHandle):
    runs_passes = frozenset({"old_logprobs"})  # a forward with the service's current weights

    def __init__(self, remote: str, api_key_env: str):
        import tinker

        url = tinker_url(remote)
        assert url is not None, "plan.trainer tinker: trainer.remote names a Tinker service"
        api_key = os.environ.get(api_key_env, "")
        if not api_key:
            raise ValueError(f"trainer.tinker.api_key_env: ${api_key_env} is empty; set the service's API key there")
        self.url, self.types = url, tinker.types
        self.peer = f"the Tinker service at {url}"
        self.service = tinker.ServiceClient(base_url=url, api_key=api_key)
        self._training: Any = None
        self._create: Any = None
        """Creates the stage's training client on first use (a resume creates it from its checkpoint
        instead: no model is made on the service only to be replaced)."""
        self._sender: WeightSender | None = None
        self._syncs = 0

    def answers(self, timeout_s: float) -> bool:
        """Whether the service answers its health endpoint (any answer, an error too) in `timeout_s`."""
        import httpx

        try:
            httpx.get(self.url.rstrip("/") + "/api/v1/healthz", timeout=timeout_s)
        except httpx.HTTPError:
            return False
        return True

    def close(self, ok: bool, answering: bool) -> None:
        """Finish the session with the service: successful or errored (`ok`); not waited for when
        the service stopped answering. A service that fails to close it is logged, not raised over
        the run's own outcome."""
        if self._sender is not None:
            self._sender.close()
        closing = self.service.close("success" if ok else "errored")
        if not answering:
            return
        try:
            closing.result(timeout=CLOSE_TIMEOUT_S)
        except Exception as e:
            log.warning("closing the session with %s: %s", self.peer, e)

    @property
    def training(self) -> Any:
        """The stage's TrainingClient."""
        if self._training is None:
            self._training = self._create().result()
        return self._training

    # ------------------------------------------------------------------ the stage

    def configure(self, cfg: RLCoreConfig, plan: StagePlan, model_path: str, stage_dir: str, total_steps: int) -> None:
        refused = [name for name in plan.passes.names() if name not in self.runs_passes]
        if refused:  # the config check refuses these first (shape_checks._check_trainer_passes)
            raise ValueError(pass_refusal(self.peer, refused[0], cfg.algorithm.algorithm_type))
        self.cfg, self.plan, self.stage_dir = cfg, plan, stage_dir
        self.algo = with_preset(cfg.algorithm)
        self.max_response_len = max_response_len(cfg)
        self.step = scoring.AlgorithmStep(self.algo, self.max_response_len)
        self.train_batch = plan_steps(cfg, cfg.buffer.batch_size)[0]
        self.lr = lr_lambda(self.algo.optimizer, total_steps)
        self.global_step = 0
        if self._sender is not None:  # each stage links to its workers afresh
            self._sender.close()
            self._sender = None
        self._training = None
        if model_path.startswith("tinker://"):  # the previous stage's last checkpoint, weights only
            self._create = lambda: self.service.create_training_client_from_state(model_path)
            return
        lora = cfg.model.lora_configs  # none: rank 0, full fine-tuning (rlcore's server; Tinker trains LoRA)
        self._create = lambda: self.service.create_lora_training_client(
            base_model=cfg.trainer.tinker.base_model or cfg.model.model_path, rank=lora[0].lora_rank if lora else 0,
            seed=cfg.seed, train_mlp=True, train_attn=True, train_unembed=False,
        )  # fmt: skip

    # ------------------------------------------------------------------ training

    def train_step(self, experiences: list[Experience]) -> tuple[dict[str, float], int]:
        """The algorithm's step: advantages here, one forward_backward + optim_step per mini-batch."""
        start = time.perf_counter()
        algo, exps = self.algo, experiences
        metrics: dict[str, float] = {}
        hot = next((e.temperature for e in exps if e.temperature not in (None, 1.0)), None)
        if hot is not None:  # an agent's episode through the door may say so
            raise ValueError(
                f"an experience sampled at temperature {hot}: a Tinker service scores at temperature 1, the ratio "
                "would compare different distributions; sample at temperature 1"
            )
        keep = self.step.trained(exps)
        mask = scoring.response_mask(exps, keep)
        seqs = [TrainSequence(e.prompt_token_ids, e.response_token_ids) for e in exps]
        old = [list(e.logprobs) for e in exps]
        if self.plan.passes.old_logprobs:  # the one log-prob pass a Tinker service runs
            old = self._recomputed(seqs, old, mask, metrics)
        whole = scoring.WholeRows(mask, old)
        self.step.advantages(exps, keep, whole, metrics)
        adv = whole.batch["advantages"]
        loss, config = TINKER_LOSSES[algo.policy_loss_fn], _clip_config(algo)
        losses, optims = [], []
        for rows in mini_batches(len(exps), self.cfg, episode_starts(exps)):
            lo = rows.start
            weights = self._weights(mask[lo : rows.stop])
            datums = []
            for i in rows:
                inputs = {"logprobs": old[i], "advantages": (adv[i] * weights[i - lo]).tolist()}
                if loss == "gspo":  # the tokens whose ratios the sequence's ratio averages
                    inputs["sequence_ratio_mask"] = mask[i].tolist()
                datums.append(self._datum(seqs[i], inputs))
            # each update waits for its gradients: a failed forward_backward steps nothing after it
            losses.append(self.training.forward_backward(datums, loss, config).result().metrics.get("loss:sum", math.nan))
            optims.append(self._optim())
        norms = []
        for optim, lr in optims:
            norms.append(_grad_norm(optim.result()))
            metrics["actor/lr"] = lr
        metrics["actor/loss"], metrics["actor/grad_norm"] = sum(losses) / len(losses), sum(norms) / len(norms)
        metrics.update(rollout_metrics(exps))
        metrics["perf/train_s"] = time.perf_counter() - start
        metrics["perf/tokens"] = float(sum(len(s.prompt_token_ids) + len(s.response_token_ids) for s in seqs))
        return metrics, self.global_step

    def forward_backward(self, sequences: list[TrainSequence], loss: str) -> ForwardBackwardResult:
        """cross_entropy (SFT) over `sequences`, aggregated as algorithm.loss_agg_mode says."""
        if loss != "cross_entropy":
            raise ValueError(f"a Tinker service trains {loss} only through rlcore's own trainer: drop trainer.remote")
        masks = [list(s.loss_mask) or [1.0] * len(s.response_token_ids) for s in sequences]
        width = max(len(m) for m in masks)
        mask = torch.tensor([m + [0.0] * (width - len(m)) for m in masks])
        weights = self._weights(mask)
        datums = [self._datum(s, {"weights": w.tolist()}) for s, w in zip(sequences, weights, strict=True)]
        out = self.training.forward_backward(datums, "cross_entropy").result()
        value = out.metrics.get("loss:sum", math.nan)
        return ForwardBackwardResult(value, {"sft/loss": value}, int(mask.sum()))

    def optim_step(self) -> OptimStepResult:
        future, lr = self._optim()
        return OptimStepResult(_grad_norm(future.result()), lr, self.global_step)

    def _optim(self) -> tuple[Any, float]:
        """Submit an optimizer step with the schedule's lr for it: (its future, that lr)."""
        opt = self.algo.optimizer
        lr = opt.lr * self.lr(self.global_step)
        params = self.types.AdamParams(
            learning_rate=lr, beta1=opt.betas[0], beta2=opt.betas[1], eps=opt.eps, weight_decay=opt.weight_decay,
            grad_clip_norm=self.cfg.trainer.grad_clip,
        )  # fmt: skip
        self.global_step += 1
        return self.training.optim_step(params), lr

    def _recomputed(
        self, seqs: list[TrainSequence], engine: list[list[float]], mask: torch.Tensor, metrics: dict[str, float]
    ) -> list[list[float]]:  # fmt: skip
        """The old log-probs under the weights before the step's updates, and how far the
        sampler's are from them (rollout/logprob_diff_*, as rlcore's trainer reports)."""
        ours = self.compute_logprobs(seqs)
        diffs = [
            abs(a - b)
            for e, o, m in zip(engine, ours, mask.tolist(), strict=True)
            if len(e) == len(o)  # an experience may come without the sampler's log-probs
            for a, b, k in zip(e, o, m[: len(e)], strict=True)
            if k
        ]
        if diffs:
            metrics["rollout/logprob_diff_mean"] = sum(diffs) / len(diffs)
            metrics["rollout/logprob_diff_max"] = max(diffs)
        return ours

    def compute_logprobs(self, sequences: list[TrainSequence]) -> list[list[float]]:
        """Response log-probs under the current weights (a forward with cross_entropy)."""
        datums = [self._datum(s, {"weights": [0.0] * len(s.response_token_ids)}) for s in sequences]
        out = self.training.forward(datums, "cross_entropy").result()
        return [
            ([0.0] if not s.prompt_token_ids else [])  # nothing predicts a first token without a prompt
            + out.loss_fn_outputs[i]["logprobs"].tolist()[max(len(s.prompt_token_ids) - 1, 0) :]
            for i, s in enumerate(sequences)
        ]  # fmt: skip

    def _weights(self, mask: torch.Tensor) -> torch.Tensor:
        """[B, T] each response token's weight in the mini-batch's aggregate (loss_agg_mode)."""
        norm = LossNorm(  # a mini-batch with nothing to train (all filtered) still steps, as rlcore's trainer
            num_tokens=float(mask.sum()) or 1.0, num_seqs=float((mask.sum(-1) > 0).sum()) or 1.0,
            max_response_len=self.max_response_len,
        )  # fmt: skip
        return token_weights(mask, self.algo.loss_agg_mode, norm)

    def _datum(self, seq: TrainSequence, response_inputs: dict[str, list[float]]) -> Any:
        """One sequence as Tinker trains on it: the model reads all but the last token and predicts
        the next; the per-response-token inputs (right-padded rows are cut to the response), zero
        over the prompt."""
        prompt, response = list(seq.prompt_token_ids), list(seq.response_token_ids)
        ids = prompt + response
        pad = [0.0] * max(len(prompt) - 1, 0)
        skip = 0 if prompt else 1  # nothing predicts a first token without a prompt
        inputs: dict[str, Any] = {"target_tokens": ids[1:]}  # lists: the SDK makes its TensorData of them
        for k, v in response_inputs.items():
            inputs[k] = pad + [float(x) for x in v[skip : len(response)]]
        return self.types.Datum(model_input=self.types.ModelInput.from_ints(ids[:-1]), loss_fn_inputs=inputs)

    # ------------------------------------------------------------------ checkpoints and weights

    def save_checkpoint(self, export_hf: bool, explore_step: int) -> tuple[str, str]:
        """A Tinker checkpoint (weights and optimizer); it is also the stage's model for the next
        stage (no HF folder comes back from a service)."""
        path = self.training.save_state(f"step_{self.global_step}_{explore_step}").result().path
        record = read_record(self.stage_dir)
        record.append({"path": path, "global_step": self.global_step, "explore_step": explore_step})
        tmp = os.path.join(self.stage_dir, RECORD + ".tmp")
        with open(tmp, "w") as f:
            json.dump(record, f, indent=2)
        os.replace(tmp, os.path.join(self.stage_dir, RECORD))
        return path, path

    def load_checkpoint(self) -> Restored | None:
        record = read_record(self.stage_dir)
        if not record:
            return None
        last = record[-1]
        self._training = self.service.create_training_client_from_state_with_optimizer(last["path"]).result()
        self.global_step = last["global_step"]
        return Restored(last["path"], last["global_step"], last["explore_step"])

    def sync_weights(self, endpoints: list[str]) -> Synced:
        """Save the weights for sampling; the rollout workers' tinker engines load that path."""
        start = time.perf_counter()
        sender = self._link(endpoints)
        version = announce(self.global_step, sender.served())
        self._syncs += 1
        path = self.training.save_weights_for_sampler(f"sampler_{version}_{self._syncs}").result().path
        sender.send_checkpoint(path, version)
        return Synced(0, time.perf_counter() - start)

    def _link(self, endpoints: list[str]) -> WeightSender:
        if self._sender is None or [c.address for c in self._sender.clients] != list(endpoints):
            if self._sender is not None:
                self._sender.close()
            options = ClientOptions.from_control(self.cfg.control)
            self._sender = connect(list(endpoints), self.cfg.synchronizer, options)
        return self._sender


def read_record(stage_dir: str) -> list[dict[str, Any]]:
    """The stage's Tinker checkpoints (RECORD), oldest first; [] when it has none."""
    path = os.path.join(stage_dir, RECORD)
    if not os.path.isfile(path):
        return []
    with open(path) as f:
        return list(json.load(f))


def _clip_config(algo: Any) -> dict[str, float] | None:
    """Tinker's clip thresholds for the losses that clip (the ratio's bounds, not their distances to 1)."""
    if TINKER_LOSSES[algo.policy_loss_fn] == "importance_sampling":
        return None
    return {"clip_low_threshold": 1.0 - algo.clip_ratio_low, "clip_high_threshold": 1.0 + algo.clip_ratio_high}


def _grad_norm(response: Any) -> float:
    """The gradient norm an optim_step reports (rlcore's server does; a service that does not: nan)."""
    return float((response.metrics or {}).get("grad_norm:mean", math.nan))
