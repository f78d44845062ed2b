"""Tinker's training data as rlcore reads it (runtime/tinker/wire.py, losses.py), built with the
SDK's own protobuf and datum conversion."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("tinker", reason="the Tinker SDK: pip install 'rlcore[tinker]'")
from tinker import types  # noqa: E402
from tinker.proto import tinker_public_pb2 as pb  # noqa: E402

from rlcore.runtime.tinker.errors import UserError  # noqa: E402
from rlcore.runtime.tinker.losses import loss_sum, plan_loss, required_inputs  # noqa: E402
from rlcore.runtime.tinker.wire import (  # noqa: E402
    PromptTopk,
    Sampled,
    decode_datums,
    forward_backward_output,
    sample_response,
    tensor_array,
)


def _request(inputs: dict[str, pb.Tensor], tokens: list[int], loss: str = "cross_entropy") -> pb.ForwardBackwardRequest:
    chunk = pb.Chunk(encoded_text=pb.EncodedTextChunk(tokens=np.asarray(tokens, "<i4").tobytes()))
    return pb.ForwardBackwardRequest(model_id="m", seq_id=1, loss_fn=loss,
                                     data=[pb.Datum(model_input=[chunk], loss_fn_inputs=inputs)])  # fmt: skip


def _dense(values: list[float], dtype: int = pb.DTYPE_FLOAT32) -> pb.Tensor:
    np_dtype = "<f4" if dtype == pb.DTYPE_FLOAT32 else "<i8"
    return pb.Tensor(dense=np.asarray(values, np_dtype).tobytes(), dtype=dtype, shape=[len(values)])


def test_a_next_token_datum_is_prompt_of_one_and_the_rest_as_response() -> None:
    request = _request({"target_tokens": _dense([6, 7, 8], pb.DTYPE_INT64), "weights": _dense([0, 1, 1])}, [5, 6, 7])
    (datum,) = decode_datums(request, required_inputs("cross_entropy"))
    assert (datum.prompt, datum.response) == ([5], [6, 7, 8])
    plan = plan_loss("cross_entropy", {}, [datum])
    assert plan.sequences[0].loss_mask == [0.0, 1.0, 1.0]
    assert loss_sum(plan, [[-1.0, -2.0, -3.0]]) == 5.0  # Tinker's sum: -(0*-1 + 1*-2 + 1*-3)


def test_targets_that_are_not_the_next_inputs_are_refused_naming_the_position() -> None:
    request = _request({"target_tokens": _dense([6, 9, 8], pb.DTYPE_INT64), "weights": _dense([1, 1, 1])}, [5, 6, 7])
    with pytest.raises(UserError, match=r"data\[0\]\.loss_fn_inputs\.target_tokens\[1\] is 9, not the next input token 7"):
        decode_datums(request, required_inputs("cross_entropy"))


def test_a_sparse_tensor_is_read_as_its_dense_form() -> None:
    dense = np.array([[0, 2, 0], [1, 0, 3]], dtype=np.float32)
    csr = pb.SparseCsr(values=np.asarray([2, 1, 3], "<f4").tobytes(), crow_indices=np.asarray([0, 1, 3], "<i8").tobytes(),
                       col_indices=np.asarray([1, 0, 2], "<i8").tobytes())  # fmt: skip
    assert np.array_equal(tensor_array(pb.Tensor(sparse_csr=csr, dtype=pb.DTYPE_FLOAT32, shape=[2, 3]), "x"), dense)


def test_policy_losses_take_their_clip_thresholds_and_refuse_other_keys() -> None:
    inputs = {"target_tokens": _dense([6, 7], pb.DTYPE_INT64), "logprobs": _dense([0, -1]), "advantages": _dense([0, 2])}
    datums = decode_datums(_request(inputs, [5, 6], "ppo"), required_inputs("ppo"))
    plan = plan_loss("ppo", {"clip_low_threshold": 0.9, "clip_high_threshold": 1.3}, datums)
    assert (plan.clip_ratio_low, plan.clip_ratio_high) == pytest.approx((0.1, 0.3))
    with pytest.raises(UserError, match="beta not taken by ppo"):
        plan_loss("ppo", {"beta": 0.1}, datums)
    with pytest.raises(UserError, match="loss_fn: dro is not served"):
        required_inputs("dro")


def test_the_output_decodes_in_the_sdk_as_each_datums_logprobs() -> None:
    from tinker.proto.response_conv import deserialize_forward_backward_output

    out = deserialize_forward_backward_output(forward_backward_output([[-1.0, -2.5], [-0.5]], {"loss:sum": 4.0}))
    assert isinstance(out, types.ForwardBackwardOutput) and out.metrics == {"loss:sum": 4.0}
    assert [o["logprobs"].tolist() for o in out.loss_fn_outputs] == [[-1.0, -2.5], [-0.5]]


def test_prompt_logprobs_and_their_top_k_decode_in_the_sdk_with_nothing_at_the_first_position() -> None:
    from tinker.proto.response_conv import deserialize_sample_response

    topk = PromptTopk(np.asarray([[7, 3], [2, 9]]), np.asarray([[-0.25, -1.5], [-0.5, -2.0]]))
    out = deserialize_sample_response(sample_response([Sampled([4, 5], [-0.1, -0.2], True)], [-1.0, -0.5], topk))
    assert out.prompt_logprobs == [None, -1.0, -0.5]
    assert out.topk_prompt_logprobs == [None, [(7, -0.25), (3, -1.5)], [(2, -0.5), (9, -2.0)]]
    assert out.sequences[0].tokens == [4, 5] and out.sequences[0].stop_reason == "stop"
    plain = deserialize_sample_response(sample_response([Sampled([4], [-0.1], False)], None))
    assert plain.prompt_logprobs is None and plain.topk_prompt_logprobs is None


def test_token_bytes_of_a_wrong_length_are_bad_input_not_a_server_error() -> None:
    request = _request({"target_tokens": _dense([6], pb.DTYPE_INT64), "weights": _dense([1])}, [5])
    request.data[0].model_input[0].encoded_text.tokens = b"\x05\x00\x00"  # 3 bytes: not int32s
    with pytest.raises(UserError, match="data: buffer size must be a multiple"):
        decode_datums(request, required_inputs("cross_entropy"))
