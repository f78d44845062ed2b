"""A remote trainer's Configure carries the client's run plan: TrainerService plans the stage from the
same config and takes the client's plan (its index and name) only when every decision agrees."""

from __future__ import annotations

import dataclasses
import json

import pytest

from rlcore.core.config import load_config, resolve_stages
from rlcore.core.config.plan import filled, plan_stage
from rlcore.core.rpc.errors import FailedPrecondition, InvalidArgument
from rlcore.runtime.trainer_service import agreed_plan


def test_the_service_takes_the_clients_plan_only_when_it_makes_the_same(recipe: str) -> None:
    stage = resolve_stages(load_config(recipe, ["trainer.remote=127.0.0.1:1"]), check_paths=False)[0]
    client = dataclasses.replace(stage.plan, index=2, name="rl")
    served = plan_stage(filled(stage.config), served=True)
    assert agreed_plan(json.dumps(client.as_dict()), served) == client

    flipped = not client.passes.reference
    skewed = {**client.as_dict(), "passes": {**client.as_dict()["passes"], "reference": flipped}}
    with pytest.raises(FailedPrecondition, match=rf"^plan_json\.passes: the client planned .*'reference': {flipped}"):
        agreed_plan(json.dumps(skewed), served)
    with pytest.raises(InvalidArgument, match=r"is not JSON"):
        agreed_plan("{", served)
