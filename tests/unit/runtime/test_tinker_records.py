"""The Tinker server's model specs (which layers an adapter takes) and its records of training runs
and checkpoints, as the RestClient lists them (runtime/tinker/service.py, records.py)."""

from __future__ import annotations

import json
import os

import pytest

pytest.importorskip("tinker", reason="the Tinker SDK: pip install 'rlcore[tinker]'")
from tinker import types  # noqa: E402
from transformers import LlamaConfig  # noqa: E402

from rlcore.runtime.tinker.errors import NotFound, UserError  # noqa: E402
from rlcore.runtime.tinker.models import ATTENTION  # noqa: E402
from rlcore.runtime.tinker.models import targets as _targets  # noqa: E402
from rlcore.runtime.tinker.records import Checkpoint, ModelSpec, Records  # noqa: E402
from rlcore.runtime.tinker.service import TinkerService  # noqa: E402


def _service(tmp_path, tied: bool) -> TinkerService:
    folder = tmp_path / "base"
    LlamaConfig(tie_word_embeddings=tied).save_pretrained(folder)
    return TinkerService(None, {"m": str(folder)}, str(tmp_path / "work"), "cpu", "float32", 64, "fsdp2")  # type: ignore[arg-type]


def test_an_adapter_takes_the_layers_the_client_names_the_unembedding_included(tmp_path) -> None:
    service = _service(tmp_path, tied=False)
    default = service.spec_of("m", types.LoraConfig(rank=4))  # the SDK's defaults: attention, MLP, unembedding
    assert default.train_unembed and _targets(default) == ["all-linear", "lm_head"]  # every linear layer
    blocks = service.spec_of("m", types.LoraConfig(rank=4, train_unembed=False))
    assert _targets(blocks) == "all-linear"  # what it was before train_unembed was honoured
    only = service.spec_of("m", types.LoraConfig(rank=4, train_attn=False, train_mlp=False))
    assert _targets(only) == ["lm_head"]
    assert _targets(service.spec_of("m", types.LoraConfig(rank=4, train_mlp=False))) == [*ATTENTION, "lm_head"]
    with pytest.raises(UserError, match="train_attn, train_mlp and train_unembed are all false"):
        service.spec_of("m", types.LoraConfig(rank=4, train_attn=False, train_mlp=False, train_unembed=False))
    assert not service.spec_of("m", types.LoraConfig(rank=0)).train_unembed  # full fine-tuning


def test_a_head_tied_to_the_embedding_gets_no_adapter_and_says_so(tmp_path) -> None:
    service = _service(tmp_path, tied=True)
    spec = service.spec_of("m", types.LoraConfig(rank=4))  # the SDK's default asks for the head
    assert not spec.train_unembed and _targets(spec) == "all-linear"
    with pytest.raises(UserError, match=r"lora_config.train_unembed: m ties .*nothing would train"):
        service.spec_of("m", types.LoraConfig(rank=4, train_attn=False, train_mlp=False))


def test_error_lines_name_no_server_path(tmp_path) -> None:
    service = _service(tmp_path, tied=False)
    line = f"FileNotFoundError: {service.workdir}/models/x and {tmp_path / 'base'}/config.json"
    assert service.public(line) == "FileNotFoundError: <workdir>/models/x and <m>/config.json"


def test_runs_and_checkpoints_are_listed_across_a_restart_without_server_paths(tmp_path) -> None:
    work = str(tmp_path)
    records = Records(work)
    spec = ModelSpec("m", 8, train_unembed=True)
    records.started("s1:train:0", spec, "alice")
    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / "weights.bin").write_bytes(b"x" * 10)
    records.record(Checkpoint("tinker://s1:train:0/weights/a", "weights", str(folder), "s1:train:0", spec, 1.0))
    records.record(Checkpoint("tinker://s1:train:0/sampler_weights/b", "sampler_weights", str(tmp_path / "gone"),
                              "s1:train:0", spec, 2.0))  # fmt: skip

    again = Records(work)  # a restarted server
    run = types.TrainingRun.model_validate(again.training_run("s1:train:0", "alice"))
    assert (run.is_lora, run.lora_rank, run.last_checkpoint.checkpoint_id) == (True, 8, "weights/a")
    assert run.last_sampler_checkpoint.checkpoint_type == "sampler"
    listed = types.CheckpointsListResponse.model_validate(again.checkpoints_of("s1:train:0", "alice")).checkpoints
    assert [(c.checkpoint_id, c.size_bytes) for c in listed] == [("weights/a", 10), ("sampler_weights/b", None)]
    page = types.CheckpointsListResponse.model_validate(again.all_checkpoints(limit=1, offset=0, caller="alice"))
    assert [c.checkpoint_id for c in page.checkpoints] == ["sampler_weights/b"] and page.cursor.total_count == 2
    runs = types.TrainingRunsResponse.model_validate(again.training_runs(limit=20, offset=0, caller="alice"))
    assert [r.training_run_id for r in runs.training_runs] == ["s1:train:0"]
    info = types.WeightsInfoResponse.model_validate(again.weights_info("tinker://s1:train:0/weights/a"))
    assert (info.lora_rank, info.train_unembed) == (8, True)
    assert str(tmp_path) not in json.dumps([again.training_run("s1:train:0", "alice"), again.checkpoints_of("s1:train:0", "alice")])
    # another tenant sees none of it: not the run, its checkpoints, nor in the listings
    with pytest.raises(NotFound, match="no training run s1:train:0"):
        again.training_run("s1:train:0", "bob")
    with pytest.raises(NotFound):
        again.checkpoints_of("s1:train:0", "bob")
    assert again.training_runs(limit=20, offset=0, caller="bob")["training_runs"] == []
    assert again.all_checkpoints(limit=20, offset=0, caller="bob")["checkpoints"] == []
    # two saves of one step share a training folder: forgetting one leaves the folder to the other
    again.record(Checkpoint("tinker://s1:train:0/weights/c", "weights", str(folder), "s1:train:0", spec, 3.0))
    assert not again.forget("tinker://s1:train:0/weights/c") and again.checkpoint("tinker://s1:train:0/weights/a")
    assert again.forget("tinker://s1:train:0/weights/a")
    with pytest.raises(NotFound, match="no training run s2:train:0"):
        again.checkpoints_of("s2:train:0", "alice")
    with pytest.raises(UserError, match="checkpoint_id: 'nonsense' is not weights/<name>"):
        again.find("s1:train:0", "nonsense")
    with pytest.raises(UserError, match="limit: must be >= 1"):
        again.training_runs(limit=0, offset=0, caller="alice")


def test_records_of_an_older_server_read_without_train_unembed_and_list_its_runs(tmp_path) -> None:
    spec = {"base_model": "m", "lora_rank": 4, "train_attn": True, "train_mlp": True, "seed": 0}
    row = {"tinker_path": "tinker://s:train:0/weights/a", "kind": "weights", "folder": "/x", "model_id": "s:train:0",
           "spec": spec, "time": 1.0}  # fmt: skip
    with open(os.path.join(tmp_path, "checkpoints.json"), "w") as f:
        json.dump([row], f)
    records = Records(str(tmp_path))
    ckpt = records.checkpoint("tinker://s:train:0/weights/a", "weights")
    assert ckpt.spec == ModelSpec("m", 4) and not ckpt.spec.train_unembed
    assert records.training_run("s:train:0", "bob")["last_checkpoint"]["checkpoint_id"] == "weights/a"  # no runs.json


def test_each_key_is_a_tenant_named_by_a_hash_of_it() -> None:
    from rlcore.runtime.tinker.access import keys_of, sees, tenant_of

    keys = keys_of(" tml-a, tml-b ,")
    assert keys == ["tml-a", "tml-b"]
    alice, bob = tenant_of("tml-a", keys), tenant_of("tml-b", keys)
    assert alice and bob and alice != bob and "tml" not in alice
    assert tenant_of("tml-c", keys) is None
    assert sees(alice, alice) and not sees(alice, bob) and sees("", bob) and sees(alice, "")
