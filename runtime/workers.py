"""The rollout workers a launch starts (`rlcore rollout serve`, one process each) or finds at the
configured endpoints, and which stages explore on them."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from ..core.config import ConfigError, Stage
from ..core.config.dtypes import engine_dtype
from ..core.config.plan import gpu_sharing
from ..rollout.engines.spec import engine_spec
from .child import process_env, wrap
from .placement import GpuPlacement, place_gpus, visible_gpus


def _tls_flags(tls: Any) -> list[str]:
    if not tls.enabled:
        return []
    flags = ["--tls-cert", tls.cert_file, "--tls-key", tls.key_file]
    if tls.ca_file:
        flags += ["--tls-ca", tls.ca_file]
    if tls.require_client_cert:
        flags.append("--tls-require-client-cert")
    return flags


def _tail(path: str, lines: int = 15) -> str:
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except OSError:
        return ""


def worker_stages(stages: list[Stage]) -> list[Any]:
    """Configs of the stages that explore on rollout workers (mode both, or a remote trainer, which
    cannot host an engine: every stage then explores and evaluates on workers)."""
    return [s.config for s in stages if s.plan.on_workers]


def workers_to_start(stages: list[Stage]) -> tuple[Any, int] | None:
    """(config of the first stage that explores on workers, how many) when this launch must start
    rollout workers itself; None when no stage needs them or endpoints name running ones."""
    configs = worker_stages(stages)
    if not configs or configs[0].explorer.rollout_model.endpoints or workers_to_join(stages):
        return None
    return configs[0], max(c.explorer.rollout_model.engine_num for c in configs)


def workers_to_join(stages: list[Stage]) -> int:
    """How many rollout workers this launch waits for to join from other hosts
    (explorer.rollout_model.start_workers false); 0: none."""
    configs = worker_stages(stages)
    if not configs or configs[0].explorer.rollout_model.start_workers:
        return 0
    return max(c.explorer.rollout_model.engine_num for c in configs)


def gpu_placement(
    stages: list[Stage], device: str, env: Mapping[str, str], device_count: int
) -> GpuPlacement | None:
    """The GPUs of the trainer ranks and the rollout workers this launch starts on this node; None on
    CPU or when it starts no workers (the trainer ranks then see every GPU, as torchrun gives them)."""
    started = workers_to_start(stages)
    if device != "cuda" or started is None:
        return None
    first, count = started
    return place_gpus(
        visible_gpus(env, device_count),
        trainer_ranks=0 if stages[0].plan.trainer != "local" else stages[0].config.cluster.ranks_per_node,
        engine_num=count,
        gpus_per_engine=first.explorer.rollout_model.tensor_parallel_size,
        may_share=gpu_sharing([s.plan for s in stages]),
    )


class RolloutWorkers:
    """Rollout workers this launch starts (`rlcore rollout serve`), one process each, logging to
    <run>/launch/rollout_worker_<i>.log; they register with the run's RunService under their index.
    On CUDA each one sees only the GPUs `gpus[i]` names. Once `keep` is called, a worker that exits
    is removed from the run and restarted (backoff 1, 2, 4, ... s; at most `max_restarts` times);
    the restarted worker registers under the same index."""

    def __init__(
        self, cfg: Any, model_path: str | Callable[[], str], count: int, device: str, run_address: str, log_dir: str,
        gpus: list[list[str]] | None = None, keep_fds: tuple[int, ...] = (),
    ):  # fmt: skip
        """`model_path`: the model a worker starts from, or what gives it at each (re)start (mode
        explore: the newest published weights, since older versions are pruned); `keep_fds`:
        descriptors the workers inherit (the run lock: a live worker keeps the run live)."""
        self._model = model_path if callable(model_path) else (lambda: model_path)
        self.logs = [os.path.join(log_dir, f"rollout_worker_{i}.log") for i in range(count)]
        threads = max(1, (os.cpu_count() or 1) // count)
        rm, control = cfg.explorer.rollout_model, cfg.control
        self.max_restarts = rm.max_restarts
        self.restarts = [0] * count
        self._keep_fds = keep_fds
        self._stopping = threading.Event()
        self._keeper: threading.Thread | None = None
        self._commands: list[tuple[list[str], dict[str, str]]] = []
        for i in range(count):
            spec = engine_spec(cfg, "", device, engine_dtype(cfg, device), seed=cfg.seed + i)
            cmd = [
                *wrap(os.getpid(), "rlcore.cli"), "rollout", "serve", "--model", "",  # _start fills it
                "--engine-spec", spec.to_json(), *(["--partial-rollout"] if cfg.explorer.partial_rollout else []),
                "--threads", str(threads), "--host", control.host, "--port", "0", "--register", run_address,
                "--index", str(i), "--token-env", control.token_env,
                "--max-message-mb", str(control.max_message_mb), *_tls_flags(control.tls),
            ]  # fmt: skip
            self._commands.append((cmd, process_env(cfg.cluster, threads, None if gpus is None else gpus[i])))
        self.procs = [self._start(i, "w") for i in range(count)]

    def _start(self, i: int, mode: str) -> subprocess.Popen:
        cmd, env = self._commands[i]
        cmd = list(cmd)
        cmd[cmd.index("--model") + 1] = self._model()
        with open(self.logs[i], mode) as log_file:
            return subprocess.Popen(
                cmd, stdout=log_file, stderr=subprocess.STDOUT, env=env, start_new_session=True,
                pass_fds=self._keep_fds,
            )  # fmt: skip

    def dead(self) -> str | None:
        """A message about the first worker that exited, with its log's tail; None if all run."""
        for i, p in enumerate(self.procs):
            if p.poll() is not None:
                return (
                    f"rollout worker {i} exited with code {p.returncode}; last lines of {self.logs[i]}:\n"
                    + _tail(self.logs[i])
                )
        return None

    def keep(self, run: Any, poll_s: float = 0.5) -> None:
        """From now on, restart workers that exit; `run` (RunServicer) forgets them meanwhile."""
        self._keeper = threading.Thread(
            target=self._keep, args=(run, poll_s), name="rlcore-workers", daemon=True
        )
        self._keeper.start()

    def _keep(self, run: Any, poll_s: float) -> None:
        while not self._stopping.wait(poll_s):
            for i, p in enumerate(self.procs):
                if p.poll() is None or self.restarts[i] > self.max_restarts:
                    continue
                run.remove_worker("rollout", i)
                if self.restarts[i] == self.max_restarts:
                    print(
                        f"rlcore: rollout worker {i} exited with code {p.returncode} and was restarted "
                        f"{self.max_restarts} time(s) already (explorer.rollout_model.max_restarts): the run goes "
                        f"on without it; its log: {self.logs[i]}",
                        flush=True,
                    )
                    self.restarts[i] += 1
                    continue
                wait_s = 2.0 ** self.restarts[i]
                self.restarts[i] += 1
                print(
                    f"rlcore: rollout worker {i} exited with code {p.returncode}; restarting it in {wait_s:g} s "
                    f"({self.restarts[i]} of {self.max_restarts}); its log: {self.logs[i]}",
                    flush=True,
                )
                if self._stopping.wait(wait_s):
                    return
                self.procs[i] = self._start(i, "a")

    def stop(self, grace_s: float = 10.0) -> None:
        self._stopping.set()
        if self._keeper is not None:
            self._keeper.join()
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
        end = time.monotonic() + grace_s
        for p in self.procs:
            try:
                p.wait(max(end - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def check_endpoints(endpoints: list[str], control: Any) -> None:
    """Configured rollout workers must answer before any trainer rank starts."""
    from ..client.base import ClientOptions, RpcError
    from ..client.rollout import RolloutClient

    options = ClientOptions.from_control(control, timeout=10.0)
    options.retry_attempts = 3
    for i, address in enumerate(endpoints):
        with RolloutClient(address, options) as client:
            try:
                client.get_info()
            except RpcError as e:
                raise ConfigError(
                    f"explorer.rollout_model.endpoints[{i}]: {address} does not answer ({e.code.name}: "
                    f"{e.details}); start it with `rlcore rollout serve --model ... --port ...` and the run's token"
                ) from None
