"""LoRA adapters resident in a rollout worker beside its weights (rollout/engines/adapters.py), chosen
per request: `rlcore rollout serve --lora-modules`, gRPC LoadAdapter/UnloadAdapter and the door's
/v1/load_lora_adapter load them; sampling.adapter (Generate, RunTasks) and the door's `model` pick
one. Each adapter generates what an HF engine on its merged model generates (greedy tokens
identical, log-probs within 1e-5), the worker's own weights stay the base's, and what cannot be
served is refused in one line naming the parameter."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import httpx
import openai
import pytest
import torch

from rlcore.client.base import ClientOptions, RpcError
from rlcore.client.rollout import RolloutClient
from rlcore.core.types import SamplingParams, Task, WorkflowSpec

from .launch_utils import REPO
from .test_openai_door import TOKEN, TOKEN_ENV, serving

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

PROMPTS = ["12+7=", "The answer is", "3*4="]
ADAPTERS = {  # name -> (peft target modules, r, alpha, B's std)
    "alpha": ("all-linear", 4, 8, 0.2),
    "beta": (["q_proj", "v_proj", "down_proj"], 2, 4, 0.4),
}


@pytest.fixture(scope="module")
def folders(bpe_model_path: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[str, str]]:
    """name -> (the adapter's peft folder, its merged model's folder), random B so they matter."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = {}
    for seed, (name, (targets, r, alpha, std)) in enumerate(ADAPTERS.items()):
        torch.manual_seed(seed)
        base = AutoModelForCausalLM.from_pretrained(bpe_model_path, dtype=torch.float32)
        model = get_peft_model(base, LoraConfig(r=r, lora_alpha=alpha, target_modules=targets))
        with torch.no_grad():
            for param_name, p in model.named_parameters():
                if "lora_B" in param_name:
                    p.normal_(std=std)
        adapter, merged = tmp_path_factory.mktemp(f"{name}-adapter"), tmp_path_factory.mktemp(f"{name}-merged")
        model.save_pretrained(str(adapter))
        model.merge_and_unload().save_pretrained(str(merged))
        AutoTokenizer.from_pretrained(bpe_model_path).save_pretrained(str(merged))
        out[name] = (str(adapter), str(merged))
    return out


@pytest.fixture(scope="module")
def worker(bpe_model_path: str, folders, tmp_path_factory: pytest.TempPathFactory):
    """(gRPC address, HTTP base URL) of a worker on the base model holding adapter alpha from its
    start (--lora-modules)."""
    with serving(bpe_model_path, tmp_path_factory.mktemp("worker"), "--lora-modules",
                 f"alpha={folders['alpha'][0]}") as served:  # fmt: skip
        yield served


def _greedy(engine_or_client, sampling: SamplingParams) -> list[tuple[list[int], list[float]]]:
    if isinstance(engine_or_client, RolloutClient):
        result = engine_or_client.generate(PROMPTS, sampling).completions
    else:
        ids = [engine_or_client.tokenizer.encode(p) for p in PROMPTS]
        result = engine_or_client.generate(ids, sampling)
    return [(c.token_ids, c.logprobs) for (c,) in result]


def _same(got, want) -> None:
    for (tokens, logprobs), (want_tokens, want_logprobs) in zip(got, want, strict=True):
        assert tokens == want_tokens
        assert max(abs(a - b) for a, b in zip(logprobs, want_logprobs, strict=True)) <= 1e-5


def test_each_adapter_generates_as_its_merged_model(worker, folders, bpe_model_path) -> None:
    from rlcore.rollout.engines.hf import HFEngine

    greedy = SamplingParams(temperature=0.0, max_tokens=12)
    with RolloutClient(worker[0], ClientOptions(token=TOKEN, timeout=60)) as client:
        assert client.load_adapter("beta", folders["beta"][0]) == ["alpha", "beta"]
        assert list(client.get_info().adapters) == ["alpha", "beta"]
        served = {name: _greedy(client, SamplingParams(temperature=0.0, max_tokens=12, adapter=name))
                  for name in ("", "alpha", "beta")}  # fmt: skip
        for name, want_path in (("", bpe_model_path), ("alpha", folders["alpha"][1]), ("beta", folders["beta"][1])):
            _same(served[name], _greedy(HFEngine(want_path), greedy))
        assert served["alpha"] != served[""] != served["beta"]  # each adapter changes the answers
        # a seeded sample with an adapter is that of its merged model too
        seeded = SamplingParams(temperature=1.0, max_tokens=8, seed=3, n=2)
        (got,) = client.generate([PROMPTS[0]], dataclasses.replace(seeded, adapter="beta")).completions
        merged = HFEngine(folders["beta"][1])
        (want,) = merged.generate([merged.tokenizer.encode(PROMPTS[0])], seeded)
        assert [c.token_ids for c in got] == [c.token_ids for c in want]

        # RunTasks picks the adapter by sampling.adapter as well
        tasks = [Task(f"t{i}", p, answer="19") for i, p in enumerate(PROMPTS)]
        workflow = WorkflowSpec(reward_fn=["exact_match"], max_prompt_tokens=32)
        ran = dict(client.run_tasks(tasks, SamplingParams(temperature=0.0, max_tokens=12, adapter="alpha"), workflow))
        assert [ran[i][0].response_token_ids for i in range(3)] == [t for t, _ in served["alpha"]]

        assert client.unload_adapter("beta") == ["alpha"]
        with pytest.raises(RpcError, match=r"sampling\.adapter: adapter 'beta' is not held by this worker \(held: alpha"):
            client.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=4, adapter="beta"))
        with pytest.raises(RpcError, match=r"NOT_FOUND.*adapter beta is not loaded here"):
            client.unload_adapter("beta")
        with pytest.raises(RpcError, match=r"path: adapter gamma: '/no/such' holds no adapter_config\.json"):
            client.load_adapter("gamma", "/no/such")
        with pytest.raises(RpcError, match=r"name: adapter name 'bad name'"):
            client.load_adapter("bad name", folders["beta"][0])


def test_the_door_serves_each_adapter_under_its_name(worker, folders) -> None:
    api = openai.OpenAI(base_url=worker[1], api_key=TOKEN, max_retries=0, timeout=60)
    headers = {"Authorization": f"Bearer {TOKEN}"}
    loaded = httpx.post(f"{worker[1]}/load_lora_adapter", headers=headers,
                        json={"lora_name": "beta", "lora_path": folders["beta"][0]}, timeout=60)  # fmt: skip
    assert loaded.status_code == 200 and loaded.json()["adapters"] == ["alpha", "beta"], loaded.text
    models = {m.id: m for m in api.models.list().data}
    assert list(models) == ["tiny", "alpha", "beta"]
    assert models["beta"].model_extra["parent"] == "tiny" and models["beta"].model_extra["root"] == folders["beta"][0]
    assert api.models.retrieve("alpha").id == "alpha"

    with RolloutClient(worker[0], ClientOptions(token=TOKEN, timeout=60)) as client:
        for name in ("tiny", "alpha", "beta"):
            answer = api.completions.create(model=name, prompt=PROMPTS[1], max_tokens=10, temperature=0)
            sampling = SamplingParams(temperature=0.0, max_tokens=10, adapter="" if name == "tiny" else name)
            ((want,),) = client.generate([PROMPTS[1]], sampling).completions
            assert answer.choices[0].model_extra["token_ids"] == want.token_ids, name

    answer = api.chat.completions.create(model="beta", messages=[{"role": "user", "content": "hi"}], max_tokens=4,
                                         extra_body={"episode_id": "e1"})  # fmt: skip
    assert answer.model == "beta"  # the answer names the adapter that generated it, as vLLM's does
    with pytest.raises(openai.BadRequestError, match=r"episode 'e1' was recorded with 'beta'; an episode stays on one"):
        api.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=4,
                                    extra_body={"episode_id": "e1"})  # fmt: skip
    own = httpx.post(f"{worker[1]}/load_lora_adapter", headers=headers,
                     json={"lora_name": "tiny", "lora_path": folders["beta"][0]}, timeout=60)  # fmt: skip
    assert own.status_code == 400 and own.json()["error"]["param"] == "lora_name", own.text

    unloaded = httpx.post(f"{worker[1]}/unload_lora_adapter", headers=headers, json={"lora_name": "beta"}, timeout=60)
    assert unloaded.json()["adapters"] == ["alpha"]
    with pytest.raises(openai.NotFoundError, match=r"model 'beta' is not served here; this worker serves 'tiny', 'alpha'"):
        api.completions.create(model="beta", prompt=PROMPTS[1], max_tokens=4)
    again = httpx.post(f"{worker[1]}/unload_lora_adapter", headers=headers, json={"lora_name": "beta"}, timeout=60)
    assert again.status_code == 404 and again.json()["error"]["param"] == "lora_name"
    bad = httpx.post(f"{worker[1]}/load_lora_adapter", headers=headers,
                     json={"lora_name": "gamma", "lora_path": "/no/such"}, timeout=60)  # fmt: skip
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "lora_path", bad.text
    assert httpx.post(f"{worker[1]}/load_lora_adapter", json={}, timeout=60).status_code == 401


def test_a_bad_lora_module_stops_the_worker_in_one_line(bpe_model_path, tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    for module, message in (
        ("alpha", "--lora-modules: give NAME=PATH"),
        (f"alpha={empty}", f"--lora-modules alpha={empty}: adapter alpha: '{empty}' holds no adapter_config.json"),
    ):
        proc = subprocess.run(
            [sys.executable, "-m", "rlcore.cli", "rollout", "serve", "--model", bpe_model_path, "--token-env",
             TOKEN_ENV, "--lora-modules", module],
            cwd=REPO, env={**os.environ, TOKEN_ENV: TOKEN}, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert proc.returncode == 2, proc.stderr[-2000:]
        assert message in proc.stderr, proc.stderr[-2000:]


def test_a_vllm_worker_serves_adapters_through_vllm_lora(bpe_model_path, folders, tmp_path: Path) -> None:
    """vLLM's own LoRA serving (--max-loras): each adapter's greedy tokens are its merged model's on
    the HF engine, the worker's own weights the base's; an engine started without room refuses."""
    from rlcore.rollout.engines.hf import HFEngine

    from .vllm_support import require_vllm

    require_vllm()
    greedy = SamplingParams(temperature=0.0, max_tokens=12)
    with serving(bpe_model_path, tmp_path, "--engine", "vllm", "--max-loras", "2", "--lora-modules",
                 f"alpha={folders['alpha'][0]}") as (address, _):  # fmt: skip
        with RolloutClient(address, ClientOptions(token=TOKEN, timeout=120)) as client:
            assert client.load_adapter("beta", folders["beta"][0]) == ["alpha", "beta"]
            with pytest.raises(RpcError, match=r"adapter gamma: this engine holds 2 adapters already"):
                client.load_adapter("gamma", folders["beta"][0])
            for name, want_path in (("", bpe_model_path), ("alpha", folders["alpha"][1]), ("beta", folders["beta"][1])):
                got = _greedy(client, dataclasses.replace(greedy, adapter=name))
                assert [t for t, _ in got] == [t for t, _ in _greedy(HFEngine(want_path), greedy)], name
            assert client.unload_adapter("alpha") == ["beta"]
    (tmp_path / "plain").mkdir()
    with serving(bpe_model_path, tmp_path / "plain", "--engine", "vllm") as (address, _):
        with RolloutClient(address, ClientOptions(token=TOKEN, timeout=120)) as client:
            with pytest.raises(RpcError, match=r"path: adapter beta: this vllm engine was started without room"):
                client.load_adapter("beta", folders["beta"][0])
