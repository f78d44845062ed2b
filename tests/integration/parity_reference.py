"""The strategy parity setup, shared by the torchrun worker (parity_worker.py) and the ground truth
computed here with a plain HF model in one process (no torch.distributed).

One fixed GRPO train batch, independent of rank and world size: 8 sequences with random token ids
(prompts 3-6 tokens, responses 2-9), sampled at two temperatures (each row scored at its own, the
batch's per-row `temperature` field), group-relative advantages of mixed sign, rollout-correction
weights on every token (IS_WEIGHT), and old log-probs of the initial model, so the first step is
on-policy (ratio 1) and later steps re-use the batch like PPO epochs (ratios move away from 1, the
loss moves, clipping engages). The loss is core's own
(`build_loss` with `LossNorm` of the whole batch) with an entropy bonus, so `needs_entropy` is True.
Each data-parallel rank trains on its share of the batch in a fixed number of micro-batches: the
reference contiguous and padded, the workers as their trainer config says (by default dealt by
token counts, grouped by length, and packed: trainer.balance_batch, trainer.use_remove_padding).

The DPO run (`dpo_reference_run`, the worker's --dpo) reads the batch as 4 (chosen, rejected)
pairs, sequences 2k and 2k + 1, scored at temperature 1 against a reference model that starts as
the policy, so the first step's loss is log 2 and the later ones move; the workers train through
the trainer's own path (StageTraining.train_sequences with loss dpo).

The critic's run (`critic=True`) trains a value model (the same trunk, a seeded scalar head) on the
same batches with PPO's clipped value loss: the old values are what the untrained critic itself
scores (`compute_values`), the targets are the batch's per-token advantages.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch
from omegaconf import OmegaConf

from rlcore.backends.common.hf_model import (
    forward_logprobs,
    forward_values,
    load_causal_lm,
    load_value_model,
    value_head_init,
)
from rlcore.backends.common.routing import replay_routing
from rlcore.backends.common.schedule import build_optimizer
from rlcore.core import moe_routing
from rlcore.core.algorithms.aggregation import LossNorm
from rlcore.core.algorithms.correction import IS_WEIGHT
from rlcore.core.algorithms.grpo import grpo_advantages
from rlcore.core.algorithms.losses import PolicyLoss, SFTLoss, build_loss
from rlcore.core.algorithms.ppo import ValueLoss
from rlcore.core.algorithms.scored import ScoredBatch
from rlcore.core.batch import Batch, Sequence, deal, equalize, micro_batches, pack, plan_micro_batches, shard
from rlcore.core.config.schema import (
    AlgorithmConfig,
    DpoConfig,
    OptimizerConfig,
    RewardModelConfig,
    TrainerConfig,
)
from rlcore.core.types import routing_tokens

SEED = 1234
PAD_ID = 0  # pads batches; also placed once inside a response (see parity_sequences)
FIRST_ID = 4
NUM_SEQS = 8
GROUP_SIZE = 4
MICRO_BATCHES = 2
"""Micro-batches per rank (per step): gradient accumulation is always exercised."""
TEMPERATURE = 0.8
"""Not 1, so a strategy that forgets to scale the logits fails the check."""
TEMPERATURES = (TEMPERATURE, 1.25)
"""The rows' own sampling temperatures (the batch's `temperature` field), alternating."""
CLIPRANGE_VALUE = 0.5
"""The critic's values leave this range around the old ones within a few steps: the clip engages
(the value loss then levels off near 0.79, from 1.26)."""


def algorithm_config() -> AlgorithmConfig:
    """GRPO with an entropy bonus and no KL term (so no reference model), lr warm-up + cosine decay.

    The clip range is wide on purpose: with the usual 0.2 every token of the re-used batch is clipped
    after 2-3 steps and the loss curve goes flat; with [0.1, 11] and lr 1e-3 the tiny model's loss
    falls for ~15 of 20 steps (-0.65 to -5.2) before clipping stops it.
    """
    optimizer = OptimizerConfig(
        lr=1e-3, lr_warmup_steps=2, lr_scheduler_type="cosine", min_lr_ratio=0.1, weight_decay=0.01
    )
    return AlgorithmConfig(
        algorithm_type="grpo",
        optimizer=optimizer,
        kl_loss_fn="none",
        kl_loss_coef=0.0,
        entropy_coef=0.1,
        clip_ratio_low=0.9,
        clip_ratio_high=10.0,
    )


def trainer_config(sets: list[str]) -> TrainerConfig:
    """The default TrainerConfig with `dotted.key=value` overrides (keys relative to `trainer`)."""
    base = OmegaConf.structured(TrainerConfig)
    merged = OmegaConf.merge(base, OmegaConf.from_dotlist(sets))
    cfg = OmegaConf.to_object(merged)
    assert isinstance(cfg, TrainerConfig)
    return cfg


@torch.no_grad()
def parity_sequences(model_path: str, routed: bool = False) -> list[Sequence]:
    """The train batch; old log-probs come from the initial model in float32 on the CPU. `routed`
    (an MoE model): each sequence carries a routing record (random experts, as an engine's would
    be: routing replay), which the old log-probs replay too."""
    model = load_causal_lm(model_path)
    vocab = model.config.vocab_size
    gen = torch.Generator().manual_seed(SEED)
    shapes = [
        (int(torch.randint(3, 7, (), generator=gen)), int(torch.randint(2, 10, (), generator=gen)))
        for _ in range(NUM_SEQS)
    ]
    ids = [torch.randint(FIRST_ID, vocab, (p + r,), generator=gen).tolist() for p, r in shapes]
    # A sampled response may contain the pad token itself: HF never trains its embedding row
    # (padding_idx), and every strategy must agree with that.
    ids[0][shapes[0][0]] = PAD_ID
    # rows sampled at two temperatures, as a mixture's are (each row scored at its own; not 1, so a
    # strategy that ignores the per-row field fails the check)
    seqs = [
        Sequence(x[:p], x[p:], index=i, temperature=TEMPERATURES[i % 2])
        for i, (x, (p, _)) in enumerate(zip(ids, shapes, strict=True))
    ]
    if routed:
        for s in seqs:
            s.routed_experts = _random_record(model, routing_tokens(len(s.prompt_ids), len(s.response_ids)), gen)
    rewards = torch.rand(NUM_SEQS, generator=gen)
    groups = [str(i // GROUP_SIZE) for i in range(NUM_SEQS)]
    adv = grpo_advantages(ScoredBatch(rewards, groups))
    assert (adv > 0).any() and (adv < 0).any(), "advantages of one sign only"
    batch = pack(seqs, PAD_ID)
    with replay_routing(model, batch, False, None):
        logprobs, _ = forward_logprobs(model, batch, TEMPERATURE, with_entropy=False)
    for s, a, lp in zip(seqs, adv.tolist(), logprobs, strict=True):
        s.advantage = a
        s.old_logprobs = lp[len(s.prompt_ids) : s.length].tolist()
    return seqs


@torch.no_grad()
def own_routing(model_path: str, seqs: list[Sequence]) -> list[Sequence]:
    """`seqs` with the routing records transformers' own routers give them (what the HF engine in
    the same dtype records): a strategy replaying them would have chosen every one itself."""
    model = load_causal_lm(model_path)
    out = []
    for s in seqs:
        with moe_routing.RoutingRecorder(model) as recorder:
            model(input_ids=torch.tensor([s.prompt_ids + s.response_ids]), use_cache=False)
        record = recorder.take()[: routing_tokens(len(s.prompt_ids), len(s.response_ids))]
        out.append(dataclasses.replace(s, routed_experts=moe_routing.to_bytes(record)))
    return out


def _random_record(model: torch.nn.Module, tokens: int, gen: torch.Generator) -> bytes:
    """A routing record forcing random experts (top_k distinct ones per token and layer)."""
    layers, top_k = moe_routing.shape_of(model)
    experts = model.config.num_experts
    picks = [torch.randperm(experts, generator=gen)[:top_k] for _ in range(tokens * layers)]
    return moe_routing.to_bytes(torch.stack(picks).view(tokens, layers, top_k))


def _norm(seqs: list[Sequence]) -> LossNorm:
    return LossNorm(
        num_tokens=float(sum(len(s.response_ids) for s in seqs)),
        num_seqs=float(len(seqs)),
        max_response_len=max(len(s.response_ids) for s in seqs),
    )


def parity_loss(seqs: list[Sequence], critic: bool = False) -> PolicyLoss | SFTLoss | ValueLoss:
    """core's loss for the whole batch: every micro-batch's loss is its share of the batch loss."""
    if critic:
        return ValueLoss(CLIPRANGE_VALUE, _norm(seqs))
    loss = build_loss(algorithm_config(), _norm(seqs))
    assert loss.needs_entropy
    return loss


DPO_BETA = 0.5

LOSS_METRIC = {False: "actor/loss", True: "critic/vf_loss"}
"""The metric holding each run's loss (by `critic`)."""


def with_value_targets(mbs: list[Batch], values: list[torch.Tensor]) -> None:
    """The critic's batch: its own untrained `values` as the old ones, the advantages as targets."""
    for mb, v in zip(mbs, values, strict=True):
        mb["values"], mb["returns"] = v.float().cpu(), mb["advantages"].clone()


def _rank_groups(
    seqs: list[Sequence], dp_rank: int, dp_size: int, max_tokens: int, balance: bool, packed: bool
) -> list[list[Sequence]]:
    """This rank's micro-batch groups as StageTraining.micro plans them (trainer.balance_batch:
    dealt by token counts and grouped by length; else contiguous)."""
    mine = deal(seqs, dp_size)[dp_rank] if balance else shard(seqs, dp_rank, dp_size)
    return plan_micro_batches(mine, max_tokens, packed=packed, by_length=balance)


def rank_micro_batches(
    seqs: list[Sequence], dp_rank: int, dp_size: int, max_tokens: int, count: int,
    balance: bool = False, packed: bool = False,
) -> list[Batch]:  # fmt: skip
    """This rank's share packed into `count` micro-batches (StageTraining.micro with the count
    already agreed on by all ranks)."""
    groups = equalize(_rank_groups(seqs, dp_rank, dp_size, max_tokens, balance, packed), count)
    mbs = micro_batches(groups, PAD_ID, template=seqs[0])
    for mb in mbs:  # rollout correction's weights, a function of each token's position: 0.5, 1, 1.5
        positions = torch.arange(mb["loss_mask"].shape[1], dtype=torch.float32).remainder(3)
        mb[IS_WEIGHT] = mb["loss_mask"] * (0.5 + 0.5 * positions)
    return mbs


def micro_batch_count(
    seqs: list[Sequence],
    dp_rank: int,
    dp_size: int,
    max_tokens: int,
    balance: bool = False,
    packed: bool = False,
) -> int:
    """This rank's wish: at least MICRO_BATCHES (the ranks then agree on the maximum)."""
    return max(MICRO_BATCHES, len(_rank_groups(seqs, dp_rank, dp_size, max_tokens, balance, packed)))


def param_grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Gradients by state-dict name (a tied lm_head.weight included), in state-dict order; of a peft
    model, the adapter's by the names peft saves them with."""
    params = dict(model.named_parameters(remove_duplicate=False))
    out = {}
    if hasattr(model, "peft_config"):  # saved without the adapter's name ("default")
        trained = [n for n in model.state_dict() if n in params and params[n].requires_grad]
        return {n.replace(".default.", "."): params[n].grad.detach().clone() for n in trained}
    for name in model.state_dict():
        if name in params:
            grad = params[name].grad
            out[name] = torch.zeros_like(params[name]) if grad is None else grad.detach().clone()
    return out


def reference_run(
    model_path: str, steps: int, total_steps: int, critic: bool = False, lora: str | None = None,
    frozen: str | None = None, routed: bool = False,
) -> tuple[list[float], dict[str, torch.Tensor], dict[str, torch.Tensor]]:  # fmt: skip
    """(loss per step, gradients of the first step by HF name, final weights by HF name) of a plain
    HF model (a value model with `critic`) trained on the whole batch in this process: the ground truth.
    `lora`: a plain peft model training that adapter folder (gradients by peft's saved names, the
    weights merged by peft). `frozen`: the parameters whose names end with it are not trained.
    `routed`: the batch's routing records (parity_sequences) forced on transformers' routers."""
    torch.manual_seed(SEED)
    trainer_cfg = trainer_config([])
    model = load_value_model(model_path, SEED) if critic else load_causal_lm(model_path)
    for name, p in model.named_parameters():
        if frozen is not None and name.endswith(frozen):
            p.requires_grad_(False)
    if lora is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, lora, is_trainable=True)
    seqs = parity_sequences(model_path, routed)
    loss_fn = parity_loss(seqs, critic)
    count = micro_batch_count(seqs, 0, 1, trainer_cfg.max_token_len_per_gpu)
    mbs = rank_micro_batches(seqs, 0, 1, trainer_cfg.max_token_len_per_gpu, count)
    if critic:
        with torch.no_grad():
            with_value_targets(mbs, [forward_values(model, mb) for mb in mbs])

    def backward() -> float:
        total = 0.0
        for mb in mbs:
            with replay_routing(model, mb, False, None):  # the records, when the batch has them
                if critic:
                    outputs, entropy = forward_values(model, mb), None
                else:
                    outputs, entropy = forward_logprobs(model, mb, TEMPERATURE, loss_fn.needs_entropy)
                loss, metrics = loss_fn(outputs, entropy, mb)
                loss.backward()
            total += metrics[LOSS_METRIC[critic]]
        return total

    return _train(model, backward, steps, total_steps)


def _train(
    model: torch.nn.Module, backward: Callable[[], float], steps: int, total_steps: int
) -> tuple[list[float], dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """`steps` optimizer steps of `model` on the gradients `backward()` accumulates (it returns
    the step's loss): (losses, first-step gradients, final weights)."""
    trained = [p for p in model.parameters() if p.requires_grad]  # LoRA: the adapter only
    optimizer, scheduler = build_optimizer(trained, algorithm_config().optimizer, total_steps)
    grad_clip = trainer_config([]).grad_clip
    losses: list[float] = []
    first_grads: dict[str, torch.Tensor] = {}
    model.train()
    for step in range(steps):
        losses.append(backward())
        if step == 0:
            first_grads = param_grads(model)
        torch.nn.utils.clip_grad_norm_(trained, grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        scheduler.step()
    if hasattr(model, "merge_and_unload"):  # a peft model: its merged weights, as HF names them
        model = model.merge_and_unload()
    weights = {n: t.detach().clone() for n, t in model.state_dict().items()}
    return losses, first_grads, weights


def dpo_algorithm_config() -> AlgorithmConfig:
    return dataclasses.replace(algorithm_config(), algorithm_type="dpo", dpo=DpoConfig(beta=DPO_BETA))


def dpo_reference_run(
    model_path: str, steps: int, total_steps: int
) -> tuple[list[float], dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """(DPO loss per step, first-step gradients, final weights) of a plain HF policy and reference
    in this process, the pair loss differentiated by autograd: the ground truth of --dpo."""
    torch.manual_seed(SEED)
    model, reference = load_causal_lm(model_path), load_causal_lm(model_path)
    # pairs scored at temperature 1, as train_sequences scores them (no per-row temperatures)
    seqs = [dataclasses.replace(s, temperature=None) for s in parity_sequences(model_path)]
    batch = pack(seqs, PAD_ID)
    with torch.no_grad():
        ref_sums = _response_sums(reference, batch, seqs)

    def backward() -> float:
        delta = _response_sums(model, batch, seqs) - ref_sums
        z = DPO_BETA * (delta[0::2] - delta[1::2])
        loss = -torch.nn.functional.logsigmoid(z).mean()
        loss.backward()
        return float(loss)

    return _train(model, backward, steps, total_steps)


RM_MARGINS = (0.0, 0.5, 0.25, 0.0)
"""Each pair's margin in the reward model's run (the chosen sequence's one advantage)."""
RM_CENTER = 0.05
"""The reward model's centring coefficient (algorithm.reward_model.center_coef) in its run."""


def reward_model_algorithm_config() -> AlgorithmConfig:
    return dataclasses.replace(
        algorithm_config(), algorithm_type="reward_model", reward_model=RewardModelConfig(center_coef=RM_CENTER)
    )


def plain_reward_model(model_path: str) -> torch.nn.Module:
    """The tiny model's trunk as transformers' own AutoModelForSequenceClassification (one label,
    padding at PAD_ID), its head set to the one rlcore's reward model starts from (value_head_init
    at SEED): the ground truth's model."""
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(
        model_path, num_labels=1, pad_token_id=PAD_ID, dtype=torch.float32
    )
    with torch.no_grad():
        model.score.weight.copy_(value_head_init(model.config.hidden_size, SEED)[0])
    return model


def plain_scores(model: torch.nn.Module, seqs: list[Sequence]) -> torch.Tensor:
    """[N] transformers' own scores of the sequences (right-padded, with an attention mask; it
    reads each row at its last token that is not the pad token)."""
    width = max(s.length for s in seqs)
    ids = torch.full((len(seqs), width), PAD_ID, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, s in enumerate(seqs):
        ids[i, : s.length] = torch.tensor(s.prompt_ids + s.response_ids)
        mask[i, : s.length] = 1
    return model(input_ids=ids, attention_mask=mask).logits[:, 0].double()


def reward_model_reference_run(
    model_path: str, steps: int, total_steps: int
) -> tuple[list[float], dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """(loss per step, first-step gradients, final weights) of transformers' sequence classifier on
    the batch's 4 (chosen, rejected) pairs, the Bradley-Terry loss with RM_MARGINS and RM_CENTER
    differentiated by autograd: the ground truth of --reward-model."""
    torch.manual_seed(SEED)
    model = plain_reward_model(model_path)
    seqs = parity_sequences(model_path)
    margins = torch.tensor(RM_MARGINS, dtype=torch.float64)

    def backward() -> float:
        r = plain_scores(model, seqs)
        chosen, rejected = r[0::2], r[1::2]
        loss = -torch.nn.functional.logsigmoid(chosen - rejected - margins).mean()
        loss = loss + RM_CENTER * (chosen + rejected).square().mean()
        loss.backward()
        return float(loss.detach())

    return _train(model, backward, steps, total_steps)


def _response_sums(model: torch.nn.Module, batch: Batch, seqs: list[Sequence]) -> torch.Tensor:
    """[N] each sequence's summed response log-probs at temperature 1 (float64)."""
    logprobs, _ = forward_logprobs(model, batch, 1.0, with_entropy=False)
    return torch.stack([logprobs[i, len(s.prompt_ids) : s.length].double().sum() for i, s in enumerate(seqs)])
