"""The `reward_model` reward: a reward model scores each prompt and response.

List `reward_model` in a taskset's `reward_fn` and set its `reward_model` block: `path`, a folder that
transformers' AutoModelForSequenceClassification loads with one label (an algorithm_type
reward_model stage's export, or 'stage:<name>' for that stage of the same run), and `normalize`.
With `path` it runs where the workflow runs (the rollout worker, or the trainer's process for
in-process engines), on the GPU when there is one, as a batch reward: a workflow's responses are
scored `batch_size` at a time. With `address` instead, a reward model server scores them
(`rlcore reward-model serve`, rollout/rewards/reward_server.py: the same model code, one copy for
every worker, batching their concurrent calls): `batch_size` rows per call, its token from the
variable `token_env`, each call retried while the server is unavailable, up to `timeout_s`.

A response is scored as the reward_model stage trained on it: the prompt as the policy's stage
renders it (its chat template and the taskset's system prompt), then the response's tokens and the
end-of-text token, read at that last token (core/algorithms/reward_model.py). What it does not see:
a row's own system prompt or tools (format.system_prompt_key, tools_key), a messages row's
conversation (its prompt text only), and, with format.reasoning_tags, the reasoning block (it
scores the answer after it, as every reward function does); a response the token budget cut off
is scored as if it had ended. The model is held in float32, once per process (on a rollout worker
beside its engine: on the GPU, count it against the engine's memory; a server keeps it off the
workers' GPUs).

transformers' own AutoModelForSequenceClassification reads a row at its last token that is not the
pad token: the same score, except for a tokenizer whose pad token is its end-of-text token (Qwen's
base models), where it reads the token before; this scorer reads the last token itself.
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Sequence
from typing import Any

from ...core.config.stage_refs import STAGE_PREFIX

REWARD_MODEL = "reward_model"
"""Its name in reward_fn."""

KEYS = ("path", "address", "token_env", "timeout_s", "normalize", "batch_size", "tls")
TLS_KEYS = ("ca_file", "cert_file", "key_file", "server_name")
"""reward_model.tls's files as they travel (enabled: the dict is there; off: None)."""
NORMALIZE = ("none", "sigmoid")


def reward_model_settings(cfg: Any) -> dict[str, Any]:
    """A taskset's `reward_model` block (RewardModelRewardConfig) as the plain dict that travels in
    WorkflowSpec."""
    return {
        "path": cfg.path, "address": cfg.address, "token_env": cfg.token_env, "timeout_s": float(cfg.timeout_s),
        "normalize": cfg.normalize, "batch_size": int(cfg.batch_size),
        "tls": {k: getattr(cfg.tls, k) for k in TLS_KEYS} if cfg.tls.enabled else None,
    }  # fmt: skip


def check_reward_model(settings: dict[str, Any], check_path: bool = True) -> None:
    """ValueError naming `reward_model.<field>` for settings that cannot work; `check_path`: the
    folder must hold a model's config here (not for 'stage:<name>', which the run writes)."""
    unknown = sorted(set(settings) - set(KEYS))
    if unknown:
        raise ValueError(f"reward_model: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(KEYS)}")
    path, address = settings.get("path"), settings.get("address")
    if path and address:
        raise ValueError(
            "reward_model: give path (the model, loaded where the workflow runs) or address (a reward model "
            "server's host:port), not both"
        )
    if address:
        _check_served(settings)
    elif settings.get("tls"):
        raise ValueError("reward_model.tls: applies with address (a reward model server); a path is scored here")
    elif not isinstance(path, str) or not path:
        raise ValueError(
            "reward_model.path: give the reward model's folder (AutoModelForSequenceClassification, one label), "
            "e.g. a reward_model stage's export, or 'stage:<name>' for that stage of this run; or "
            "reward_model.address, a server's host:port (rlcore reward-model serve)"
        )
    elif check_path and not path.startswith(STAGE_PREFIX) and not os.path.isfile(os.path.join(path, "config.json")):
        raise ValueError(f"reward_model.path: '{path}' is not a model folder (no config.json there)")
    if settings.get("normalize") not in NORMALIZE:
        raise ValueError(f"reward_model.normalize must be one of {', '.join(NORMALIZE)}; got {settings.get('normalize')!r}")
    size = settings.get("batch_size")
    if not isinstance(size, int) or isinstance(size, bool) or size < 1:
        raise ValueError(f"reward_model.batch_size must be an integer >= 1; got {size!r}")


def _check_served(settings: dict[str, Any]) -> None:
    """The keys of a served reward model (reward_model.address)."""
    from ...core.rpc.address import is_host_port

    address = settings["address"]
    if not isinstance(address, str) or not is_host_port(address):
        raise ValueError(f"reward_model.address: give the server's host:port; got {address!r}")
    if not isinstance(settings.get("token_env"), str) or not settings["token_env"]:
        raise ValueError("reward_model.token_env: name the variable holding the server's token (its --token-env)")
    timeout = settings.get("timeout_s")
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout < math.inf:
        raise ValueError(f"reward_model.timeout_s must be a number > 0; got {timeout!r}")
    tls = settings.get("tls")
    if tls is not None and bool(tls.get("cert_file")) != bool(tls.get("key_file")):
        raise ValueError("reward_model.tls: cert_file and key_file go together (this side's certificate for a server "
                         "that requires client certificates)")  # fmt: skip


def served_tls(settings: dict[str, Any]) -> Any:
    """The TLS files of the reward model server's client (None: plaintext); files this process
    cannot read are named in one line."""
    from ...core.rpc.security import TLSFiles

    tls = settings.get("tls")
    if not tls:
        return None
    for key in ("ca_file", "cert_file", "key_file"):
        if tls.get(key) and not os.access(tls[key], os.R_OK):
            raise ValueError(f"reward_model.tls.{key}: {tls[key]} cannot be read here (where the workflow runs)")
    mutual = bool(tls.get("cert_file") and tls.get("key_file"))  # a client presents its certificate then
    return TLSFiles(tls.get("cert_file"), tls.get("key_file"), tls.get("ca_file"), mutual, tls.get("server_name"))


def served_token(settings: dict[str, Any]) -> str:
    """The token of the server at reward_model.address, from this process's environment."""
    token = os.environ.get(settings["token_env"])
    if not token:
        raise ValueError(
            f"reward_model.token_env: {settings['token_env']} is not set here: export it with the token the "
            f"reward model server at {settings['address']} was started with (its --token-env)"
        )
    return token


_LOADED: dict[str, LoadedRewardModel] = {}
_LOCK = threading.Lock()


class LoadedRewardModel:
    """A reward model's folder loaded in this process: a one-label sequence classifier in float32
    (on the GPU when there is one) and its tokenizer."""

    def __init__(self, path: str):
        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        self.model = AutoModelForSequenceClassification.from_pretrained(path, dtype=torch.float32).to(self.device).eval()
        if self.model.config.num_labels != 1:
            raise ValueError(
                f"reward_model.path: '{path}' has {self.model.config.num_labels} labels; a reward model has one score"
            )
        self.tokenizer = AutoTokenizer.from_pretrained(path)

    @classmethod
    def shared(cls, path: str) -> LoadedRewardModel:
        """`path` loaded once per process (workflows of one run share it)."""
        with _LOCK:
            if path not in _LOADED:
                _LOADED[path] = cls(path)
            return _LOADED[path]

    def encode(self, prompt_format: Any, prompts: Sequence[str], completions: Sequence[str]) -> list[list[int]]:
        """Each row's token ids: the prompt as `prompt_format` (core/data/prompts.PromptFormat)
        renders it, the completion's tokens, the end-of-text token."""
        tok = self.tokenizer
        eos = [tok.eos_token_id] if tok.eos_token_id is not None else []
        return [
            prompt_format.encode_prompt(tok, p) + tok(c, add_special_tokens=False)["input_ids"] + eos
            for p, c in zip(prompts, completions, strict=True)
        ]

    def score_rows(self, rows: Sequence[Sequence[int]], batch_size: int) -> list[float]:
        """Each row's raw score (the head at its last token), `batch_size` rows per forward pass."""
        import torch

        out: list[float] = []
        for start in range(0, len(rows), batch_size):
            chunk = rows[start : start + batch_size]
            width = max(len(r) for r in chunk)
            ids = torch.zeros((len(chunk), width), dtype=torch.long)
            mask = torch.zeros_like(ids)
            for i, r in enumerate(chunk):
                ids[i, : len(r)], mask[i, : len(r)] = torch.tensor(r), 1
            with torch.no_grad():
                hidden = self.model.base_model(
                    input_ids=ids.to(self.device), attention_mask=mask.to(self.device)
                ).last_hidden_state
                last = hidden[torch.arange(len(chunk)), mask.sum(1).to(self.device) - 1]
                out += self.model.score(last)[:, 0].float().tolist()
        return out


def normalized(scores: Sequence[float], normalize: str) -> list[float]:
    """`scores` under reward_model.normalize."""
    if normalize == "sigmoid":
        return [1.0 / (1.0 + math.exp(-v)) if v >= 0 else math.exp(v) / (1.0 + math.exp(v)) for v in scores]
    return list(scores)


class RewardModelScorer:
    """The `reward_model` reward of one taskset: a batch reward (it takes `completions`), scored by
    the model in this process (`path`) or by a reward model server (`address`)."""

    def __init__(self, settings: dict[str, Any], prompt_format: Any):
        """`prompt_format`: how the policy's stage renders a prompt (core/data/prompts.PromptFormat)."""
        check_reward_model(settings, check_path=False)
        path = settings.get("path")
        if path and path.startswith(STAGE_PREFIX):
            raise ValueError(
                f"reward_model.path: '{path}' names a stage, which the run resolves to its export "
                "before the stage explores; outside a run give the folder itself"
            )
        if settings.get("address"):
            served_token(settings)  # missing here: one line now, not at the first score
            served_tls(settings)
        self.settings, self.prompt_format = settings, prompt_format
        self._client: Any = None

    def scores(self, prompts: Sequence[str], completions: Sequence[str]) -> list[float]:
        """Each (prompt, completion)'s raw score: the head at its last token."""
        size = self.settings["batch_size"]
        if self.settings.get("path"):
            model = LoadedRewardModel.shared(self.settings["path"])
            return model.score_rows(model.encode(self.prompt_format, prompts, completions), size)
        client = self._remote()
        out: list[float] = []
        for start in range(0, len(prompts), size):
            out += client.score(prompts[start : start + size], completions[start : start + size], self.prompt_format)
        return out

    def _remote(self) -> Any:
        """The client of the reward model server at `address` (retrying while it is unavailable)."""
        if self._client is None:
            from ...client.base import ClientOptions
            from ...client.reward import RewardClient

            options = ClientOptions(
                token=served_token(self.settings), timeout=float(self.settings["timeout_s"]), tls=served_tls(self.settings)
            )
            self._client = RewardClient(self.settings["address"], options)
        return self._client

    def __call__(self, prompts: Sequence[str], completions: Sequence[str], task_id: Sequence[str]) -> list[float]:
        return normalized(self.scores(prompts, completions), self.settings["normalize"])
