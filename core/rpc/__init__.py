"""gRPC plumbing shared by every rlcore server and client: security (token, TLS), server
construction (health, reflection, message limits, error mapping) and proto <-> dataclass conversion.
The services themselves live with what they serve (rollout/server.py, runtime/trainer_service.py,
runtime/run_service.py); the client SDK is `rlcore.client`."""
