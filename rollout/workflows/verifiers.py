"""default_workflow_type verifiers: rollouts of a `verifiers` environment (PrimeIntellect's,
v1 API), trained on as the engine generated them.

    workflow_args:
      env: tests.envs.guess          # an installed environment's id, or a module exporting its Taskset
      env_args: {...}                # its taskset config's fields
      env_id: ""                     # a verifiers Env to pair with the taskset (default: its own)
      harness: null                  # the program seats without one of their own run (verifiers' id)
      episode_timeout_s: 600

The taskset's rows come from `generator: verifiers` (core/data/verifiers_tasks.py): each names its
task by index. Each episode runs the environment as verifiers runs it (its harness program in a
subprocess runtime, its own turns, tools and stops), with the model behind an OpenAI-compatible door
the process running this workflow serves on loopback over its engine (rollout/loopback_door.py). Every request of an episode
carries its episode id (X-Episode-Id), so the door records the turns token by token (episodes.py):
the model's tokens with their log-probs train, the environment's turns are context. The
environment's weighted rewards are the experience's reward (rlcore's reward_fn is not used), each
one a reward component.

Needs the `verifiers` package (`pip install 'rlcore[verifiers]'`) and, for its harness programs,
`uv` (verifiers installs it with pip when missing, and the programs' packages from the index).
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import uuid
from typing import Any

from ...core.data.verifiers_tasks import INDEX, load_verifiers_taskset, verifiers_id
from ...core.types import Experience, SamplingParams, Task
from .base import Workflow, sampled_at


class VerifiersWorkflow(Workflow):
    KEYS = ("env", "env_args", "env_id", "harness", "episode_timeout_s")

    @classmethod
    def check_args(cls, args: dict[str, Any]) -> None:
        super().check_args(args)
        if not isinstance(args.get("env"), str) or not args["env"]:
            raise ValueError(
                "workflow_args.env: name the verifiers environment (its id, or a module exporting its Taskset)"
            )
        if not isinstance(args.get("env_args", {}), dict):
            raise ValueError("workflow_args.env_args: a mapping of the environment's taskset config fields")
        for key in ("env_id", "harness"):
            if not isinstance(args.get(key, ""), str):
                raise ValueError(f"workflow_args.{key}: a verifiers id (a string)")
        timeout = args.get("episode_timeout_s", 600)
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
            raise ValueError(f"workflow_args.episode_timeout_s: seconds > 0; got {timeout!r}")
        load_verifiers_taskset(args["env"], args.get("env_args"))  # installed and loadable, said here

    def __init__(self, *a: Any, **kw: Any):
        super().__init__(*a, **kw)
        self.check_args(self.args)
        self._lock = threading.Lock()
        self._started: _Running | None = None

    def run(self, tasks: list[Task], sampling: SamplingParams, policy_version: int) -> list[Experience]:
        with self._lock:
            if self._started is None:
                self._started = _Running(self)
        running = self._started
        plays = [(t, j, f"vf-{uuid.uuid4().hex}") for t in tasks for j in range(sampling.n)]
        episodes = running.play([(running.task(t), j, eid) for t, j, eid in plays], sampling)
        out = []
        for (task, _, eid), episode in zip(plays, episodes, strict=True):
            traces = [t for t in episode.traces if t.agent.trainable] or list(episode.traces)
            reward = float(traces[0].reward) if traces else 0.0
            experiences = running.door.recorder.finish(eid, reward, task.task_id)
            if not experiences:
                why = "; ".join(str(e.message) for t in episode.traces for e in t.errors) or "no model turn"
                raise RuntimeError(
                    f"task {task.task_id}: the verifiers episode reached the model in no turn ({why})"
                )
            for e in experiences:
                e.reward_components = {
                    k: float(r.score) for k, r in traces[0].rewards.items() if r is not None
                }
            out.extend(experiences)
        return sampled_at(out, sampling)


class _Running:
    """A workflow's live parts: the environment serving in an event loop of its own thread, its
    tasks by index, and the door its episodes reach the engine through."""

    def __init__(self, workflow: VerifiersWorkflow):
        import verifiers.v1 as vf
        from verifiers.v1.utils.loaders import env_config_type, environment_class

        args = workflow.args
        env, env_id, harness = (
            verifiers_id(args["env"]),
            args.get("env_id", ""),
            args.get("harness") or "null",
        )
        self.timeout_s = float(args.get("episode_timeout_s", 600))
        config_cls = env_config_type(env, env_id)
        seats = {
            name: {
                "runtime": {"type": "subprocess"},
                **({} if field.default.harness else {"harness": {"id": harness}}),
            }
            for name, field in config_cls.model_fields.items()
            if isinstance(field.default, vf.AgentConfig)
        }  # subprocess: no sandbox service (verifiers' default runtime) is reachable from a worker
        config = config_cls.model_validate(
            {"id": env_id, "taskset": {"id": env, **args.get("env_args", {})}, **seats}
        )
        self.env = environment_class(env, env_id)(config)
        self.vf = vf
        self._tasks: list[Any] = []
        self._iter = iter(self.env.taskset)
        if workflow.context.open_door is None:
            raise ValueError(
                "the verifiers workflow serves its environment's programs an OpenAI-compatible door: run it on a "
                "rollout worker or in the explorer, whose processes hand it one"
            )
        self.door = workflow.context.open_door(workflow.engine)
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, name="verifiers", daemon=True).start()
        self._serving = self.env.serving()  # held: the environment serves as long as this workflow lives
        asyncio.run_coroutine_threadsafe(self._serving.__aenter__(), self.loop).result(timeout=300)

    def task(self, task: Task) -> Any:
        """The environment's task a taskset row names."""
        index = task.metadata.get(INDEX)
        if not isinstance(index, int) or index < 0:
            raise ValueError(
                f"task {task.task_id}: no '{INDEX}' column (make the taskset with generator: verifiers)"
            )
        if index >= len(self._tasks):
            self._tasks.extend(itertools.islice(self._iter, index + 1 - len(self._tasks)))
        if index >= len(self._tasks):
            raise ValueError(f"task {task.task_id}: the environment has no task {index}")
        return self._tasks[index]

    def play(self, plays: list[tuple[Any, int, str]], sampling: SamplingParams) -> list[Any]:
        async def all_of() -> list[Any]:
            return list(await asyncio.gather(*[self._episode(t, j, eid, sampling) for t, j, eid in plays]))

        return asyncio.run_coroutine_threadsafe(all_of(), self.loop).result(
            timeout=self.timeout_s * len(plays)
        )

    async def _episode(self, task: Any, j: int, episode_id: str, sampling: SamplingParams) -> Any:
        vf = self.vf
        knobs: dict[str, Any] = {"temperature": sampling.temperature, "top_p": sampling.top_p,
                                 "max_tokens": sampling.max_tokens, "top_k": sampling.top_k}  # fmt: skip
        if sampling.seed is not None:
            knobs["seed"] = sampling.seed + j
        client = vf.EvalClientConfig(
            base_url=self.door.base_url, api_key_var=self.door.key_env, headers={"X-Episode-Id": episode_id}
        )
        model = sampling.adapter or self.door.model_name  # the door generates with the adapter so named
        ctx = vf.ModelContext(model=model, client=client, sampling=vf.Sampling(**knobs))
        return await asyncio.wait_for(self.env.run_episode(task, ctx), self.timeout_s)
