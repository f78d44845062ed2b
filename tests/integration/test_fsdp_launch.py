"""`rlcore launch --strategy fsdp` end to end: 2 gloo ranks train, a second launch resumes from the
checkpoint, a third finds nothing left to do and says so, and the HF export loads with
`from_pretrained`."""

import os

import pytest
import torch
from safetensors.torch import load_file

from .launch_utils import launch, read_metrics, tiny_grpo_config

pytestmark = pytest.mark.integration


@pytest.mark.timeout(900)
def test_fsdp_trains_resumes_and_exports(tmp_path):
    from transformers import AutoModelForCausalLM

    root = str(tmp_path)
    cfg = tiny_grpo_config(root, **{"buffer.total_steps": 2, "cluster.ranks_per_node": 2})
    first = launch(cfg, root + ".yaml", "--strategy", "fsdp")
    assert "strategy fsdp," in first.stdout + first.stderr
    launch(cfg, root + ".yaml", "buffer.total_steps=3", "continue_from_checkpoint=true", "--strategy", "fsdp")
    again = launch(cfg, root + ".yaml", "buffer.total_steps=3", "continue_from_checkpoint=true", "--strategy", "fsdp")
    assert "rlcore: nothing to resume: every stage of the run in" in again.stdout  # and no process started
    assert "starting" not in again.stdout and "trainer rank" not in again.stdout, again.stdout

    run_dir = os.path.join(root, "it", "run")
    steps = [m["step"] for m in read_metrics(run_dir) if "actor/loss" in m]
    assert steps == [1, 2, 3]  # the second launch went on from step 2 instead of starting over
    hf_dir = os.path.join(run_dir, "global_step_3", "hf")
    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)
    exported = load_file(os.path.join(hf_dir, "model.safetensors"))
    state = model.state_dict()
    assert exported.keys() == state.keys()
    for name, tensor in exported.items():
        assert torch.equal(state[name], tensor), name
    # training moved the weights between the two checkpoints
    before = load_file(os.path.join(run_dir, "global_step_2", "hf", "model.safetensors"))
    assert any(not torch.equal(before[n], exported[n]) for n in exported)
