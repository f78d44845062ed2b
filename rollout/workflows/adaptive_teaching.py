"""`adaptive_teaching`: the policy learns to teach. A student (an auxiliary model: vLLM's server, an
rlcore worker's HTTP door, a hosted API) is probed on each question; the policy, as teacher,
writes teaching adapted to what the probe shows; the student answers again with the teaching.
The teacher's reward is the student's gain over its own baseline answer, a loss scaled by
`degradation_penalty_multiplier`, minus `efficiency_weight` x the teaching's share of the token
budget.

Per task (the student's calls once per task, at `student_temperature`, default greedy):
  baseline  = student(student_baseline_template{question})            scored by the reward functions
  probe     = student(student_diagnostic_template{question})          up to max_probe_tokens
  teaching  = policy(teacher_adaptive_template{question, student_response=probe})   n samples, trained
  with      = student(student_with_teaching_template{question, teaching})           scored
  reward    = gain (with - baseline), times degradation_penalty_multiplier when negative,
              minus efficiency_weight * teaching tokens / max_tokens
"""

from __future__ import annotations

import string
import time
from typing import Any

from ...core.types import Experience, SamplingParams, Task
from .base import Workflow

TEMPLATES = {
    "student_baseline_template": ("{question}", ("question",)),
    "student_diagnostic_template": (
        "Before you answer, say how you would work this out and where you are unsure: {question}",
        ("question",),
    ),
    "teacher_adaptive_template": (
        "A student was asked: {question}\nThe student's thinking: {student_response}\n"
        "Write short teaching that fixes what the student gets wrong.",
        ("question", "student_response"),
    ),
    "student_with_teaching_template": ("{teaching}\n\n{question}", ("question", "teaching")),
}
NUMBERS = {"max_probe_tokens": 64, "student_max_tokens": 64, "student_temperature": 0.0,
           "degradation_penalty_multiplier": 1.0, "efficiency_weight": 0.0}  # fmt: skip


class AdaptiveTeachingWorkflow(Workflow):
    """`workflow_args`: student (an auxiliary model's name, default 'external'), the four templates,
    max_probe_tokens, student_max_tokens, student_temperature, degradation_penalty_multiplier,
    efficiency_weight."""

    KEYS = ("student", *TEMPLATES, *NUMBERS)

    @classmethod
    def check_args(cls, args: dict[str, Any]) -> None:
        super().check_args(args)
        if not isinstance(args.get("student", "external"), str):
            raise ValueError("workflow_args.student must name an auxiliary model")
        for key, (_, needed) in TEMPLATES.items():
            template = args.get(key)
            if template is None:
                continue
            if not isinstance(template, str):
                raise ValueError(f"workflow_args.{key} must be a string")
            try:
                fields = {name for _, name, _, _ in string.Formatter().parse(template) if name is not None}
            except ValueError as e:
                raise ValueError(f"workflow_args.{key}: not a format string ({e})") from None
            missing, extra = sorted(set(needed) - fields), sorted(fields - set(needed))
            if missing or extra:
                raise ValueError(
                    f"workflow_args.{key} must use {{{'}, {'.join(needed)}}}"
                    + (f"; it lacks {{{'}, {'.join(missing)}}}" if missing else "")
                    + (f"; it has unknown {{{'}, {'.join(extra)}}}" if extra else "")
                )
        for key, default in NUMBERS.items():
            value = args.get(key, default)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0:
                raise ValueError(f"workflow_args.{key} must be a number >= 0; got {value!r}")
        for key in ("max_probe_tokens", "student_max_tokens"):
            if not isinstance(args.get(key, 1), int) or args.get(key, 1) < 1:
                raise ValueError(f"workflow_args.{key} must be a positive integer; got {args.get(key)!r}")

    @classmethod
    def auxiliary_needed(cls, args: dict[str, Any]) -> list[str]:
        return [args.get("student", "external")]

    def __init__(self, *a: Any, **kw: Any):
        super().__init__(*a, **kw)
        self.check_args(self.args)
        name = self.args.get("student", "external")
        if name not in self.auxiliary:
            configured = ", ".join(self.auxiliary) or "none"
            raise ValueError(
                f"workflow_args.student: no auxiliary model '{name}' (configured: {configured}); add it to "
                "explorer.auxiliary_models, or enable model.external_model for 'external'"
            )
        self.student = self.auxiliary[name]
        self.templates = {key: self.args.get(key, default) for key, (default, _) in TEMPLATES.items()}
        self.numbers = {key: self.args.get(key, default) for key, default in NUMBERS.items()}

    def ask(self, key: str, values: list[dict[str, str]], max_tokens: int) -> list[str]:
        """The student's replies to one template filled with each of `values`."""
        conversations = [[{"role": "user", "content": self.templates[key].format(**v)}] for v in values]
        return self.student.chat_many(
            conversations, max_tokens=max_tokens, temperature=float(self.numbers["student_temperature"])
        )

    def run(self, tasks: list[Task], sampling: SamplingParams, policy_version: int) -> list[Experience]:
        start = time.perf_counter()
        questions = [{"question": t.prompt} for t in tasks]
        baselines = self.ask("student_baseline_template", questions, int(self.numbers["student_max_tokens"]))
        probes = self.ask("student_diagnostic_template", questions, int(self.numbers["max_probe_tokens"]))
        student_s = time.perf_counter() - start
        base_scores = [self.reward(answer, task)[0] for answer, task in zip(baselines, tasks, strict=True)]
        prompts = [
            self.prompt_format.encode_prompt(
                self.tokenizer,
                self.templates["teacher_adaptive_template"].format(question=t.prompt, student_response=p),
            )
            for t, p in zip(tasks, probes, strict=True)
        ]
        generated = time.perf_counter()
        completions = self.engine.generate(prompts, sampling)
        engine_s = time.perf_counter() - generated
        pairs = [(i, c) for i, samples in enumerate(completions) for c in samples]
        t0 = time.perf_counter()
        taught = self.ask(
            "student_with_teaching_template",
            [{"question": tasks[i].prompt, "teaching": c.text} for i, c in pairs],
            int(self.numbers["student_max_tokens"]),
        )
        student_s += time.perf_counter() - t0
        experiences = []
        for (i, c), answer in zip(pairs, taught, strict=True):
            with_teaching = self.reward(answer, tasks[i])[0]
            gain = with_teaching - base_scores[i]
            reward = gain if gain >= 0 else gain * float(self.numbers["degradation_penalty_multiplier"])
            efficiency = float(self.numbers["efficiency_weight"]) * len(c.token_ids) / sampling.max_tokens
            experiences.append(
                Experience(
                    prompt_token_ids=c.prompt_token_ids,
                    response_token_ids=c.token_ids,
                    logprobs=c.logprobs,
                    reward=reward - efficiency,
                    group_id=tasks[i].task_id,
                    policy_version=policy_version,
                    finish_reason=c.finish_reason,
                    response_text=c.text,
                    reward_components={
                        "student_baseline": base_scores[i],
                        "student_with_teaching": with_teaching,
                        "gain": gain,
                        "efficiency_penalty": efficiency,
                    },
                    metrics={"improved": float(gain > 0), "degraded": float(gain < 0)},
                )  # fmt: skip
            )
        total = time.perf_counter() - start
        self.timing = {"engine_s": engine_s, "student_s": student_s, "reward_s": total - engine_s - student_s}
        return experiences
