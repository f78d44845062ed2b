"""rlcore's client SDK: typed, blocking and asyncio clients of the control-plane services.

    from rlcore.client import ClientOptions, RolloutClient
    with RolloutClient("127.0.0.1:50051", ClientOptions(token=os.environ["RLCORE_TOKEN"])) as c:
        result = c.generate(["1+2="], SamplingParams(max_tokens=8, temperature=0))

Every call has a deadline (ClientOptions.timeout or the call's `timeout=`), is retried with
exponential backoff while the server answers UNAVAILABLE, and fails with RpcError(code, details).
"""

from .base import AsyncClient, BlockingClient, ClientOptions, RpcError
from .rollout import AsyncRolloutClient, GenerateResult, RolloutClient, StreamedCompletion
from .run import AsyncRunClient, MetricsRecord, RunClient, RunStatus
from .trainer import (
    AsyncTrainerClient,
    ForwardBackwardResult,
    OptimStepResult,
    TrainerClient,
    TrainSequence,
    TrainStepResult,
)

__all__ = [
    "AsyncClient", "AsyncRolloutClient", "AsyncRunClient", "AsyncTrainerClient", "BlockingClient",
    "ClientOptions", "ForwardBackwardResult", "GenerateResult", "MetricsRecord", "OptimStepResult",
    "RolloutClient", "RpcError", "RunClient", "RunStatus", "StreamedCompletion", "TrainSequence",
    "TrainStepResult", "TrainerClient",
]  # fmt: skip
