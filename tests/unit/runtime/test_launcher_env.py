"""The environment `rlcore launch` gives the processes it starts."""

import os

from rlcore.core.config.schema import ClusterConfig
from rlcore.runtime.child import FIXED_TEAMS, KEEP_FREED_MALLOC, SPIN_WAIT, process_env, thread_settings


def _clear_malloc_env(monkeypatch):
    for key in ("GLIBC_TUNABLES", *[k for k in os.environ if k.startswith("MALLOC_")]):
        monkeypatch.delenv(key, raising=False)


def test_threads_and_kept_freed_memory_by_default(monkeypatch):
    _clear_malloc_env(monkeypatch)
    env = process_env(ClusterConfig(), threads=3)
    assert env["OMP_NUM_THREADS"] == "3"
    assert env["TOKENIZERS_PARALLELISM"] == "false"
    for key, value in KEEP_FREED_MALLOC.items():
        assert env[key] == value


def test_malloc_left_alone_when_off(monkeypatch):
    _clear_malloc_env(monkeypatch)
    env = process_env(ClusterConfig(malloc_keep_freed=False), threads=1)
    assert not any(k.startswith("MALLOC_") for k in env)


def test_users_malloc_settings_win(monkeypatch):
    _clear_malloc_env(monkeypatch)
    monkeypatch.setenv("MALLOC_ARENA_MAX", "2")
    env = process_env(ClusterConfig(), threads=1)
    assert env["MALLOC_ARENA_MAX"] == "2"
    assert not any(k in env for k in KEEP_FREED_MALLOC)

    _clear_malloc_env(monkeypatch)
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.trim_threshold=0")
    env = process_env(ClusterConfig(), threads=1)
    assert not any(k in env for k in KEEP_FREED_MALLOC)


def test_thread_settings_fix_openmp_and_mkl_teams_unless_the_user_set_them():
    env: dict[str, str] = {}
    thread_settings(env)
    assert env == {**SPIN_WAIT, **FIXED_TEAMS}
    users = {"OMP_WAIT_POLICY": "PASSIVE", "MKL_DYNAMIC": "TRUE"}
    thread_settings(users)
    assert users == {"OMP_WAIT_POLICY": "PASSIVE", "MKL_DYNAMIC": "TRUE", "OMP_DYNAMIC": "FALSE"}


def test_the_test_process_and_its_children_run_with_fixed_teams():
    """tests/conftest.py sets them before torch is imported, as `rlcore` does for itself."""
    assert {k: os.environ[k] for k in FIXED_TEAMS} == FIXED_TEAMS
