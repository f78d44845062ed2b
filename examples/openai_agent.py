"""An agent written against the OpenAI API, trained by rlcore.

The agent is ordinary `openai` client code: it asks a model multiplication questions, offers it a
calculator tool, runs the tool itself when the model calls it, and scores the final answer. The
only rlcore-specific parts are the episode id it tags its requests with (`extra_body`) and three
gRPC calls per step: FinishEpisode (the worker turns each recorded episode into an experience,
token for token), TrainStep (GRPO on them) and SyncWeights (the worker serves the new weights).

    export RLCORE_TOKEN=secret
    rlcore rollout serve --model M --port 50051 --http-port 8000 &
    rlcore trainer serve --port 50052 &                # then Configure it (see tests/integration)
    python examples/openai_agent.py --http http://127.0.0.1:8000/v1 --rollout 127.0.0.1:50051 \
        --trainer 127.0.0.1:50052 --steps 20

Each step prints one JSON line: the step, mean reward, share of episodes that used the tool, the
policy version the worker serves after the sync, and the trainer's metrics.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import uuid

import openai

from rlcore.client.base import ClientOptions
from rlcore.client.rollout import RolloutClient
from rlcore.client.trainer import TrainerClient
from rlcore.rollout.tools.calculator import Calculator

CALCULATOR = Calculator()
ANSWER = re.compile(r"<answer>\s*(-?\d+)\s*</answer>")


def run_episode(api: openai.OpenAI, model: str, question: str, episode_id: str, max_turns: int) -> tuple[str, bool]:
    """Talk to the model until it answers without a tool call; returns (last reply, tool used)."""
    messages: list[dict] = [{"role": "user", "content": question}]
    used_tool = False
    reply = ""
    for _ in range(max_turns):
        answer = api.chat.completions.create(
            model=model, messages=messages, tools=[CALCULATOR.schema], max_tokens=40, temperature=1.0,
            extra_body={"episode_id": episode_id},
        )  # fmt: skip
        message = answer.choices[0].message
        reply = message.content or ""
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            break
        for call in message.tool_calls:  # the agent runs its tools itself
            try:
                result = CALCULATOR(json.loads(call.function.arguments))
                used_tool = True
            except Exception as e:
                result = f"error: {e}"
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    return reply, used_tool


def score(reply: str, product: int, partial_credit: bool) -> float:
    """1 for the right answer in <answer> tags; with partial credit, otherwise a tenth of the share of
    the product's digits that appear in the reply (a signal even an untrained model gets)."""
    found = ANSWER.search(reply)
    if found is not None and int(found[1]) == product:
        return 1.0
    digits = set(str(product))
    return 0.1 * len(digits & set(reply)) / len(digits) if partial_credit else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--http", required=True, help="the rollout worker's OpenAI base URL (.../v1)")
    parser.add_argument("--rollout", required=True, help="the rollout worker's gRPC address")
    parser.add_argument("--trainer", required=True, help="a configured trainer's gRPC address")
    parser.add_argument("--token-env", default="RLCORE_TOKEN")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--tasks", type=int, default=4, help="questions per step")
    parser.add_argument("--group", type=int, default=4, help="episodes per question (a GRPO group)")
    parser.add_argument("--max-turns", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--partial-credit", action="store_true", help="reward digits of the product in a wrong reply")
    args = parser.parse_args()
    token = os.environ[args.token_env]
    api = openai.OpenAI(base_url=args.http, api_key=token)
    model = api.models.list().data[0].id
    rng = random.Random(args.seed)
    options = ClientOptions(token=token, timeout=600)
    with RolloutClient(args.rollout, options) as worker, TrainerClient(args.trainer, options) as trainer:
        for step in range(args.steps):
            experiences, rewards, used = [], [], []
            for t in range(args.tasks):
                a, b = rng.randint(10, 99), rng.randint(10, 99)
                for _ in range(args.group):
                    episode = uuid.uuid4().hex
                    reply, used_tool = run_episode(api, model, f"What is {a}*{b}?", episode, args.max_turns)
                    reward = score(reply, a * b, args.partial_credit)
                    experiences += worker.finish_episode(episode, reward, group_id=f"step{step}-task{t}")
                    rewards.append(reward)
                    used.append(used_tool)
            result = trainer.train_step(experiences)
            synced = trainer.sync_weights([args.rollout])
            print(json.dumps({
                "step": step + 1, "reward_mean": sum(rewards) / len(rewards), "tool_use": sum(used) / len(used),
                "experiences": len(experiences), "policy_version": synced.policy_version, "metrics": result.metrics,
            }), flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
