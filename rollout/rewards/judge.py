"""The `judge` reward: an auxiliary model (explorer.auxiliary_models) asked about each response.

List `judge` in a taskset's `reward_fn` and set its `judge` block: the service's name, a template
for the user message with `{prompt}`, `{response}` and `{answer}` filled in, and a parse rule:

- `score`: the last match of `score_pattern` in the reply (its first group, if it has one), mapped
  linearly from `score_range` [lo, hi] onto [0, 1] and clipped there;
- `verdict`: of the `verdicts` words (whole words, any case), the one said last; its value.

A batch's requests go out together (up to the service's max_concurrency in flight). A reply with
no score or verdict fails the batch naming the task and the reply, unless `unparsed_reward` scores
it; a service that fails is one line naming the service (the auxiliary model's own error).
"""

from __future__ import annotations

import math
import re
import string
from collections.abc import Collection, Sequence
from typing import Any

from ..auxiliary import AuxiliaryModel

JUDGE = "judge"
"""Its name in reward_fn."""

FIELDS = ("prompt", "response", "answer")
"""What a template may name."""

KEYS = (
    "model", "template", "system_prompt", "parse", "score_pattern", "score_range", "verdicts",
    "unparsed_reward", "max_tokens", "temperature",
)  # fmt: skip

PARSE = ("score", "verdict")


def judge_settings(cfg: Any) -> dict[str, Any]:
    """A taskset's `judge` block (JudgeConfig) as the plain dict that travels in WorkflowSpec."""
    return {
        "model": cfg.model, "template": cfg.template, "system_prompt": cfg.system_prompt, "parse": cfg.parse,
        "score_pattern": cfg.score_pattern, "score_range": [float(v) for v in cfg.score_range],
        "verdicts": {str(k): float(v) for k, v in cfg.verdicts.items()},
        "unparsed_reward": None if cfg.unparsed_reward is None else float(cfg.unparsed_reward),
        "max_tokens": int(cfg.max_tokens), "temperature": float(cfg.temperature),
    }  # fmt: skip


def _real(value: Any) -> float | None:
    """`value` as a finite float, or None when it is not one (a string, null, inf)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def check_judge(settings: dict[str, Any], auxiliary: Collection[str]) -> None:
    """ValueError naming `judge.<field>` for settings that cannot work; `auxiliary` are the names of
    the configured services."""
    unknown = sorted(set(settings) - set(KEYS))
    if unknown:
        raise ValueError(f"judge: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(KEYS)}")
    model = settings.get("model")
    if not model:
        raise ValueError(
            f"judge.model: name the auxiliary model that judges (explorer.auxiliary_models: {', '.join(auxiliary) or 'none'})"
        )
    if model not in auxiliary:
        raise ValueError(
            f"judge.model: '{model}' is not a configured auxiliary model (explorer.auxiliary_models: "
            f"{', '.join(auxiliary) or 'none'}; 'external' is model.external_model)"
        )
    template = settings.get("template")
    if not isinstance(template, str) or not template.strip():
        raise ValueError("judge.template: give the user message, naming {response} (and {prompt}, {answer})")
    try:
        named = {f for _, f, _, _ in string.Formatter().parse(template) if f is not None}
    except ValueError as e:
        raise ValueError(f"judge.template: {e} (write {{{{ and }}}} for literal braces)") from None
    wrong = sorted(named - set(FIELDS))
    if wrong:
        raise ValueError(
            f"judge.template names {', '.join('{' + w + '}' for w in wrong)}; it may name only "
            f"{', '.join('{' + f + '}' for f in FIELDS)} (write {{{{ and }}}} for literal braces)"
        )
    if "response" not in named:
        raise ValueError("judge.template: name {response}, the text the judge is asked about")
    parse = settings.get("parse")
    if parse not in PARSE:
        raise ValueError(f"judge.parse must be one of {', '.join(PARSE)}; got {parse!r}")
    if parse == "score":
        try:
            pattern = re.compile(settings.get("score_pattern") or "")
        except re.error as e:
            raise ValueError(f"judge.score_pattern: not a regular expression ({e})") from None
        if not pattern.pattern or pattern.groups > 1:
            raise ValueError(
                "judge.score_pattern: give a regular expression with at most one group (the number)"
            )
        span = settings.get("score_range")
        ends = [_real(v) for v in span] if isinstance(span, list) and len(span) == 2 else [None]
        if None in ends or not ends[0] < ends[1]:  # type: ignore[operator]
            raise ValueError(
                f"judge.score_range: give [lo, hi] with lo < hi (mapped onto [0, 1]); got {span!r}"
            )
    else:
        verdicts = settings.get("verdicts")
        if not isinstance(verdicts, dict) or not verdicts:
            raise ValueError(
                "judge.verdicts: map each verdict word to its reward, e.g. {correct: 1.0, incorrect: 0.0}"
            )
        bad = [w for w, v in verdicts.items() if not str(w).strip() or _real(v) is None]
        if bad:
            raise ValueError(f"judge.verdicts: {bad[0]!r} needs a non-empty word and a finite reward")
    unparsed = settings.get("unparsed_reward")
    if unparsed is not None and _real(unparsed) is None:
        raise ValueError(f"judge.unparsed_reward must be finite or null; got {unparsed!r}")
    max_tokens = settings.get("max_tokens")
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
        raise ValueError(f"judge.max_tokens must be an integer >= 1; got {max_tokens!r}")
    temperature = _real(settings.get("temperature", 0.0))
    if temperature is None or temperature < 0.0:
        raise ValueError(f"judge.temperature must be >= 0; got {settings.get('temperature')!r}")


def parse_score(reply: str, pattern: str, lo: float, hi: float) -> float | None:
    """The last number `pattern` finds in `reply`, mapped from [lo, hi] onto [0, 1] and clipped;
    None when it finds none."""
    matches = list(re.finditer(pattern, reply))
    if not matches:
        return None
    last = matches[-1]
    try:
        value = float(last.group(1) if last.re.groups else last.group(0))
    except ValueError:
        return None
    if not math.isfinite(value):
        return None
    return min(1.0, max(0.0, (value - lo) / (hi - lo)))


def parse_verdict(reply: str, verdicts: dict[str, float]) -> float | None:
    """The value of the verdict word said last in `reply` (whole words, any case); None when none is."""
    said = {}
    for word, value in verdicts.items():
        found = list(re.finditer(rf"(?<!\w){re.escape(word)}(?!\w)", reply, flags=re.IGNORECASE))
        if found:
            said[found[-1].start()] = value
    return said[max(said)] if said else None


class Judge:
    """The `judge` reward of one taskset: a batch reward (it takes `completions`), so a workflow's
    batch is judged with one round of concurrent requests."""

    def __init__(self, settings: dict[str, Any], auxiliary: dict[str, AuxiliaryModel]):
        check_judge(settings, list(auxiliary))
        self.settings = settings
        self.model = auxiliary[settings["model"]]

    def messages(self, prompt: str, response: str, answer: str | None) -> list[dict[str, str]]:
        s = self.settings
        user = s["template"].format(prompt=prompt, response=response, answer="" if answer is None else answer)
        system = [{"role": "system", "content": s["system_prompt"]}] if s.get("system_prompt") else []
        return [*system, {"role": "user", "content": user}]

    def parse(self, reply: str) -> float | None:
        s = self.settings
        if s["parse"] == "score":
            lo, hi = s["score_range"]
            return parse_score(reply, s["score_pattern"], float(lo), float(hi))
        return parse_verdict(reply, s["verdicts"])

    def __call__(
        self,
        prompts: Sequence[str],
        completions: Sequence[str],
        answer: Sequence[str | None],
        task_id: Sequence[str],
    ) -> list[float]:
        s = self.settings
        replies = self.model.chat_many(
            [self.messages(p, c, a) for p, c, a in zip(prompts, completions, answer, strict=True)],
            max_tokens=int(s["max_tokens"]), temperature=float(s["temperature"]),
        )  # fmt: skip
        out = []
        for reply, task in zip(replies, task_id, strict=True):
            value = self.parse(reply)
            if value is None:
                if s.get("unparsed_reward") is None:
                    what = f"no match of score_pattern {s['score_pattern']!r}" if s["parse"] == "score" else (
                        f"none of the verdicts {', '.join(s['verdicts'])}"
                    )  # fmt: skip
                    raise ValueError(
                        f"the judge's reply on task {task} has {what}: {reply[:120]!r}; fix taskset.judge.template "
                        "(ask for the format) or the parse rule, or set taskset.judge.unparsed_reward to score such replies"
                    )
                value = float(s["unparsed_reward"])
            out.append(value)
        return out
