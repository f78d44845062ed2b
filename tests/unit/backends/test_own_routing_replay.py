"""algorithm.router_replay r2 on fsdp and fsdp2 (backends/common/native.py): the policy's old-log-prob
pass records the experts its own routers chose for each micro-batch, in the order the model takes
the tokens (padded rows, or the packed row), and forward_backward replays whatever record the
micro-batch holds: the log-probs a plain HF model gives when forced to the same experts. megatron's
r2 runs in tests/integration/test_router_replay_launch.py."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import yaml

from rlcore.backends.common.hf_model import forward_logprobs
from rlcore.core import moe_routing
from rlcore.core.batch import Sequence

TEMPERATURE = 1.0


@pytest.fixture()
def world():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def moe_model_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    from rlcore.core.config.schema import ScratchModelConfig
    from rlcore.core.scratch_model import build_scratch_model

    path = str(tmp_path_factory.mktemp("models") / "qwen3_moe")
    build_scratch_model(path, ScratchModelConfig(enabled=True, architecture="qwen3_moe"), max_model_len=256, seed=0)
    return path


def _training(model_path: str, tmp_path, strategy: str, packed: bool, trainer: dict):
    """StageTraining of a GRPO stage with router_replay r2 on the tiny Qwen3-MoE, one rank."""
    from rlcore.core.config import load_config, resolve_stages
    from rlcore.core.config.plan import filled
    from rlcore.runtime.training import StageTraining

    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"prompt": "1+1=", "answer": "2"}\n' * 4)
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump({
        "model": {"model_path": model_path, "max_prompt_tokens": 16, "max_response_tokens": 8},
        "cluster": {"device": "cpu"}, "algorithm": {"router_replay": "r2"},
        "trainer": {"strategy": strategy, "use_remove_padding": packed, **trainer},
        "buffer": {"batch_size": 2, "explorer_input": {"taskset": {"path": str(tasks)}}},
    }))  # fmt: skip
    stage = resolve_stages(load_config(str(path), []))[0]
    return StageTraining(filled(stage.config), str(tmp_path / "stage"), model_path, "cpu", 2, stage.plan.passes)


def _sequences() -> list[Sequence]:
    gen = torch.Generator().manual_seed(3)
    return [
        Sequence(torch.randint(1, 80, (p,), generator=gen).tolist(), torch.randint(1, 80, (r,), generator=gen).tolist(),
                 None, index=i)
        for i, (p, r) in enumerate([(4, 5), (7, 2), (3, 8)])
    ]  # fmt: skip


class Capture:
    """A loss that keeps the log-probs forward_backward computed."""

    needs_entropy = False

    def __init__(self) -> None:
        self.logprobs: list[torch.Tensor] = []

    def __call__(self, logprobs: torch.Tensor, entropy: torch.Tensor | None, batch: dict) -> tuple:
        self.logprobs.append(logprobs.detach())
        return (logprobs * batch["loss_mask"]).sum(), {}


@pytest.mark.parametrize("strategy", ["fsdp", "fsdp2"])
@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_r2_records_the_old_pass_routing_and_the_update_replays_it(
    strategy: str, packed: bool, moe_model_path: str, tmp_path, world
) -> None:
    from transformers import AutoModelForCausalLM

    training = _training(moe_model_path, tmp_path, strategy, packed, {})
    policy = training.strategy
    assert policy.records_routing and not policy.replays_routing
    seqs = _sequences()
    mbs, _ = training.micro(seqs)
    hf = AutoModelForCausalLM.from_pretrained(moe_model_path, dtype=torch.float32).eval()
    policy.compute_logprobs(mbs, TEMPERATURE)
    with torch.no_grad():
        for mb in mbs:  # the record: the experts the policy's own routers chose, as the HF model's do
            with moe_routing.RoutingRecorder(hf) as own:
                forward_logprobs(hf, mb, TEMPERATURE, False, packed)
            assert torch.equal(mb[moe_routing.OWN_ROUTES], own.take())
    # the update replays whatever the micro-batch holds: here other experts than the router's own
    forced = []
    for mb in mbs:
        record = mb[moe_routing.OWN_ROUTES]
        mb[moe_routing.OWN_ROUTES] = (record + 1) % 4  # another expert for every route (4 experts)
        forced.append(mb[moe_routing.OWN_ROUTES])
    capture = Capture()
    policy.forward_backward(mbs, capture, TEMPERATURE)
    differing, recorded = policy.take_routing_counts()
    # every route replayed; nearly all against the router's own choice (the update's forward, with
    # gradients, may tip a near tie the no-grad pass did not)
    assert recorded == sum(int(f.shape[0]) * f.shape[1] for f in forced) and differing >= 0.9 * recorded
    with torch.no_grad():
        for mb, record, got in zip(mbs, forced, capture.logprobs, strict=True):
            with moe_routing.replayed(hf, record, torch.ones(record.shape[0], dtype=torch.bool)):
                want, _ = forward_logprobs(hf, mb, TEMPERATURE, False, packed)
            mask = mb["loss_mask"].bool()
            assert torch.allclose(got[mask], want[mask], atol=1e-5), (got[mask] - want[mask]).abs().max()


class Nothing:
    """A policy loss of 0 that still runs the forward (the aux loss alone trains)."""

    needs_entropy = False

    def __call__(self, logprobs: torch.Tensor, entropy: torch.Tensor | None, batch: dict) -> tuple:
        return logprobs.sum() * 0.0, {}


@pytest.mark.parametrize("strategy", ["fsdp", "fsdp2"])
@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_the_router_aux_loss_adds_its_coefficient_times_its_gradient(
    strategy: str, packed: bool, moe_model_path: str, tmp_path, world
) -> None:
    """trainer.router_aux_loss_coef: forward_backward adds coef x the mean over micro-batches of
    core/moe_balance's loss (padding left out) to the policy's: with a policy loss of 0 the gradients
    are exactly coef x those of that mean on a plain HF model (the routers' and, through the hidden
    states they route, every earlier weight's)."""
    from transformers import AutoModelForCausalLM

    from rlcore.backends.common.routing import load_balance

    coef = 0.5
    training = _training(moe_model_path, tmp_path, strategy, packed, {"router_aux_loss_coef": coef})
    policy = training.strategy
    assert policy.router_aux_loss_coef == coef
    mbs, _ = training.micro(_sequences())
    metrics = policy.forward_backward(mbs, Nothing(), TEMPERATURE)
    grads = dict(policy.iter_full_grads())
    hf = AutoModelForCausalLM.from_pretrained(moe_model_path, dtype=torch.float32)
    total = 0.0
    for mb in mbs:
        with load_balance(hf, mb, packed) as balance:
            forward_logprobs(hf, mb, TEMPERATURE, False, packed)
        aux = balance.loss(len(moe_routing.routers(hf))) / len(mbs)
        (coef * aux).backward()
        total += float(aux)
    assert metrics["actor/router_aux_loss"] == pytest.approx(total, rel=1e-5)
    routers = [n for n, _ in hf.named_parameters() if n.endswith("mlp.gate.weight")]
    assert routers and all(hf.get_parameter(n).grad.any() for n in routers)
    for name, p in hf.named_parameters():  # the routers' probabilities depend on every earlier weight
        want = p.grad if p.grad is not None else torch.zeros_like(p)
        assert torch.allclose(grads[name], want, atol=1e-7, rtol=1e-5), (name, (grads[name] - want).abs().max())
