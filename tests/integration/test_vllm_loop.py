"""A GRPO run whose rollouts come from a vLLM engine in a separate rollout-worker process, weights
synced after every step over a gloo group (checksums and the log-prob probe on).

While the run trains, this process keeps asking the worker for greedy decodes of fixed prompts;
every answer carries the policy version that produced it. Afterwards each version's greedy tokens
are compared with HF `generate` on the HF export of the trainer step that version came from.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

import pytest

from rlcore.client import ClientOptions, RolloutClient
from rlcore.core.types import SamplingParams

from .launch_utils import REPO, heldout_taskset, launch, read_metrics, tiny_grpo_config, wait_for_port_file
from .vllm_support import require_vllm

require_vllm()

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

TOKEN_ENV = "RLCORE_IT_VLLM_TOKEN"
STEPS = 3
PROMPTS = ["3+4=", "12+9=", "7+7="]


def test_grpo_with_a_vllm_worker_synced_every_step_decodes_like_hf_with_the_trainers_weights(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlcore.core.config.schema import ScratchModelConfig
    from rlcore.core.scratch_model import build_scratch_model

    root = str(tmp_path)
    cfg = tiny_grpo_config(
        root,
        **{
            "buffer.total_steps": STEPS,
            "explorer.rollout_model.engine_type": "vllm",
            "explorer.rollout_model.max_batch_size": 16,
            "synchronizer.sync_interval": 1,
            "synchronizer.checksums": True,
            "synchronizer.probe": True,
            "synchronizer.max_staleness": 0,
            "trainer.save_interval": 1,
            "trainer.save_hf_checkpoint": "always",
        },
    )
    scratch = cfg["model"]["scratch"]
    model_path = cfg["model"]["model_path"]
    build_scratch_model(
        model_path,
        ScratchModelConfig(**scratch),
        max_model_len=cfg["model"]["max_model_len"],
        seed=7,
    )
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    prompts = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in PROMPTS]
    greedy = SamplingParams(temperature=0.0, max_tokens=8)

    monkeypatch.setenv(TOKEN_ENV, "vllm-loop-secret")  # the worker and the launch read it
    env = dict(os.environ)
    port_file, log_file = os.path.join(root, "worker.address"), os.path.join(root, "worker.log")
    with open(log_file, "w") as log:
        worker = subprocess.Popen(
            [sys.executable, "-m", "rlcore.cli", "rollout", "serve", "--model", model_path, "--engine", "vllm",
             "--max-model-len", str(cfg["model"]["max_model_len"]), "--max-batch-size", "16", "--threads", "1",
             "--token-env", TOKEN_ENV, "--port", "0", "--port-file", port_file],
            cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        address = wait_for_port_file(port_file, worker, "the vLLM rollout worker", 300, log_file)
        client = RolloutClient(address, ClientOptions(token="vllm-loop-secret", timeout=120))
        assert client.get_info().engine == "vllm" and client.get_info().weight_sync_ranks == 1

        seen: dict[int, list[list[int]]] = {}  # worker version -> greedy tokens per prompt
        stop = threading.Event()

        def observe() -> None:
            # Decode only when the served version changes (GetInfo costs the engine nothing): a
            # worker kept generating non-stop starves the trainer of this machine's two cores.
            last = -1
            while not stop.is_set():
                try:
                    if client.get_info().policy_version == last:
                        stop.wait(0.05)
                        continue
                    result = client.generate(prompts, greedy)
                except Exception:  # paused for a weight update: ask again
                    stop.wait(0.2)
                    continue
                last = result.policy_version
                seen.setdefault(last, [c[0].token_ids for c in result.completions])

        observer = threading.Thread(target=observe, daemon=True)
        observer.start()
        cfg["explorer"]["rollout_model"]["endpoints"] = [address]
        cfg["control"] = {"token_env": TOKEN_ENV}
        launch(cfg, os.path.join(root, "cfg.yaml"), timeout_s=700)
        stop.set()
        observer.join(60)
        final = client.generate(prompts, greedy)
        seen.setdefault(final.policy_version, [c[0].token_ids for c in final.completions])
        client.close()
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(60)

    # The worker served version 0 (its own load), then base + step for each sync: base = 1 here,
    # and the run syncs before step 1 (version 1 = the untrained weights) and after every step.
    run_dir = os.path.join(root, "it", "run")
    stage_dir = (
        os.path.join(run_dir, "checkpoints")
        if os.path.isdir(os.path.join(run_dir, "checkpoints"))
        else run_dir
    )
    metrics = [m for m in read_metrics(run_dir) if "actor/loss" in m]
    assert len(metrics) == STEPS
    assert all(m["sync/probe_logprob_diff"] < 1e-3 for m in metrics), [
        m["sync/probe_logprob_diff"] for m in metrics
    ]
    assert all(m["rollout/stale_dropped"] == 0 for m in metrics)
    assert max(seen) == 1 + STEPS, sorted(seen)
    compared = 0
    for version, tokens in sorted(seen.items()):
        if version == 0:
            continue
        step = version - 1
        weights = model_path if step == 0 else _hf_export(stage_dir, step)
        model = AutoModelForCausalLM.from_pretrained(weights)
        for ids, got in zip(prompts, tokens, strict=True):
            out = model.generate(torch.tensor([ids]), max_new_tokens=8, do_sample=False, eos_token_id=tokenizer.eos_token_id,
                                 pad_token_id=tokenizer.pad_token_id)  # fmt: skip
            expected = out[0, len(ids) :].tolist()
            if tokenizer.eos_token_id in expected:
                expected = expected[: expected.index(tokenizer.eos_token_id) + 1]
            assert got == expected, f"version {version} (step {step}): vLLM {got} != HF {expected}"
        compared += 1
    assert compared >= 2, sorted(seen)  # at least two synced versions were caught and checked


def _hf_export(stage_dir: str, step: int) -> str:
    for dirpath, dirnames, _ in os.walk(stage_dir):
        if os.path.basename(dirpath) == f"global_step_{step}" and "hf" in dirnames:
            return os.path.join(dirpath, "hf")
    raise AssertionError(f"no HF export of step {step} under {stage_dir}")


def test_colocated_vllm_engine_loads_in_process_and_passes_the_probe_every_step(tmp_path) -> None:
    """mode colocate: vLLM inside trainer rank 0, weights handed over by reference each step; the
    policy is a LoRA adapter (model.lora_configs), so what vLLM loads is the merged weights
    (test_lora_launch.py sends them to an HF engine over the group)."""
    root = str(tmp_path)
    cfg = tiny_grpo_config(
        root,
        **{"mode": "colocate", "explorer.rollout_model.engine_type": "vllm", "synchronizer.probe": True,
           "model.lora_configs": [{"lora_rank": 4, "lora_alpha": 8}]},
    )  # fmt: skip
    proc = launch(cfg, os.path.join(root, "cfg.yaml"), timeout_s=600)
    metrics = [m for m in read_metrics(os.path.join(root, "it", "run")) if "actor/loss" in m]
    assert len(metrics) == cfg["buffer"]["total_steps"]
    assert all(m["sync/probe_logprob_diff"] < 1e-3 for m in metrics), metrics
    assert metrics[-1]["actor/kl_loss"] > 0  # the adapter moved the policy off the base
    _assert_clean_exit(proc.stdout + proc.stderr + proc.trainer_log)


def _assert_clean_exit(output: str) -> None:
    """The in-process engine must not tear down at exit (after the trainer's groups are gone), nor
    leave frozen objects for extension modules to report."""
    for bad in ("Traceback", "nanobind: leaked"):
        assert bad not in output, output[-4000:]


def _two_ranks_with_vllm_inside(root: str) -> dict:
    """mode colocate on 2 trainer ranks with a vLLM engine in each, the probe on, and a held-out
    evaluation (rank 0's engine)."""
    cfg = tiny_grpo_config(
        root,
        **{
            "mode": "colocate",
            "cluster.ranks_per_node": 2,
            "explorer.rollout_model.engine_type": "vllm",
            "explorer.rollout_model.engine_num": 2,
            "synchronizer.probe": True,
        },
    )
    cfg["buffer"]["explorer_input"]["eval_tasksets"] = [heldout_taskset(root, num_tasks=6)]
    return cfg


def test_colocated_vllm_in_every_rank_generates_a_share_and_each_engine_passes_the_probe(tmp_path) -> None:
    """mode colocate, 2 trainer ranks, engine_num 2: a vLLM engine inside each rank (vLLM's external
    launcher over the trainer's gloo world). Each rank generates its half of every batch, every
    sync loads both engines, and both engines' greedy log-probs must match the trainer's."""
    root = str(tmp_path)
    cfg = _two_ranks_with_vllm_inside(root)
    proc = launch(cfg, os.path.join(root, "cfg.yaml"), timeout_s=800)
    _assert_clean_exit(proc.stdout + proc.stderr + proc.trainer_log)
    rows = read_metrics(os.path.join(root, "it", "run"))
    steps = [m for m in rows if "actor/loss" in m]
    assert len(steps) == cfg["buffer"]["total_steps"]
    assert [m["rollout/engines"] for m in steps] == [2.0, 2.0]  # both ranks generated every step
    assert all(m["sync/probe_engines"] == 2.0 for m in steps), steps
    assert all(m["sync/probe_logprob_diff"] < 1e-3 for m in steps), [
        m["sync/probe_logprob_diff"] for m in steps
    ]
    assert all(m["rollout/staleness_mean"] == 0.0 for m in steps)
    assert any("eval/heldout/accuracy" in m for m in rows)  # rank 0's engine evaluates alone


def test_colocated_vllm_engines_serve_every_stage_and_take_each_stages_weights_first(tmp_path) -> None:
    """Four stages on 2 trainer ranks, with a vLLM engine in each rank: SFT evaluating with the
    engines, GRPO, SFT without evaluation, GRPO. The engines are built once (vLLM cannot be torn
    down under the trainer) and each later stage pushes its weights into them before use. The last
    stage's first rollout thus comes from the quiet SFT stage's final weights: the engines' log-probs
    equal the trainer's (with the previous GRPO stage's weights still loaded they differed by 0.14
    on average when measured)."""
    root = str(tmp_path)
    cfg = _two_ranks_with_vllm_inside(root)
    sft = {"mode": "train", "algorithm": {"algorithm_type": "sft"}}
    cfg["stages"] = [
        {"name": "sft_eval", **sft, "buffer": {"batch_size": 8, "total_steps": 2}},
        {"name": "rl1", "buffer": {"total_steps": 2}},
        {
            "name": "sft_quiet",
            **sft,
            "buffer": {"batch_size": 8, "total_steps": 2, "explorer_input": {"eval_tasksets": []}},
        },
        {"name": "rl2", "buffer": {"total_steps": 2}},
    ]
    proc = launch(cfg, os.path.join(root, "cfg.yaml"), timeout_s=800)
    output = proc.stdout + proc.stderr + proc.trainer_log
    _assert_clean_exit(output)
    # rank 0 logs it (rank 1 logs warnings only): rl1 and rl2 took over the engine sft_eval built
    assert output.count("reusing the in-process vllm engine an earlier stage built") == 2, output[-4000:]
    assert "after stage 0 sft_eval (step 2): heldout/accuracy" in proc.stdout  # rank 0's engine evaluated

    run_dir = os.path.join(root, "it", "run")
    for stage in ("stage1_rl1", "stage3_rl2"):
        steps = [m for m in read_metrics(os.path.join(run_dir, stage)) if "actor/loss" in m]
        assert [m["rollout/engines"] for m in steps] == [2.0, 2.0]
        assert all(m["sync/probe_engines"] == 2.0 and m["sync/probe_logprob_diff"] < 1e-3 for m in steps)
        assert all(m["rollout/logprob_diff_mean"] < 1e-4 for m in steps), [
            m["rollout/logprob_diff_mean"] for m in steps
        ]
