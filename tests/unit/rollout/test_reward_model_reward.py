"""The `reward_model` reward (rollout/rewards/reward_model.py): a sequence classifier's scores of
(prompt, response), as transformers computes them, in batches of any size; its settings checked in
one line naming the key; a stage named for its path resolved to that stage's export."""

from __future__ import annotations

import math

import pytest
import torch

from rlcore.core.data.prompts import PromptFormat
from rlcore.rollout.rewards.compose import build_reward
from rlcore.rollout.rewards.reward_model import RewardModelScorer, check_reward_model


@pytest.fixture(scope="module")
def classifier(tiny_model_path, tmp_path_factory) -> str:
    """The tiny model's trunk as a one-label sequence classifier, with a random head, saved."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_pretrained(tiny_model_path, num_labels=1)
    torch.nn.init.normal_(model.score.weight, std=1.0)
    folder = str(tmp_path_factory.mktemp("rm"))
    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(tiny_model_path).save_pretrained(folder)
    return folder


def _settings(path: str, **kw) -> dict:
    return {"path": path, "normalize": "none", "batch_size": 32, **kw}


def test_scores_are_transformers_own_in_any_batch_size(classifier):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    prompts, completions = ["1+1=", "12+30=", "7+8="], ["<answer>2</answer>", "<answer>42</answer>", "15"]
    fmt = PromptFormat(16)
    got = RewardModelScorer(_settings(classifier), fmt)(prompts, completions, ["a", "b", "c"])
    model, tok = AutoModelForSequenceClassification.from_pretrained(classifier), AutoTokenizer.from_pretrained(classifier)
    want = []
    with torch.no_grad():
        for p, c in zip(prompts, completions, strict=True):
            ids = fmt.encode_prompt(tok, p) + tok(c, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
            want.append(float(model(input_ids=torch.tensor([ids])).logits[0, 0]))
    assert got == pytest.approx(want, abs=1e-5)
    assert len(set(round(v, 4) for v in want)) == 3  # the head tells them apart
    one_by_one = RewardModelScorer(_settings(classifier, batch_size=1), fmt)(prompts, completions, ["a", "b", "c"])
    assert one_by_one == pytest.approx(got, abs=1e-5)
    sigmoid = RewardModelScorer(_settings(classifier, normalize="sigmoid"), fmt)(prompts, completions, ["a", "b", "c"])
    assert sigmoid == pytest.approx([1 / (1 + math.exp(-v)) for v in got], abs=1e-6)


def test_it_is_a_batch_reward_of_the_composer(classifier):
    from rlcore.core.types import Task

    scorer = RewardModelScorer(_settings(classifier), PromptFormat(16))
    composer = build_reward(["reward_model", "format"], [1.0, 0.5], reward_model=scorer)
    (total, parts), = composer.score_batch(["<answer>2</answer>"], [Task("t", "1+1=", answer="2")])
    assert parts["format"] == 1.0 and total == pytest.approx(parts["reward_model"] + 0.5)
    with pytest.raises(ValueError, match=r"reward_fn 'reward_model' scores with a reward model: set the taskset's reward_model\.path"):
        build_reward(["reward_model"])


def test_bad_settings_are_one_line_naming_the_key(tmp_path, classifier):
    with pytest.raises(ValueError, match=r"^reward_model\.path: give the reward model's folder"):
        check_reward_model(_settings(None))
    with pytest.raises(ValueError, match=r"^reward_model\.path: '.*' is not a model folder \(no config\.json there\)"):
        check_reward_model(_settings(str(tmp_path)))
    check_reward_model(_settings("stage:rm"))  # the run writes it
    with pytest.raises(ValueError, match=r"^reward_model\.normalize must be one of none, sigmoid; got 'tanh'"):
        check_reward_model(_settings(classifier, normalize="tanh"))
    with pytest.raises(ValueError, match=r"^reward_model\.batch_size must be an integer >= 1; got 0"):
        check_reward_model(_settings(classifier, batch_size=0))
    with pytest.raises(ValueError, match=r"^reward_model\.path: 'stage:rm' names a stage"):
        RewardModelScorer(_settings("stage:rm"), PromptFormat(16))
    served = {"path": None, "address": "127.0.0.1:9", "token_env": "RM_TOKEN", "timeout_s": 60.0}
    check_reward_model(_settings(**served))
    with pytest.raises(ValueError, match=r"^reward_model: give path .* or address .*, not both"):
        check_reward_model(_settings(**{**served, "path": classifier}))
    with pytest.raises(ValueError, match=r"^reward_model\.address: give the server's host:port; got 'localhost'"):
        check_reward_model(_settings(**{**served, "address": "localhost"}))
    with pytest.raises(ValueError, match=r"^reward_model\.token_env: name the variable"):
        check_reward_model(_settings(**{**served, "token_env": ""}))
    with pytest.raises(ValueError, match=r"^reward_model\.timeout_s must be a number > 0; got 0"):
        check_reward_model(_settings(**{**served, "timeout_s": 0}))
    with pytest.raises(ValueError, match=r"^reward_model: unknown key\(s\) url; allowed: path, address"):
        check_reward_model(_settings(classifier, url="x"))


def test_tls_settings_go_with_an_address_and_name_what_is_wrong(tmp_path, classifier, monkeypatch):
    from rlcore.rollout.rewards.reward_model import served_tls

    tls = {"ca_file": None, "cert_file": None, "key_file": None, "server_name": None}
    served = {"path": None, "address": "127.0.0.1:9", "token_env": "RM_TOKEN", "timeout_s": 60.0, "tls": tls}
    check_reward_model(_settings(**served))
    with pytest.raises(ValueError, match=r"^reward_model\.tls: applies with address"):
        check_reward_model(_settings(classifier, tls=tls))
    with pytest.raises(ValueError, match=r"^reward_model\.tls: cert_file and key_file go together"):
        check_reward_model(_settings(**{**served, "tls": {**tls, "cert_file": "c.pem"}}))
    missing = str(tmp_path / "ca.pem")
    with pytest.raises(ValueError, match=rf"^reward_model\.tls\.ca_file: {missing} cannot be read here"):
        served_tls({**served, "tls": {**tls, "ca_file": missing}})
    assert served_tls({**served, "tls": None}) is None
    (tmp_path / "c.pem").write_text("x")
    (tmp_path / "k.pem").write_text("x")
    files = served_tls({**served, "tls": {**tls, "cert_file": str(tmp_path / "c.pem"), "key_file": str(tmp_path / "k.pem")}})
    assert files.require_client_cert  # a client with a certificate presents it
