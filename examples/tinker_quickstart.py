"""The quickstart (configs/quickstart.yaml) as a Tinker user writes it: the official `tinker` SDK
against `rlcore tinker serve`, on CPU, nothing downloaded.

    python examples/tinker_quickstart.py                  # starts `rlcore tinker serve` itself
    python examples/tinker_quickstart.py --base-url http://127.0.0.1:8000 --model NAME   # a running server

1. SFT on the quickstart's sloppy demonstrations (cross_entropy; the lr schedule, warm-up then
   cosine, is the client's, as in Tinker loops), full fine-tuning of the scratch Llama;
2. GRPO as a Tinker RL loop: sample 8 answers per prompt from the latest weights
   (save_weights_and_get_sampling_client), score them with rlcore's exact_match + 0.1 format, centre
   and scale the rewards within each group, forward_backward with importance_sampling on the
   sampler's log-probs (advantages divided by the batch's answer tokens: the token mean rlcore's
   own loop takes, from Tinker's sum), optim_step;
3. held-out accuracy (greedy, 200 test prompts) after each stage.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import subprocess
import sys
import tempfile
import time

import numpy as np

KEY = "tml-rlcore-quickstart"
SHAPE = {"hidden_size": 128, "num_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
         "intermediate_size": 384}  # fmt: skip


def prepare(folder: str) -> tuple[str, dict[str, list[dict]]]:
    from rlcore.core.config.schema import ScratchModelConfig
    from rlcore.core.data.synthetic import write_arithmetic_taskset
    from rlcore.core.scratch_model import build_scratch_model

    model = os.path.join(folder, "tiny-llama-char")
    build_scratch_model(model, ScratchModelConfig(enabled=True, **SHAPE), max_model_len=64, seed=42)
    sets = {
        "demos": {"part": "train", "num_tasks": 2000, "copies": 8, "wrong_fraction": 0.7},
        "train": {"part": "train", "num_tasks": 2000},
        "test": {"part": "test", "num_tasks": 200},
    }
    rows = {}
    for name, args in sets.items():
        path = os.path.join(folder, f"{name}.jsonl")
        write_arithmetic_taskset(path, max_operand=49, seed=0, **args)
        with open(path) as f:
            rows[name] = [json.loads(line) for line in f]
    return model, rows


def serve(model: str, folder: str) -> tuple[subprocess.Popen, str]:
    port_file = os.path.join(folder, "port")
    cmd = [sys.executable, "-m", "rlcore.cli", "tinker", "serve", "--base-model", f"quickstart/tiny={model}",
           "--port", "0", "--port-file", port_file, "--workdir", os.path.join(folder, "work"),
           "--max-model-len", "64", "--threads", "1"]  # fmt: skip
    proc = subprocess.Popen(cmd, env={**os.environ, "TINKER_API_KEY": KEY})
    while not os.path.exists(port_file):
        if proc.poll() is not None:
            sys.exit(f"rlcore tinker serve exited with {proc.returncode}")
        time.sleep(0.2)
    with open(port_file) as f:
        return proc, "http://" + f.read().strip()


def main() -> None:
    import tinker
    from tinker import types

    from rlcore.core.types import Task
    from rlcore.rollout.rewards.compose import build_reward

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base-url", default="", help="a running `rlcore tinker serve` (default: start one)")
    parser.add_argument("--model", default="quickstart/tiny", help="its base model name")
    parser.add_argument("--sft-steps", type=int, default=1000)
    parser.add_argument("--rl-steps", type=int, default=100)
    parser.add_argument("--out", default="", help="write the accuracies and rewards as JSON here")
    args = parser.parse_args()

    folder = tempfile.mkdtemp(prefix="rlcore-tinker-quickstart-")
    model_path, rows = prepare(folder)
    proc, url = (None, args.base_url) if args.base_url else serve(model_path, folder)
    service = tinker.ServiceClient(base_url=url, api_key=KEY)
    trainer = service.create_lora_training_client(base_model=args.model, rank=0, seed=42).result()  # rank 0: full
    tok = trainer.get_tokenizer()
    eos = tok.eos_token_id
    reward = build_reward(["exact_match", "format"], [1.0, 0.1])
    rng = random.Random(42)
    report: dict[str, list[float]] = {"accuracy": [], "reward": []}

    def encode(text: str) -> list[int]:
        return list(tok(text, add_special_tokens=False)["input_ids"])

    def accuracy(sampler) -> float:
        greedy = types.SamplingParams(max_tokens=8, temperature=0.0, stop=[eos])
        futures = [sampler.sample(types.ModelInput.from_ints(encode(r["prompt"])), 1, greedy) for r in rows["test"]]
        right = [reward(tok.decode(f.result().sequences[0].tokens, skip_special_tokens=True), Task("t", r["prompt"], r["answer"]))[1]["exact_match"] for f, r in zip(futures, rows["test"], strict=True)]  # fmt: skip
        return float(np.mean(right))

    # ---------------------------------------------------------------- SFT
    start = time.time()
    for step in range(args.sft_steps):
        batch = rng.sample(rows["demos"], 32)
        data = []
        for r in batch:
            prompt, response = encode(r["prompt"]), encode(r["response"]) + [eos]
            ids = prompt + response
            weights = [0.0] * (len(prompt) - 1) + [1.0] * len(response)
            data.append(types.Datum(model_input=types.ModelInput.from_ints(ids[:-1]),
                                    loss_fn_inputs={"target_tokens": ids[1:], "weights": weights}))  # fmt: skip
        tokens = sum(sum(d.loss_fn_inputs["weights"].tolist()) for d in data)
        for d in data:  # the token mean over the batch (Tinker sums)
            d.loss_fn_inputs["weights"] = types.TensorData.from_numpy(
                np.asarray(d.loss_fn_inputs["weights"].tolist(), dtype=np.float32) / tokens
            )
        warm = min(1.0, (step + 1) / 20)
        cosine = 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / args.sft_steps))
        fb = trainer.forward_backward(data, "cross_entropy")
        trainer.optim_step(types.AdamParams(learning_rate=1e-3 * warm * cosine, beta2=0.999, eps=1e-8, grad_clip_norm=1.0))
        if step % 200 == 0 or step == args.sft_steps - 1:
            print(f"sft step {step}: loss {fb.result().metrics['loss:sum']:.3f} ({time.time() - start:.0f} s)", flush=True)
    sampler = trainer.save_weights_and_get_sampling_client().result()
    report["accuracy"].append(accuracy(sampler))
    print(f"after SFT: held-out accuracy {report['accuracy'][-1]:.1%}", flush=True)

    # ---------------------------------------------------------------- GRPO through Tinker
    group = 8
    params = types.SamplingParams(max_tokens=8, temperature=1.0, stop=[eos])
    for step in range(args.rl_steps):
        batch = rng.sample(rows["train"], 16)
        futures = [sampler.sample(types.ModelInput.from_ints(encode(r["prompt"])), group, params) for r in batch]
        data, rewards = [], []
        for f, r in zip(futures, batch, strict=True):
            prompt = encode(r["prompt"])
            seqs = f.result().sequences
            scores = np.asarray([reward(tok.decode(s.tokens, skip_special_tokens=True), Task("t", r["prompt"], r["answer"]))[0] for s in seqs])  # fmt: skip
            rewards.extend(scores.tolist())
            adv = (scores - scores.mean()) / (scores.std() + 1e-6)
            for s, a in zip(seqs, adv, strict=True):
                ids = prompt + list(s.tokens)
                n = len(ids) - 1
                body = len(prompt) - 1
                data.append((ids, body, a, list(s.logprobs), n))
        tokens = sum(n - body for _, body, _, _, n in data)
        datums = [
            types.Datum(
                model_input=types.ModelInput.from_ints(ids[:-1]),
                loss_fn_inputs={
                    "target_tokens": ids[1:],
                    "logprobs": [0.0] * body + logprobs,
                    "advantages": [0.0] * body + [a / tokens] * (n - body),
                },
            )
            for ids, body, a, logprobs, n in data
        ]
        trainer.forward_backward(datums, "importance_sampling")
        trainer.optim_step(types.AdamParams(learning_rate=1e-4, beta2=0.999, eps=1e-8, grad_clip_norm=1.0))
        sampler = trainer.save_weights_and_get_sampling_client().result()
        report["reward"].append(float(np.mean(rewards)))
        if step % 10 == 0 or step == args.rl_steps - 1:
            print(f"rl step {step}: mean reward {report['reward'][-1]:.3f} ({time.time() - start:.0f} s)", flush=True)
    report["accuracy"].append(accuracy(sampler))
    print(f"after GRPO: held-out accuracy {report['accuracy'][-1]:.1%} (after SFT {report['accuracy'][0]:.1%}); "
          f"{(time.time() - start) / 60:.1f} min", flush=True)  # fmt: skip
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f)
    service.close("success").result()
    if proc is not None:
        proc.terminate()
        proc.wait(60)


if __name__ == "__main__":
    main()
