"""Tinker's training data on the wire (the SDK's `tinker_public` protobuf: ForwardBackwardRequest in,
ForwardBackwardOutput and SampleResponse out) against rlcore's trainer requests.

A Tinker datum is a next-token layout: `model_input` holds tokens t_0..t_{N-1} and every
`loss_fn_inputs` tensor has N entries, entry i about predicting `target_tokens[i]` from t_0..t_i.
rlcore scores a sequence as prompt + response, each response token given everything before it; a
datum whose targets are its inputs shifted by one (what every Tinker loop builds) is the sequence
t_0..t_{N-1}, target_{N-1} with prompt [t_0] and response t_1..t_{N-1}, target_{N-1}: response token
i is target i. Targets that are not the next input are refused (one line naming the datum and the
position)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from .errors import UserError

INPUT_DTYPES = {1: np.float32, 2: np.int64}
"""tinker_public.DType values of request tensors: DTYPE_FLOAT32, DTYPE_INT64."""


@dataclass
class Datum:
    """One datum, decoded: its sequence (model input plus the last target) and its per-position
    inputs (target_tokens, weights, logprobs, advantages, ...) as float or int arrays of N entries."""

    tokens: list[int]
    inputs: dict[str, np.ndarray]

    @property
    def prompt(self) -> list[int]:
        return self.tokens[:1]

    @property
    def response(self) -> list[int]:
        return self.tokens[1:]


def tensor_array(t: Any, field: str) -> np.ndarray:
    """A request `Tensor` (dense or CSR) as a numpy array of its shape."""
    dtype = INPUT_DTYPES.get(t.dtype)
    if dtype is None:
        raise UserError(f"{field}: dtype {t.dtype} is not served (float32 or int64)")
    shape = tuple(int(d) for d in t.shape)
    if t.WhichOneof("encoding") == "sparse_csr":
        if len(shape) != 2:
            raise UserError(f"{field}: a sparse tensor must be 2-D; got shape {list(shape)}")
        csr = t.sparse_csr
        values = np.frombuffer(csr.values, dtype=dtype)
        crow = np.frombuffer(csr.crow_indices, dtype=np.int64)
        cols = np.frombuffer(csr.col_indices, dtype=np.int64)
        if len(crow) != shape[0] + 1 or len(cols) != len(values) or (len(cols) and cols.max() >= shape[1]):
            raise UserError(f"{field}: its sparse rows, columns and values do not agree with shape {list(shape)}")
        dense = np.zeros(shape, dtype=dtype)
        rows = np.repeat(np.arange(shape[0]), np.diff(crow))
        dense[rows, cols] = values
        return dense
    flat = np.frombuffer(t.dense, dtype=dtype)
    if flat.size != math.prod(shape):
        raise UserError(f"{field}: {flat.size} values for shape {list(shape)}")
    return flat.reshape(shape)


def decode_datums(request: Any, required: tuple[str, ...]) -> list[Datum]:
    """The request's datums, each checked: text chunks only, the `required` inputs present with one
    entry per input token, targets that are the next inputs, finite floats."""
    if not request.data:
        raise UserError("data: must hold at least one datum")
    try:
        return [_decode(d, msg, request.loss_fn, required) for d, msg in enumerate(request.data)]
    except ValueError as e:  # bytes of a length their dtype cannot have, malformed sparse indices
        raise UserError(f"data: {e}") from None


def _decode(d: int, msg: Any, loss_fn: str, required: tuple[str, ...]) -> Datum:
    where = f"data[{d}]"
    tokens: list[int] = []
    for c, chunk in enumerate(msg.model_input):
        kind = chunk.WhichOneof("chunk")
        if kind != "encoded_text":
            raise UserError(f"{where}.model_input[{c}]: {kind} chunks are not served (text tokens only)")
        tokens.extend(np.frombuffer(chunk.encoded_text.tokens, dtype="<i4").tolist())
    n = len(tokens)
    if n == 0:
        raise UserError(f"{where}.model_input: holds no tokens")
    inputs = {}
    for name, tensor in msg.loss_fn_inputs.items():
        array = tensor_array(tensor, f"{where}.loss_fn_inputs.{name}")
        if array.ndim != 1 or array.shape[0] != n:
            raise UserError(
                f"{where}.loss_fn_inputs.{name}: shape {list(array.shape)}; it needs one entry per "
                f"model_input token ([{n}])"
            )
        if array.dtype == np.float32 and not np.isfinite(array).all():
            raise UserError(f"{where}.loss_fn_inputs.{name}: values must be finite")
        inputs[name] = array
    missing = [k for k in required if k not in inputs]
    if missing:
        raise UserError(f"{where}.loss_fn_inputs: {', '.join(missing)} missing (loss {loss_fn} needs "
                        f"{', '.join(required)})")  # fmt: skip
    targets = inputs["target_tokens"].astype(np.int64)
    shifted = np.asarray(tokens[1:], dtype=np.int64)
    if not np.array_equal(targets[:-1], shifted):
        i = int(np.argmax(targets[:-1] != shifted))
        raise UserError(
            f"{where}.loss_fn_inputs.target_tokens[{i}] is {targets[i]}, not the next input token "
            f"{shifted[i]}: rlcore trains next-token targets (target i = model_input token i + 1)"
        )
    return Datum(tokens + [int(targets[-1])], inputs)


def loss_config(request: Any) -> dict[str, float]:
    """loss_fn_config_v2 (numbers), else loss_fn_config; a text value is refused."""
    if request.loss_fn_config_v2:
        out = {}
        for k, v in request.loss_fn_config_v2.items():
            if v.WhichOneof("value") != "number":
                raise UserError(f"loss_fn_config.{k}: a text value is not served (numbers only)")
            out[k] = v.number
        return out
    return dict(request.loss_fn_config)


def _batched(pb: Any, rows: list[list[float]]) -> Any:
    """Per-datum float32 vectors as one BatchedTensor (data concatenated, byte offsets)."""
    arrays = [np.asarray(r, dtype="<f4") for r in rows]
    offsets = np.cumsum([0] + [a.nbytes for a in arrays]).astype("<i8")
    data = b"".join(a.tobytes() for a in arrays)
    return pb.BatchedTensor(data=data, offsets=offsets.tobytes(), dtype=pb.DTYPE_FLOAT32)


def forward_backward_output(logprobs: list[list[float]], metrics: dict[str, float]) -> bytes:
    """ForwardBackwardOutput: each datum's target log-probs, and the metrics (`name:reduction`)."""
    from tinker.proto import tinker_public_pb2 as pb

    record = pb.ArrayRecord(num_datums=len(logprobs), fields={"logprobs": _batched(pb, logprobs)})
    out = pb.ForwardBackwardOutput(loss_fn_output_type="ArrayRecord", loss_fn_outputs=[record], metrics=metrics)
    return bytes(out.SerializeToString())


@dataclass
class Sampled:
    tokens: list[int]
    logprobs: list[float]
    stopped: bool
    """Ended on a stop token or string (else: it reached max_tokens)."""


@dataclass
class PromptTopk:
    """The k likeliest tokens after each prompt prefix prompt[:i], i >= 1: [positions - 1, k] each."""

    token_ids: np.ndarray
    logprobs: np.ndarray


TOPK_EMPTY = (0, -99999.0)
"""The SDK's (token id, log-prob) of a position without top-k entries (tinker.types.topk_logprobs)."""


def sample_response(
    sequences: list[Sampled], prompt_logprobs: list[float] | None, topk: PromptTopk | None = None
) -> bytes:
    """SampleResponse: each sequence's tokens and log-probs; prompt log-probs (NaN at position 0);
    the prompt's top-k (position 0 empty)."""
    from tinker.proto import tinker_public_pb2 as pb

    out = pb.SampleResponse(
        sequences=[
            pb.SampledSequence(
                stop_reason=pb.STOP_REASON_STOP if s.stopped else pb.STOP_REASON_LENGTH,
                tokens=np.asarray(s.tokens, dtype="<i4").tobytes(),
                logprobs=np.asarray(s.logprobs, dtype="<f4").tobytes(),
            )
            for s in sequences
        ]
    )
    if prompt_logprobs is not None:
        out.prompt_logprobs = np.asarray([math.nan, *prompt_logprobs], dtype="<f4").tobytes()
    if topk is not None:
        k = topk.token_ids.shape[1]
        ids = np.concatenate([np.full((1, k), TOPK_EMPTY[0]), topk.token_ids]).astype("<i4")
        lps = np.concatenate([np.full((1, k), TOPK_EMPTY[1]), topk.logprobs]).astype("<f4")
        out.topk_prompt_logprobs.CopyFrom(
            pb.TopkLogprobs(token_ids=ids.tobytes(), logprobs=lps.tobytes(), k=k, length=len(ids))
        )
    return bytes(out.SerializeToString())
