"""The `monitor`, `control` (gRPC, TLS) and `log` sections."""

from __future__ import annotations

from dataclasses import dataclass, field

from .fields import bounded, choice


@dataclass
class MonitorConfig:
    monitor_type: list[str] = field(default_factory=lambda: ["console", "jsonl"])
    """Any of console, jsonl, tensorboard, wandb, mlflow."""
    log_completions: bool = False
    """Log a sample of each training step's rollouts: prompt, response (tool and environment turns
    included), reward and its components, finish reason and the workflow's counters (tool calls,
    turns), to completions.jsonl beside metrics.jsonl, a TensorBoard text table and a W&B table."""
    save_completions_probability: float = bounded(0.1, ge=0.0, le=1.0)
    """With log_completions: the chance each rollout is in the sample (drawn from the run's seed and
    the step, so a resumed run logs the same ones)."""


MONITOR_TYPES = ("console", "jsonl", "tensorboard", "wandb", "mlflow")


@dataclass
class TLSConfig:
    enabled: bool = False
    """Serve and call over TLS instead of plaintext."""
    cert_file: str | None = None
    """PEM certificate chain this process presents (servers; clients too under mutual TLS)."""
    key_file: str | None = None
    """PEM private key of cert_file."""
    ca_file: str | None = None
    """PEM CA bundle peers are verified against (clients check servers; servers check clients
    when require_client_cert)."""
    require_client_cert: bool = False
    """Mutual TLS: servers refuse clients without a certificate signed by ca_file."""
    server_name: str | None = None
    """Name clients expect in the server certificate when it differs from the host dialled."""


@dataclass
class ControlConfig:
    """The gRPC control plane: every server rlcore starts and every client it uses."""

    host: str = "127.0.0.1"
    """Interface servers bind (127.0.0.1: this machine only; 0.0.0.0: every interface)."""
    run_port: int = bounded(0, ge=0, le=65535)
    """Port of the launch process's RunService (0: any free port)."""
    token_env: str = "RLCORE_TOKEN"
    """Environment variable holding the shared token every RPC (but health) must carry; when it is
    unset, `rlcore launch` makes a random one for the processes it starts."""
    max_message_mb: int = bounded(64, gt=0, le=2047)
    """Largest gRPC message sent or received, in MiB (larger requests get RESOURCE_EXHAUSTED)."""
    rpc_timeout: float = bounded(600.0, gt=0.0)
    """Default deadline of one call in seconds (rollout calls use explorer.max_timeout)."""
    retry_attempts: int = bounded(5, ge=1)
    """Attempts of a call that fails with UNAVAILABLE (a server restarting or not up yet)."""
    retry_backoff: float = bounded(0.2, gt=0.0)
    """First wait between attempts in seconds; doubles each time, at most 5 s."""
    worker_start_timeout: float = bounded(300.0, gt=0.0)
    """Seconds rollout workers may take to start and register before the launch fails."""
    stop_grace_s: float = bounded(60.0, gt=0.0)
    """SIGINT or SIGTERM to `rlcore launch`: how long the run may take to finish its current step and
    write a checkpoint before its processes are ended (a second signal ends them at once)."""
    heartbeat_interval: float = bounded(5.0, gt=0.0)
    """Seconds between a rollout worker's heartbeats to the run; also the most a call from the trainer
    to a run controller that does not answer may cost a training step (after a failure it waits
    this long, doubling up to 12 times, before it tries again)."""
    tls: TLSConfig = field(default_factory=TLSConfig)


@dataclass
class LogConfig:
    level: str = choice("INFO", ("DEBUG", "INFO", "WARNING", "ERROR"))
    """The least severe log records printed (rlcore's loggers)."""
