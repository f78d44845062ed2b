"""Synthetic tasksets generated locally (the quickstart needs no download)."""

from __future__ import annotations

import itertools
import json
import os
import random
from typing import Literal

FILLER = "ok so "
"""What a demonstration with filler (filler_fraction) says before its answer."""


def write_arithmetic_taskset(
    path: str,
    part: Literal["train", "test"] = "train",
    num_tasks: int = 1000,
    max_operand: int = 99,
    ops: str = "+",
    test_fraction: float = 0.2,
    seed: int = 0,
    copies: int = 1,
    wrong_fraction: float = 0.0,
    preference_pairs: bool = False,
    working_fraction: float = 0.0,
    filler_fraction: float = 0.0,
    near_misses: bool = False,
) -> None:
    """Write `num_tasks` rows like {"prompt": "37+48=", "response": "<answer>85</answer>", "answer": "85"}.

    Every problem `a op b` with 0 <= a, b <= max_operand is enumerated, shuffled with `seed` and split
    into a train and a test part by `test_fraction`; files made with the same seed and fraction
    never share a problem, so `part: test` is a true held-out set.

    Demonstrations for SFT can be made sloppy: each of the `copies` rows of a problem has, with
    probability `wrong_fraction`, a response that forgets the carry (27+15 -> 32), like a student
    who has not learnt carrying. The `answer` column always holds the true value, so a verifiable
    reward can teach past the demonstrations (this is what the quickstart's GRPO stage shows).

    `working_fraction` of the demonstrations first write the ones column's sum, then the answer
    ("7+8=15 <answer>85</answer>"): working that costs tokens and helps with the carry.
    `filler_fraction` of them open with words that say nothing ("ok so <answer>85</answer>"): a habit
    that costs as many tokens and helps with nothing (configs/length_penalty.yaml trains it away).
    Their draws share the seed's stream with the wrong answers': with a habit the answers differ
    from the same seed's without one (without any, they are what they always were).

    `preference_pairs` adds DPO's columns: `chosen` the right response, `rejected` a sloppy one (the
    carry forgotten; where there is no carry to forget, the last digit off by one). Sloppy answers
    are never too large, so "the larger answer is right" tells such pairs apart; with `near_misses`
    the rejected answer is off by 1 or 10 either way (each of the four equally likely, drawn after
    the row's other draws; upwards where downwards would go below 0), which only
    checking the sum tells apart (a reward model's pairs, configs/reward_model.yaml).
    """
    if part not in ("train", "test"):
        raise ValueError(f"part must be train or test; got '{part}'")
    unknown = set(ops) - set("+-*")
    if unknown or not ops:
        raise ValueError(f"ops must be made of + - *; got '{ops}'")
    problems = list(itertools.product(range(max_operand + 1), range(max_operand + 1), ops))
    random.Random(seed).shuffle(problems)
    n_test = int(len(problems) * test_fraction)
    pool = problems[:n_test] if part == "test" else problems[n_test:]
    if copies < 1:
        raise ValueError(f"copies must be >= 1; got {copies}")
    _check_fractions(
        ops, wrong_fraction=wrong_fraction, working_fraction=working_fraction, filler_fraction=filler_fraction
    )
    if num_tasks > len(pool):
        raise ValueError(f"num_tasks ({num_tasks}) exceeds the {len(pool)} {part} problems available")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"  # two launches of one run may write it at once
    noise = random.Random(seed + 1)
    with open(tmp, "w") as f:
        for a, b, op in pool[:num_tasks]:
            value = {"+": a + b, "-": a - b, "*": a * b}[op]
            for _ in range(copies):
                shown = _sum_without_carry(a, b) if noise.random() < wrong_fraction else value
                habits = _habits(a, b, noise, working_fraction, filler_fraction)
                row = {
                    "prompt": f"{a}{op}{b}=",
                    "response": f"{habits}<answer>{shown}</answer>",
                    "answer": str(value),
                }
                if preference_pairs:
                    sloppy = _near_miss(value, noise) if near_misses else _sloppy(a, b, op, value)
                    row["chosen"], row["rejected"] = f"<answer>{value}</answer>", f"<answer>{sloppy}</answer>"
                f.write(json.dumps(row) + "\n")
    os.replace(tmp, path)


def _sloppy(a: int, b: int, op: str, value: int) -> int:
    """The carry forgotten; where there is none to forget, the last digit off by one."""
    sloppy = _sum_without_carry(a, b) if op == "+" else value
    return sloppy if sloppy != value else value + (1 if value % 10 != 9 else -1)


def _near_miss(value: int, noise: random.Random) -> int:
    """`value` off by 1 or 10, up or down (down only while it stays >= 0)."""
    off = noise.choice((-10, -1, 1, 10))
    return value - off if value + off < 0 else value + off


def _check_fractions(ops: str, **fractions: float) -> None:
    """Each share in [0, 1]; forgotten carries and the ones column's working are sums' ('+' only)."""
    for name, value in fractions.items():
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"{name} must be in [0, 1]; got {value}")
    for name, what in (
        ("wrong_fraction", "forgotten carries"),
        ("working_fraction", "the ones column's sum written out"),
    ):
        if fractions.get(name) and ops != "+":
            raise ValueError(f"{name} ({what}) is defined for ops '+' only")


def _habits(a: int, b: int, noise: random.Random, working_fraction: float, filler_fraction: float) -> str:
    """What a demonstration of a + b writes before its answer: filler, then the ones column's sum,
    each drawn only when asked for (a seed's demonstrations without them stay the same)."""
    working = (
        f"{a % 10}+{b % 10}={a % 10 + b % 10} "
        if working_fraction and noise.random() < working_fraction
        else ""
    )
    filler = FILLER if filler_fraction and noise.random() < filler_fraction else ""
    return filler + working


def write_arithmetic_chain_taskset(
    path: str,
    part: Literal["train", "test"] = "train",
    num_tasks: int = 1000,
    steps: int = 3,
    max_operand: int = 49,
    test_fraction: float = 0.2,
    seed: int = 0,
    demos: bool = False,
    wrong_fraction: float = 0.0,
    thinking: bool = False,
) -> None:
    """Write `num_tasks` chains of `steps` additions for the `arithmetic_chain` environment: rows
    like {"prompt": "12+7=", "addends": [5, 23], "answer": "47"}. Step k adds addends[k-1] to the
    previous step's answer; every operand a step asks about stays within `max_operand` when the
    chain is answered right (the range the quickstart's model learnt), and `answer` is the chain's
    right final total. Chains are drawn with `seed`; a chain's first question decides its part, so
    `part: test` shares no first question with `part: train`.

    `demos` writes SFT demonstrations instead, one row per step of each chain: the prompt is the
    conversation so far as the environment renders it (earlier questions, answers and EOS tokens),
    the response the step's answer. With probability `wrong_fraction` an answer forgets the carry,
    and the next question builds on it, as the environment would. `thinking` writes each chain as
    one chat conversation instead ({"messages": [...], "answer": ...}: the questions as user turns,
    each answer opening with a reasoning block, `<think>\n19+5=24\n</think>\n\n<answer>24</answer>`,
    as a thinking chat template such as Qwen3's expects)."""
    if part not in ("train", "test"):
        raise ValueError(f"part must be train or test; got '{part}'")
    if steps < 1:
        raise ValueError(f"steps must be >= 1; got {steps}")
    rng = random.Random(seed)
    starts = list(itertools.product(range(max_operand // 2 + 1), repeat=2))
    rng.shuffle(starts)
    n_test = int(len(starts) * test_fraction)
    pool = starts[:n_test] if part == "test" else starts[n_test:]
    if not pool:
        raise ValueError(f"no {part} chains with max_operand {max_operand} and test_fraction {test_fraction}")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"  # two launches of one run may write it at once
    noise = random.Random(seed + 1)
    with open(tmp, "w") as f:
        for i in range(num_tasks):
            a, b = pool[i % len(pool)]
            total, addends = a + b, []
            for k in range(steps - 1):
                last = k == steps - 2  # its sum is an answer, never a later question's operand
                addends.append(rng.randint(0, max_operand if last else max_operand - total))
                total += addends[-1]
            if not demos:
                f.write(json.dumps({"prompt": f"{a}+{b}=", "addends": addends, "answer": str(total)}) + "\n")
                continue
            conversation, left, messages = "", a, []
            for addend in [b, *addends]:
                conversation += f"{left}+{addend}="
                right = left + addend
                shown = _sum_without_carry(left, addend) if noise.random() < wrong_fraction else right
                reply = f"<answer>{shown}</answer>"
                if thinking:
                    messages += [{"role": "user", "content": f"{left}+{addend}="},
                                 {"role": "assistant", "content": f"<think>\n{left}+{addend}={shown}\n</think>\n\n{reply}"}]  # fmt: skip
                else:
                    f.write(json.dumps({"prompt": conversation, "response": reply, "answer": str(right)}) + "\n")
                conversation += f"{reply}</s>"  # the EOS the model ends its turn with
                left = shown
            if thinking:
                f.write(json.dumps({"messages": messages, "answer": str(total)}) + "\n")
    os.replace(tmp, path)


def write_tool_arithmetic_taskset(
    path: str,
    part: Literal["train", "test"] = "train",
    num_tasks: int = 1000,
    low: int = 10,
    high: int = 99,
    test_fraction: float = 0.2,
    seed: int = 0,
    demos: bool = False,
    no_tool_fraction: float = 0.0,
    thinking: bool = False,
) -> None:
    """Write `num_tasks` multiplications `a*b` (low <= a, b <= high) that a tiny model cannot do
    in its head but can with the `calculator` tool: rows like {"prompt": "What is 37*46?",
    "answer": "1702"}. Problems are shuffled with `seed` and split by `test_fraction`, so
    `part: test` is held out.

    `demos` writes chat conversations for SFT instead ({"messages": [...], "answer": ...}): the
    user asks; the assistant calls the calculator (`<tool_call>{"name": "calculator", "arguments":
    {"expression": "37*46"}}</tool_call>`), the tool answers, the assistant gives
    `<answer>1702</answer>`. With probability `no_tool_fraction` the demonstration is sloppy
    instead: the assistant answers at once with a guess (the first operand rounded to tens, so
    usually wrong). `thinking` starts every assistant turn of a demonstration with a reasoning
    block (`<think>...</think>`, as a thinking chat template such as Qwen3's expects)."""
    if part not in ("train", "test"):
        raise ValueError(f"part must be train or test; got '{part}'")
    if not 0 <= low <= high:
        raise ValueError(f"need 0 <= low <= high; got low {low}, high {high}")
    if not 0.0 <= no_tool_fraction <= 1.0:
        raise ValueError(f"no_tool_fraction must be in [0, 1]; got {no_tool_fraction}")
    problems = list(itertools.product(range(low, high + 1), repeat=2))
    random.Random(seed).shuffle(problems)
    n_test = int(len(problems) * test_fraction)
    pool = problems[:n_test] if part == "test" else problems[n_test:]
    if num_tasks > len(pool):
        raise ValueError(f"num_tasks ({num_tasks}) exceeds the {len(pool)} {part} problems available")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"  # two launches of one run may write it at once
    noise = random.Random(seed + 1)
    with open(tmp, "w") as f:
        for a, b in pool[:num_tasks]:
            question, answer = f"What is {a}*{b}?", str(a * b)
            if not demos:
                f.write(json.dumps({"prompt": question, "answer": answer}) + "\n")
                continue
            messages = [{"role": "user", "content": question}]

            def think(text: str) -> str:
                return f"<think>\n{text}\n</think>\n\n" if thinking else ""

            if noise.random() < no_tool_fraction:
                guess = round(a, -1) * b
                messages.append(
                    {
                        "role": "assistant",
                        "content": f"{think('About ' + str(guess) + '.')}<answer>{guess}</answer>",
                    }
                )
            else:
                call = json.dumps({"name": "calculator", "arguments": {"expression": f"{a}*{b}"}})
                messages += [
                    {
                        "role": "assistant",
                        "content": f"{think('Use the calculator.')}<tool_call>{call}</tool_call>",
                    },
                    {"role": "tool", "content": answer},
                    {
                        "role": "assistant",
                        "content": f"{think('The tool says ' + answer + '.')}<answer>{answer}</answer>",
                    },
                ]
            f.write(json.dumps({"messages": messages, "answer": answer}) + "\n")
    os.replace(tmp, path)


def _sum_without_carry(a: int, b: int) -> int:
    """Digit-wise sum, each column mod 10: the answer of someone who forgets to carry."""
    out, place = 0, 1
    while a or b:
        out += ((a % 10 + b % 10) % 10) * place
        a, b, place = a // 10, b // 10, place * 10
    return out
