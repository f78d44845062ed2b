"""A LoRA GRPO launch (model.lora_configs): the HF rollout worker gets the adapter alone over the
gloo group after every step (synchronizer.lora_sync auto: the stage's first sync carries the base
too), trains exactly as a launch whose worker gets the merged weights, with a fraction of the bytes,
and the probe (the engine's greedy log-probs against the trainer's) passes after each sync; KL is taken against the adapter switched off; every checkpoint
holds the adapter and its optimizer only, plus the adapter in peft's format, and the last one the
merged model, which scores like the adapter loaded with peft. (A vLLM worker passed the same test
here; in CI vLLM loads LoRA's merged weights in test_vllm_loop.py's colocated run, which costs no
launch of its own.)"""

from __future__ import annotations

import os

import pytest

from .launch_utils import launch, read_metrics, tiny_grpo_config

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

STEPS = 3


def test_lora_grpo_syncs_the_adapter_alone_as_merged_weights_would_and_exports_the_adapter(tmp_path) -> None:
    import torch
    from peft import PeftModel
    from torch.distributed.checkpoint import FileSystemReader
    from transformers import AutoModelForCausalLM

    from rlcore.backends.common.hf_model import forward_logprobs
    from rlcore.core.batch import Sequence, pack

    root = str(tmp_path)
    cfg = tiny_grpo_config(
        root,
        **{
            "buffer.total_steps": STEPS,
            "model.lora_configs": [{"lora_rank": 4, "lora_alpha": 8}],
            "synchronizer.probe": True,
            "synchronizer.checksums": True,
            "trainer.save_interval": 1,
        },
    )
    launch(cfg, os.path.join(root, "cfg.yaml"), timeout_s=700)
    merged_cfg = {**cfg, "name": "merged", "synchronizer": {**cfg["synchronizer"], "lora_sync": "merged"}}
    launch(merged_cfg, os.path.join(root, "merged.yaml"), timeout_s=700)

    run_dir = os.path.join(root, "it", "run")
    metrics = [m for m in read_metrics(run_dir) if "actor/loss" in m]
    assert len(metrics) == STEPS
    # the adapter alone gives the engine the merged model's weights: the same rollouts, losses, probes
    merged = [m for m in read_metrics(os.path.join(root, "it", "merged")) if "actor/loss" in m]
    keys = ("rollout/reward_mean", "actor/loss", "actor/grad_norm", "sync/probe_logprob_diff")
    assert [[m[k] for k in keys] for m in metrics] == [[m[k] for k in keys] for m in merged]
    adapter_mb, merged_mb = metrics[-1]["perf/sync_mb"], merged[-1]["perf/sync_mb"]
    assert adapter_mb < merged_mb / 5, (adapter_mb, merged_mb)  # a rank-4 adapter of the tiny model
    # the probe ran after every sync (before step 1 and after each step) and passed
    assert all(m["sync/probe_logprob_diff"] < 1e-3 for m in metrics), [
        m["sync/probe_logprob_diff"] for m in metrics
    ]
    assert any(m["actor/grad_norm"] > 0 for m in metrics)
    # KL against the adapter switched off: 0 while the adapter is 0 (B starts at 0), then it moves
    assert metrics[0]["actor/kl_loss"] == pytest.approx(0.0, abs=1e-6)
    assert metrics[-1]["actor/kl_loss"] > 0, [m["actor/kl_loss"] for m in metrics]

    for step in range(1, STEPS + 1):
        ckpt = os.path.join(run_dir, f"global_step_{step}")
        saved = FileSystemReader(os.path.join(ckpt, "model")).read_metadata().state_dict_metadata
        model_keys = [k for k in saved if k.startswith("model.")]
        assert model_keys and all(".lora_" in k for k in model_keys), model_keys[:4]
        assert os.path.isfile(os.path.join(ckpt, "adapter", "adapter_model.safetensors"))
    last = os.path.join(run_dir, f"global_step_{STEPS}")
    merged = AutoModelForCausalLM.from_pretrained(os.path.join(last, "hf"), dtype=torch.float32)
    base = AutoModelForCausalLM.from_pretrained(cfg["model"]["model_path"], dtype=torch.float32)
    loaded = PeftModel.from_pretrained(base, os.path.join(last, "adapter")).eval()
    batch = pack([Sequence([5, 9, 11, 7], [12, 6, 14, 20, 8])], pad_token_id=0)
    with torch.no_grad():
        want, _ = forward_logprobs(merged, batch, 1.0, False)
        got, _ = forward_logprobs(loaded, batch, 1.0, False)
        with loaded.disable_adapter():
            untrained, _ = forward_logprobs(loaded, batch, 1.0, False)
    assert float((got - want).abs().max()) <= 1e-5
    assert float((want - untrained).abs().max()) > 1e-4  # the adapter did train
