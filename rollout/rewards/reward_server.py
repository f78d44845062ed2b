"""`rlcore reward-model serve`: one reward model serving RewardService (proto/rlcore/v1/reward.proto)
until SIGINT/SIGTERM, for every rollout worker of a run (a taskset's `reward_model.address`) or any
other client.

A call's rows are tokenized in the call's own thread (its prompt format may be any), then joined
with the rows of the calls waiting beside it: one thread runs the model, taking everything queued
(up to `batch_size` rows a forward pass) after waiting `batch_wait_s` for company when it was idle.
A row scores what the in-process reward does (reward_model.LoadedRewardModel, the same code).
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import threading
import time
from concurrent.futures import Future
from typing import Any

from ...core.data.prompts import PromptFormat
from ...core.rpc.cli import tls_from_args, usage_error, write_atomic
from ...core.rpc.errors import InvalidArgument, require
from ...core.rpc.security import read_token
from ...core.rpc.server import MiB, RpcServer, ServerOptions, Service
from ...core.signals import StopSignals
from ...proto.v1 import reward_pb2, reward_pb2_grpc
from .reward_model import LoadedRewardModel

SERVICE_NAME = "rlcore.v1.RewardService"

MAX_ROWS_PER_CALL = 4096
"""Rows one Score call may send (a caller chunks larger batches)."""


def prompt_format_from_proto(msg: reward_pb2.PromptFormat) -> PromptFormat:
    """The caller's PromptFormat (InvalidArgument naming the field it cannot read)."""
    try:
        kwargs = json.loads(msg.template_kwargs_json) if msg.template_kwargs_json else {}
    except json.JSONDecodeError as e:
        raise InvalidArgument("prompt_format.template_kwargs_json", f"not JSON ({e})") from None
    require(isinstance(kwargs, dict), "prompt_format.template_kwargs_json", "must be a JSON object")
    require(msg.max_prompt_tokens >= 0, "prompt_format.max_prompt_tokens", "must be >= 0 (0: all)")
    return PromptFormat(
        msg.max_prompt_tokens, msg.apply_chat_template, msg.chat_template or None,
        msg.system_prompt if msg.HasField("system_prompt") else None, template_kwargs=kwargs or None,
    )  # fmt: skip


class RowBatcher:
    """One thread scoring the rows of every waiting call together."""

    def __init__(self, model: LoadedRewardModel, batch_size: int, batch_wait_s: float):
        self.model, self.batch_size, self.batch_wait_s = model, batch_size, batch_wait_s
        self.rows_scored = 0
        self._queue: queue.Queue[tuple[list[list[int]], Future] | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="reward-batcher", daemon=True)
        self._thread.start()

    def score(self, rows: list[list[int]]) -> list[float]:
        """The rows' scores, once the model thread has run them (with other calls' rows)."""
        done: Future = Future()
        self._queue.put((rows, done))
        return done.result()

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=10)

    def _gather(self, first: tuple[list[list[int]], Future]) -> tuple[list[tuple[list[list[int]], Future]], bool]:
        """`first` and the calls queued after it: those there now, and those that arrive within
        batch_wait_s while fewer than batch_size rows wait; whether close() was asked for."""
        calls, rows = [first], len(first[0])
        deadline = time.monotonic() + self.batch_wait_s
        while rows < self.batch_size:
            try:
                item = self._queue.get(timeout=max(deadline - time.monotonic(), 0.0))
            except queue.Empty:
                break
            if item is None:
                return calls, True
            calls.append(item)
            rows += len(item[0])
        while True:  # whatever else is queued rides along (one pass per batch_size rows)
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return calls, False
            if item is None:
                return calls, True
            calls.append(item)

    def _run(self) -> None:
        closing = False
        while not closing:
            first = self._queue.get()
            if first is None:
                return
            calls, closing = self._gather(first)
            rows = [r for call_rows, _ in calls for r in call_rows]
            try:
                scores = self.model.score_rows(rows, self.batch_size)
            except Exception as e:  # every call of the batch hears it; the server goes on
                for _, done in calls:
                    done.set_exception(e)
                continue
            self.rows_scored += len(rows)
            start = 0
            for call_rows, done in calls:
                done.set_result(scores[start : start + len(call_rows)])
                start += len(call_rows)


class RewardServicer(reward_pb2_grpc.RewardServiceServicer):
    def __init__(self, model: LoadedRewardModel, model_path: str, batcher: RowBatcher):
        self.model, self.model_path, self.batcher = model, model_path, batcher

    def Score(self, request: reward_pb2.ScoreRequest, context: Any) -> reward_pb2.ScoreResponse:
        n = len(request.prompts)
        require(
            len(request.completions) == n, "completions",
            f"{len(request.completions)} completions for {n} prompts: give one per prompt",
        )  # fmt: skip
        require(n <= MAX_ROWS_PER_CALL, "prompts", f"{n} rows; at most {MAX_ROWS_PER_CALL} per call")
        if n == 0:
            return reward_pb2.ScoreResponse()
        fmt = prompt_format_from_proto(request.prompt_format)
        try:
            rows = self.model.encode(fmt, list(request.prompts), list(request.completions))
        except Exception as e:  # a chat template that cannot render these messages
            raise InvalidArgument("prompt_format", f"cannot render the prompts: {e}") from None
        return reward_pb2.ScoreResponse(scores=self.batcher.score(rows))

    def GetInfo(self, request: reward_pb2.GetRewardInfoRequest, context: Any) -> reward_pb2.RewardInfo:
        return reward_pb2.RewardInfo(
            model_path=self.model_path, batch_size=self.batcher.batch_size, batch_wait_s=self.batcher.batch_wait_s,
            device=self.model.device, rows_scored=self.batcher.rows_scored,
        )  # fmt: skip


def reward_service(servicer: RewardServicer) -> Service:
    return Service(SERVICE_NAME, servicer, reward_pb2_grpc.add_RewardServiceServicer_to_server)


def serve_main(args: argparse.Namespace) -> int:
    """`rlcore reward-model serve`: load the model, serve until SIGINT/SIGTERM; the exit code."""
    try:
        token = read_token(args.token_env)
        tls = tls_from_args(args)
    except ValueError as e:
        return usage_error(str(e))
    assert token is not None  # required
    if args.batch_size < 1 or args.batch_wait_ms < 0:
        return usage_error("--batch-size must be >= 1 and --batch-wait-ms >= 0")
    if not os.path.isfile(os.path.join(args.model, "config.json")):
        return usage_error(f"--model {args.model}: not a model folder (no config.json there)")
    try:
        model = LoadedRewardModel(args.model)
    except (OSError, ValueError) as e:
        return usage_error(f"--model {args.model}: {str(e).splitlines()[0]}".replace("reward_model.path: ", ""))
    batcher = RowBatcher(model, args.batch_size, args.batch_wait_ms / 1000.0)
    options = ServerOptions(
        token=token, host=args.host, port=args.port, max_message_bytes=args.max_message_mb * MiB, tls=tls
    )
    try:
        server = RpcServer(options, [reward_service(RewardServicer(model, args.model, batcher))])
    except OSError as e:
        return usage_error(str(e))
    signals = StopSignals().install()
    try:
        if args.port_file:
            write_atomic(args.port_file, server.address)
        print(f"rlcore: reward model {args.model} serving on {server.address} ({model.device})", flush=True)
        signals.wait()
    finally:
        server.stop()
        batcher.close()
        signals.restore()
    return 0
