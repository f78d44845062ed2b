"""The OpenAI-compatible services a run's config names: explorer.auxiliary_models, and
model.external_model as 'external'. Workflows and the judge reach them on the rollout workers
(rollout/auxiliary.py); a distillation teacher behind one is reached from the trainer world
(core/algorithms/teacher_service.py)."""

from __future__ import annotations

import os
from typing import Any

KEYS = (
    "name",
    "model_name",
    "base_url",
    "base_url_env",
    "api_key_env",
    "timeout_s",
    "max_retries",
    "max_concurrency",
)


def check_auxiliary(specs: list[dict[str, Any]]) -> None:
    """ValueError naming `auxiliary_models[i].<field>` for a spec that cannot work."""
    names = set()
    for i, spec in enumerate(specs):
        where = f"auxiliary_models[{i}]"
        if not isinstance(spec, dict):
            raise ValueError(f"{where} must be an object")
        unknown = sorted(set(spec) - set(KEYS))
        if unknown:
            raise ValueError(f"{where}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(KEYS)}")
        for key in ("name", "model_name"):
            if not isinstance(spec.get(key), str) or not spec[key]:
                raise ValueError(f"{where}.{key} must be a non-empty string")
        if spec["name"] in names:
            raise ValueError(f"{where}.name: '{spec['name']}' is used twice")
        names.add(spec["name"])
        if not spec.get("base_url") and not spec.get("base_url_env"):
            raise ValueError(f"{where}: give base_url or base_url_env (the service's .../v1 address)")


def auxiliary_models(cfg: Any) -> list[dict[str, Any]]:
    """explorer.auxiliary_models, and model.external_model as 'external' when enabled."""
    out: list[dict[str, Any]] = [
        {"name": a.name, "model_name": a.model_name, "base_url": a.base_url, "base_url_env": a.base_url_env,
         "api_key_env": a.api_key_env, "timeout_s": a.timeout_s, "max_retries": a.max_retries,
         "max_concurrency": a.max_concurrency}
        for a in cfg.explorer.auxiliary_models
    ]  # fmt: skip
    ext = cfg.model.external_model
    if ext.enable:
        out.append({"name": "external", "model_name": ext.model_name, "base_url": ext.base_url,
                    "base_url_env": ext.base_url_env, "api_key_env": ext.api_key_env})  # fmt: skip
    return out


def openai_client(spec: dict[str, Any], who: str) -> Any:
    """An `openai.OpenAI` client for one service spec (its URL and key read from this process's
    environment when named by variable); ValueError naming `who` and what is missing."""
    try:
        import openai
    except ImportError as e:
        raise ValueError(f"{who} needs the openai package: pip install 'rlcore[http]'") from e
    base_url = spec.get("base_url") or os.environ.get(spec.get("base_url_env") or "")
    if not base_url:
        raise ValueError(
            f"{who}: environment variable {spec.get('base_url_env')} (base_url_env) is not set in this process"
        )
    key_env = spec.get("api_key_env")
    api_key = os.environ.get(key_env) if key_env else "none"
    if api_key is None:
        raise ValueError(f"{who}: environment variable {key_env} (api_key_env) is not set in this process")
    return openai.OpenAI(
        base_url=base_url, api_key=api_key, timeout=float(spec.get("timeout_s") or 120),
        max_retries=int(spec.get("max_retries", 2)),
    )  # fmt: skip
