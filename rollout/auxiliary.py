"""Auxiliary models: OpenAI-compatible services a workflow talks to (a teacher, a judge, a user
simulator), through the `openai` package. Configured in `explorer.auxiliary_models` (and
`model.external_model`, named 'external'); a workflow finds them in `self.auxiliary[name]`."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ..core.services import check_auxiliary, openai_client


class AuxiliaryError(RuntimeError):
    """The service failed (unreachable, an HTTP error, a timeout): one line naming it. A runtime
    error, so a rollout batch that met it is retried (explorer.max_retry_times)."""


class AuxiliaryModel:
    """One service: `chat(messages)` -> the reply text; `chat_many` runs several requests at once."""

    def __init__(self, spec: dict[str, Any]):
        self.spec = spec
        self.name, self.model_name = spec["name"], spec["model_name"]
        self.max_concurrency = int(spec.get("max_concurrency") or 16)
        self._client: Any = None
        self._making = threading.Lock()

    @property
    def client(self) -> Any:
        """The openai client, made once on first use (the URL and key are read from this process's
        environment when named by variable); chat_many's threads share it (each making its own
        would cost each an SSL context and a connection pool, about 0.1 s of CPU)."""
        with self._making:
            if self._client is None:
                self._client = openai_client(self.spec, f"auxiliary model '{self.name}'")
        return self._client

    def chat(
        self,
        messages: list[dict[str, Any]],
        *,
        max_tokens: int,
        temperature: float = 0.0,
        seed: int | None = None,
    ) -> str:
        """The assistant's reply text (AuxiliaryError naming the model on any failure of the service)."""
        try:
            answer = self.client.chat.completions.create(
                model=self.model_name,
                messages=messages,
                max_tokens=max_tokens,
                temperature=temperature,
                seed=seed,
            )
        except ValueError:
            raise
        except Exception as e:  # openai.APIError and connection failures: one line naming the service
            raise AuxiliaryError(
                f"auxiliary model '{self.name}' ({self.model_name}) failed: {type(e).__name__}: {e}"
            ) from None
        return answer.choices[0].message.content or ""

    def chat_many(self, conversations: list[list[dict[str, Any]]], **kwargs: Any) -> list[str]:
        """`chat` for each conversation, up to max_concurrency in flight; replies in order."""
        if not conversations:
            return []
        with ThreadPoolExecutor(max_workers=min(self.max_concurrency, len(conversations))) as pool:
            return list(pool.map(lambda m: self.chat(m, **kwargs), conversations))


def build_auxiliary(specs: list[dict[str, Any]]) -> dict[str, AuxiliaryModel]:
    check_auxiliary(specs)
    return {spec["name"]: AuxiliaryModel(spec) for spec in specs}
