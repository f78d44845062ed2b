"""`rlcore launch`: validate, prepare assets, start the trainer world with torch.distributed.run,
and report the result.

The launch process is the controller; trainer ranks are started through torch's own launcher
(torchrun), which also handles multi-node rendezvous.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from ..core.checkpoint import list_checkpoints
from ..core.config import ConfigError, Stage, inherits_previous_model, load_config, resolve_stages, to_yaml
from . import failure
from .child import wrap
from .lifecycle import StopSignals, end_process
from .loop import SUMMARY, explores_on_workers, planned_steps, stage_dir
from .placement import GpuPlacement, place_gpus, visible_gpus
from .run_lock import RunLock


def resolve_device(requested: str) -> str:
    import torch

    if requested == "cuda" and not torch.cuda.is_available():
        raise ConfigError(
            "cluster.device is cuda but no CUDA device is visible; use cluster.device=cpu (or auto)"
        )
    if requested == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return requested


def local_device_count() -> int:
    import torch

    return torch.cuda.device_count()


def check_strategies(stages: list[Stage], device: str) -> None:
    """A strategy this machine cannot run (megatron without CUDA) is a one-line error up front."""
    from ..backends import check_strategy_runs

    for s in stages:
        if s.config.trainer.remote:
            continue  # the remote trainer's own machine decides
        try:
            check_strategy_runs(s.config.trainer.strategy, device)
        except RuntimeError as e:
            raise ConfigError(str(e)) from None


def prepare_assets(stages: list[Stage]) -> None:
    """Generate missing synthetic tasksets and build a missing scratch model (deterministic, so
    doing it once here, before any rank starts, is enough)."""
    from ..core.data.taskset import ensure_taskset
    from ..core.scratch_model import ensure_model

    for stage in stages:
        cfg = stage.config
        ensure_taskset(cfg.buffer.explorer_input.taskset, "buffer.explorer_input.taskset")
        for i, ts in enumerate(cfg.buffer.explorer_input.eval_tasksets):
            ensure_taskset(ts, f"buffer.explorer_input.eval_tasksets[{i}]")
        if inherits_previous_model(cfg):
            continue
        if ensure_model(cfg.model.model_path, cfg.model.scratch, cfg.model.max_model_len, cfg.seed):
            print(f"rlcore: built a scratch model in {cfg.model.model_path}", flush=True)


def preflight(stages: list[Stage]) -> None:
    """Resolve everything a rank would otherwise discover minutes later: reward functions (user
    import paths included), monitor packages and the model folder."""
    from ..core.monitor import check_monitor_dependencies
    from ..rollout.rewards.compose import build_reward

    for s in stages:
        cfg = s.config
        check_monitor_dependencies(list(cfg.monitor.monitor_type))
        for key, ts in _tasksets(cfg):
            try:
                build_reward(list(ts.reward_fn), list(ts.reward_weights) or None)
            except ValueError as e:
                raise ConfigError(f"{key}.reward_fn: {e}") from None
        model = cfg.model
        if not inherits_previous_model(cfg) and not model.scratch.enabled:
            if not os.path.isfile(os.path.join(model.model_path, "config.json")):
                raise ConfigError(
                    f"model.model_path: '{model.model_path}' has no config.json (is it an HF model folder?)"
                )


def check_prompt_lengths(stages: list[Stage]) -> None:
    """Count each taskset's prompts longer than model.max_prompt_tokens (truncated from the left at
    run time) and warn; with model.enable_prompt_truncation false, refuse the first one. Needs the
    model's tokenizer: runs once the assets exist."""
    from transformers import AutoTokenizer

    from ..core.data.prompts import PromptFormat
    from ..core.data.taskset import load_tasks

    tokenizer_dir = stages[0].config.model.model_path  # a stage that inherits weights keeps the tokenizer
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    for s in stages:
        cfg, prefix = s.config, ("" if len(stages) == 1 else f"stages[{s.index}].")
        if not inherits_previous_model(cfg) and cfg.model.model_path != tokenizer_dir:
            tokenizer_dir = cfg.model.model_path
            tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
        limit = cfg.model.max_prompt_tokens
        for key, ts in _tasksets(cfg):
            fmt = PromptFormat(
                limit, cfg.model.apply_chat_template, cfg.model.chat_template, ts.format.system_prompt
            )
            tasks = load_tasks(ts, key)
            lengths = [len(fmt.encode_whole_prompt(tokenizer, t.prompt)) for t in tasks]
            long = [i for i, n in enumerate(lengths) if n > limit]
            if not long:
                continue
            if not cfg.model.enable_prompt_truncation:
                raise ConfigError(
                    f"{prefix}{key}: {ts.path} row {long[0] + 1}'s prompt is {lengths[long[0]]} tokens, more than "
                    f"model.max_prompt_tokens ({limit}), and model.enable_prompt_truncation is false: raise the "
                    f"limit, shorten the prompt, or allow truncation ({len(long)} of {len(tasks)} prompts are longer)"
                )
            print(
                f"rlcore: warning: {len(long)} of {len(tasks)} prompts of {prefix}{key} ({ts.path}) are longer than "
                f"model.max_prompt_tokens ({limit}, the longest {max(lengths)}): their beginnings are cut off",
                file=sys.stderr, flush=True,
            )  # fmt: skip


def _tasksets(cfg: Any) -> list[tuple[str, Any]]:
    """(config key, taskset) of a stage's training and evaluation tasksets."""
    out = [("buffer.explorer_input.taskset", cfg.buffer.explorer_input.taskset)]
    return out + [
        (f"buffer.explorer_input.eval_tasksets[{i}]", t)
        for i, t in enumerate(cfg.buffer.explorer_input.eval_tasksets)
    ]


def check_run_dir(run_dir: str, stages: list[Stage], resume: bool) -> None:
    had_run = any(
        list_checkpoints(stage_dir(run_dir, s, len(stages)))
        or os.path.isfile(os.path.join(stage_dir(run_dir, s, len(stages)), SUMMARY))
        for s in stages
    )
    if had_run and not resume:
        raise ConfigError(
            f"{run_dir} already holds a run: resume it with continue_from_checkpoint=true, "
            f"or start a new one with name=<new name> (or delete the folder)"
        )


def torchrun_command(plan_path: str, cluster, project: str, name: str) -> list[str]:
    """torchrun starting the trainer ranks, as a child that dies with this process (child.py)."""
    args = ["--nproc-per-node", str(cluster.ranks_per_node)]
    if cluster.num_nodes == 1 and not cluster.rdzv_endpoint:
        args += ["--standalone", "--nnodes", "1"]
    else:
        args += ["--nnodes", str(cluster.num_nodes), "--rdzv-backend", "c10d",
                 "--rdzv-endpoint", cluster.rdzv_endpoint, "--rdzv-id", f"{project}-{name}"]  # fmt: skip
    return wrap(os.getpid(), "torch.distributed.run", *args, "-m", "rlcore.runtime.trainer_rank", plan_path)


def print_summary(run_dir: str, stages: list[Stage], elapsed_s: float) -> None:
    summaries = {}
    for s in stages:
        path = os.path.join(stage_dir(run_dir, s, len(stages)), SUMMARY)
        if os.path.isfile(path):
            with open(path) as f:
                summaries[s.index] = json.load(f)
    stopped = next((s for s in stages if summaries.get(s.index, {}).get("stopped")), None)
    if stopped is None:
        print(f"\nrlcore: finished in {elapsed_s / 60:.1f} min; run folder {run_dir}")
    else:
        print(
            f"\nrlcore: stopped at step {summaries[stopped.index]['global_step']} of {planned_steps(stopped)} "
            f"(stage {stopped.index} {stopped.name}) after {elapsed_s / 60:.1f} min, with a checkpoint; resume "
            f"with continue_from_checkpoint=true; run folder {run_dir}"
        )
    previous: dict[str, float] = {}
    for s in stages:
        if s.index not in summaries:
            continue
        summary = summaries[s.index]
        accs = {k: v for k, v in summary["eval"].items() if k.endswith("/accuracy")}
        parts = []
        for k, v in accs.items():
            delta = f" ({(v - previous[k]) * 100:+.1f} points)" if k in previous else ""
            parts.append(f"{k.removeprefix('eval/')} {v * 100:.1f}%{delta}")
        print(
            f"  after stage {s.index} {s.name} (step {summary['global_step']}): "
            + ("; ".join(parts) or "no evaluation")
        )
        previous.update(accs)


KEEP_FREED_MALLOC = {"MALLOC_TRIM_THRESHOLD_": str(1 << 40), "MALLOC_MMAP_THRESHOLD_": str(32 << 20)}
"""glibc malloc settings of `cluster.malloc_keep_freed`: never trim the heap; serve blocks up to 32 MiB
(glibc's own ceiling for its adaptive threshold) from it, so a step's activations reuse the last
step's memory instead of page-faulting fresh pages."""


def process_env(cluster: Any, threads: int, gpus: list[str] | None = None) -> dict[str, str]:
    """The environment of the trainer ranks and rollout workers a launch starts; `gpus` (placed by
    `gpu_placement`) replace CUDA_VISIBLE_DEVICES."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), TOKENIZERS_PARALLELISM="false")
    if gpus is not None:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)
    user_malloc = "GLIBC_TUNABLES" in os.environ or any(k.startswith("MALLOC_") for k in os.environ)
    if cluster.malloc_keep_freed and not user_malloc:
        env.update(KEEP_FREED_MALLOC)
    return env


def ensure_token(token_env: str) -> None:
    """Processes of one run share a token; without one in the environment, make a random one that
    the processes this launch starts inherit."""
    if not os.environ.get(token_env):
        os.environ[token_env] = secrets.token_urlsafe(32)


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
    return [s.config for s in stages if explores_on_workers(s.config)]


def workers_to_start(stages: list[Stage]) -> tuple[Any, int] | None:
    """(config of the first stage that explores on workers, how many) when this launch must start
    rollout workers itself; None when no stage needs them or endpoints name running ones."""
    configs = worker_stages(stages)
    if not configs or configs[0].explorer.rollout_model.endpoints:
        return None
    return configs[0], max(c.explorer.rollout_model.engine_num for c in configs)


def gpu_placement(
    stages: list[Stage], device: str, env: Mapping[str, str], device_count: int
) -> GpuPlacement | None:
    """The GPUs of the trainer ranks and the rollout workers this launch starts on this node; None on
    CPU or when it starts no workers (the trainer ranks then see every GPU, as torchrun gives them)."""
    started = workers_to_start(stages)
    if device != "cuda" or started is None:
        return None
    first, count = started
    base = stages[0].config
    return place_gpus(
        visible_gpus(env, device_count),
        trainer_ranks=0 if base.trainer.remote else base.cluster.ranks_per_node,
        engine_num=count,
        gpus_per_engine=first.explorer.rollout_model.tensor_parallel_size,
        may_share=all(c.synchronizer.sync_method == "checkpoint" for c in worker_stages(stages)),
    )


class RolloutWorkers:
    """Rollout workers this launch starts (`rlcore rollout serve`), one process each, logging to
    <run>/launch/rollout_worker_<i>.log; they register with the run's RunService. On CUDA each one
    sees only the GPUs `gpus[i]` names."""

    def __init__(
        self, cfg: Any, model_path: str, count: int, device: str, run_address: str, log_dir: str,
        gpus: list[list[str]] | None = None, keep_fds: tuple[int, ...] = (),
    ):  # fmt: skip
        """`keep_fds`: descriptors the workers inherit (the run lock: a live worker keeps the run live)."""
        self.procs: list[subprocess.Popen] = []
        self.logs = [os.path.join(log_dir, f"rollout_worker_{i}.log") for i in range(count)]
        threads = max(1, (os.cpu_count() or 1) // count)
        rm, control = cfg.explorer.rollout_model, cfg.control
        for i in range(count):
            cmd = [
                *wrap(os.getpid(), "rlcore.cli"), "rollout", "serve", "--model", model_path,
                "--engine", rm.engine_type, "--device", device, "--dtype", cfg.model.dtype,
                "--max-model-len", str(cfg.model.max_model_len), "--max-batch-size", str(rm.max_batch_size),
                "--tensor-parallel-size", str(rm.tensor_parallel_size),
                "--gpu-memory-utilization", str(rm.gpu_memory_utilization),
                *(["--enforce-eager"] if rm.enforce_eager else []), "--seed", str(cfg.seed + i),
                "--threads", str(threads), "--host", control.host, "--port", "0", "--register", run_address,
                "--index", str(i), "--token-env", control.token_env,
                "--max-message-mb", str(control.max_message_mb), *_tls_flags(control.tls),
            ]  # fmt: skip
            env = process_env(cfg.cluster, threads, None if gpus is None else gpus[i])
            with open(self.logs[i], "w") as log_file:
                self.procs.append(
                    subprocess.Popen(
                        cmd,
                        stdout=log_file,
                        stderr=subprocess.STDOUT,
                        env=env,
                        start_new_session=True,
                        pass_fds=keep_fds,
                    )  # fmt: skip
                )

    def dead(self) -> str | None:
        """A message about the first worker that exited, with its log's tail; None if all run."""
        for i, p in enumerate(self.procs):
            if p.poll() is not None:
                return (
                    f"rollout worker {i} exited with code {p.returncode}; last lines of {self.logs[i]}:\n"
                    + _tail(self.logs[i])
                )
        return None

    def stop(self, grace_s: float = 10.0) -> None:
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


@contextmanager
def control_plane(
    base: Any, stages: list[Stage], device: str, launch_dir: str, placement: GpuPlacement | None = None,
    keep_fds: tuple[int, ...] = (),
) -> Iterator[dict[str, Any]]:  # fmt: skip
    """Serve RunService for the run's lifetime and start (then stop) the rollout workers it needs.
    Yields what the trainer ranks must know: run address, rollout endpoints, sync master address."""
    from ..core.rpc.address import reachable_host
    from ..core.rpc.security import read_token
    from ..core.rpc.server import ServerOptions
    from .run_service import start_run_server

    control = base.control
    ensure_token(control.token_env)
    token = read_token(control.token_env)
    assert token is not None
    server, run = start_run_server(
        f"{base.project}/{base.name}",
        ServerOptions.from_control(control, token, port=control.run_port),
        heartbeat_interval_s=control.heartbeat_interval,
    )
    run_address = server.address
    print(f"rlcore: run controller (RunService) on {run_address}", flush=True)
    workers: RolloutWorkers | None = None
    info: dict[str, Any] = {
        "run_address": run_address,
        "rollout_endpoints": [],
        "master_address": "127.0.0.1",
    }
    try:
        configs = worker_stages(stages)
        started = workers_to_start(stages)
        if configs:
            endpoints = list(configs[0].explorer.rollout_model.endpoints)
            if started is None:
                check_endpoints(endpoints, control)
            else:
                first, count = started
                where = (
                    ""
                    if placement is None
                    else " on GPU(s) " + "; ".join(",".join(g) for g in placement.engines)
                )
                print(f"rlcore: starting {count} rollout worker(s){where} (logs in {launch_dir})", flush=True)
                workers = RolloutWorkers(
                    first, stages[0].config.model.model_path, count, device, run_address, launch_dir,
                    gpus=None if placement is None else placement.engines, keep_fds=keep_fds,
                )  # fmt: skip
                endpoints = run.wait_for_workers("rollout", count, control.worker_start_timeout, workers.dead)
                print(f"rlcore: rollout workers ready: {', '.join(endpoints)}", flush=True)
            info["rollout_endpoints"] = endpoints
            info["master_address"] = reachable_host(control.host)
        yield {**info, "run": run}
    finally:
        if workers is not None:
            workers.stop()
        server.stop(grace=1.0)


def drive_remote(stages: list[Stage], plan: dict[str, Any]) -> int:
    """trainer.remote: run the loop in this process against the TrainerService there."""
    from ..client.base import ClientOptions
    from ..client.trainer import TrainerClient
    from .handles import RemoteTrainer
    from .loop import RunContext, run_stages
    from .run_reporter import RunReporter

    base = stages[0].config
    assert base.trainer.remote is not None
    options = ClientOptions.from_control(base.control)
    reporter = RunReporter(plan["run_address"], options, base.control.heartbeat_interval)
    try:
        with TrainerClient(base.trainer.remote, options) as client:
            world_size = client.get_state(timeout=30).world_size
            print(f"rlcore: remote trainer {base.trainer.remote}: {world_size} rank(s)", flush=True)
            run = RunContext(plan["run_dir"], plan["device"], plan["rollout_endpoints"], reporter)
            run_stages(stages, RemoteTrainer(client), run)
    finally:
        reporter.close()
    return 0


def launch(config_path: str, overrides: list[str], strategy: str | None) -> int:
    # stderr is for what goes wrong: no progress bars of the libraries preparing small assets here
    os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()
    cfg = load_config(config_path, overrides, strategy)
    stages = resolve_stages(cfg)
    base = stages[0].config
    preflight(stages)
    device = resolve_device(base.cluster.device)
    check_strategies(stages, device)
    placement = gpu_placement(stages, device, os.environ, local_device_count() if device == "cuda" else 0)
    if placement is not None and placement.shared:
        print(
            "rlcore: rollout workers share GPUs with the trainer (synchronizer.sync_method checkpoint); "
            "explorer.rollout_model.gpu_memory_utilization must leave room for the trainer",
            flush=True,
        )
    run_dir = os.path.abspath(os.path.join(base.checkpoint_root_dir, base.project, base.name))
    lock = RunLock(run_dir)
    took_over = lock.acquire()
    if took_over:
        print(f"rlcore: warning: {took_over}", file=sys.stderr, flush=True)
    launch_dir = os.path.join(run_dir, "launch")
    failure.clear(launch_dir)
    try:
        check_run_dir(run_dir, stages, base.continue_from_checkpoint)
        prepare_assets(stages)
        check_prompt_lengths(stages)
        assert lock.fd is not None
        return run(stages, device, placement, run_dir, lock.fd)
    except ValueError:  # the user's to fix: the command line says it in one line
        raise
    except Exception as e:  # anything else, in this process (e.g. the loop driving a remote trainer)
        print(f"rlcore: error: {failure.report(launch_dir, 'launcher', e)}", file=sys.stderr)
        return 1
    finally:
        lock.release()


def run(stages: list[Stage], device: str, placement: GpuPlacement | None, run_dir: str, lock_fd: int) -> int:
    """Serve the control plane, start the workers and the trainer world (or drive a remote one) and
    wait; SIGINT/SIGTERM stop the run after its current step (lifecycle.StopSignals)."""
    base = stages[0].config
    launch_dir = os.path.join(run_dir, "launch")
    threads = base.cluster.threads_per_rank or max(1, (os.cpu_count() or 1) // base.cluster.ranks_per_node)
    print(
        f"rlcore: {len(stages)} stage(s) [{', '.join(s.name for s in stages)}], strategy {base.trainer.strategy}, "
        f"{base.cluster.ranks} trainer rank(s) on {device}; run folder {run_dir}",
        flush=True,
    )
    start = time.time()
    try:
        with control_plane(base, stages, device, launch_dir, placement, keep_fds=(lock_fd,)) as plane:
            controller = plane["run"]
            plan = {
                "run_dir": run_dir, "device": device, "log_level": base.log.level, "threads_per_rank": threads,
                "run_address": plane["run_address"], "rollout_endpoints": plane["rollout_endpoints"],
                "master_address": plane["master_address"],
                "stages": [{"index": s.index, "name": s.name, "config": to_yaml(s.config)} for s in stages],
            }  # fmt: skip
            plan_path = os.path.join(launch_dir, "plan.json")
            with open(plan_path, "w") as f:
                json.dump(plan, f, indent=2)
            env = process_env(base.cluster, threads, None if placement is None else placement.trainer)
            controller.mark_running()
            with StopSignals(controller.request_stop, base.control.stop_grace_s) as stops:
                try:
                    if base.trainer.remote:
                        rc = drive_remote(stages, plan)
                    else:
                        command = torchrun_command(plan_path, base.cluster, base.project, base.name)
                        rc = run_trainer_world(command, env, lock_fd, launch_dir)
                except KeyboardInterrupt:  # a second signal, or the stop grace ran out
                    stage, step, total = controller.progress()
                    print(
                        f"rlcore: stopped at step {step} of {total} ({stage or 'before training'}) without a "
                        "final checkpoint; resume from the last one with continue_from_checkpoint=true",
                        file=sys.stderr,
                    )
                    return 130 if stops.received in (None, signal.SIGINT) else stops.exit_code
            if rc == 0:
                controller.mark_finished()
            else:
                controller.mark_failed(f"the trainer world exited with code {rc}")
    except KeyboardInterrupt:  # Ctrl-C while the workers were starting
        print("rlcore: interrupted before training started", file=sys.stderr)
        return 130
    except (TimeoutError, RuntimeError) as e:  # rollout workers that did not start
        raise ConfigError(str(e)) from None
    if rc != 0:
        line = failure.first_failure(launch_dir) or (
            f"the trainer world exited with code {rc} without saying why (killed, or out of memory?); "
            f"its output is in {os.path.join(launch_dir, failure.TRAINER_LOG)}"
        )
        print(f"rlcore: error: {line}", file=sys.stderr)
        return rc
    print_summary(run_dir, stages, time.time() - start)
    return 0 if stops.received is None else stops.exit_code


def run_trainer_world(command: list[str], env: dict[str, str], lock_fd: int, launch_dir: str) -> int:
    """torchrun in a session of its own (a terminal's Ctrl-C reaches only the launcher, which stops
    the run in order), dying with the launcher, its stderr and the ranks' (tracebacks, torchrun's
    failure report) in <run>/launch/trainer.log; its exit code. Interrupted, it ends the world."""
    with open(os.path.join(launch_dir, failure.TRAINER_LOG), "a") as log:
        proc = subprocess.Popen(
            command, env=env, stderr=log, start_new_session=True,
            pass_fds=(lock_fd,),
        )  # fmt: skip
    try:
        return proc.wait()
    except BaseException:
        end_process(proc)
        raise
