"""The optional packages a config needs: named in one line with the pip command that installs them,
and that command's extra really holds the package (pyproject.toml)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import tomllib

from rlcore.core.config import ConfigError
from rlcore.core.config.package_checks import EXTRAS, install_command

from .minimal import resolve

TS = "buffer.explorer_input.taskset"
PYPROJECT = Path(__file__).resolve().parents[3] / "pyproject.toml"
DISTRIBUTIONS = {"megatron": "megatron-core"}
"""Import names whose distribution is named otherwise."""


def test_each_install_command_installs_its_package() -> None:
    extras = tomllib.loads(PYPROJECT.read_text())["project"]["optional-dependencies"]
    for module, extra in EXTRAS.items():
        names = [re.split(r"[\[<>=!~ ]", req, maxsplit=1)[0] for req in extras[extra]]
        assert DISTRIBUTIONS.get(module, module) in names, (module, extra, names)
    assert install_command("openai") == "pip install 'rlcore[http]'"  # the auxiliary models' client
    assert install_command("verifiers.v1") == "pip install 'rlcore[verifiers]'"
    assert install_command("some_other") == "pip install some_other"


def test_a_verifiers_taskset_without_the_package_is_one_line(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "verifiers", None)  # not installed, as far as imports can tell
    with pytest.raises(
        ConfigError,
        match=rf"^{TS}\.default_workflow_type: the verifiers workflow needs the verifiers package, which is not "
        r"installed here: pip install 'rlcore\[verifiers\]'$",
    ):
        resolve(tmp_path, f"{TS}.default_workflow_type=verifiers", f"{TS}.workflow_args={{env: e}}")
    with pytest.raises(
        ConfigError, match=rf"^{TS}\.generator: the verifiers generator needs the verifiers package"
    ):
        resolve(
            tmp_path,
            f"{TS}.generator=verifiers",
            f"{TS}.generator_args={{env: e}}",
            f"{TS}.path=/no/such.jsonl",
        )


def test_auxiliary_models_without_openai_are_one_line(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "openai", None)
    with pytest.raises(
        ConfigError,
        match=r"^explorer\.auxiliary_models: the services \(judge\) are reached with the openai package, which is "
        r"not installed here: pip install 'rlcore\[http\]'$",
    ):
        resolve(tmp_path, "explorer.auxiliary_models=[{name: judge, model_name: m, base_url: 'http://h/v1'}]")
