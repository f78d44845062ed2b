"""rlcore speaks Tinker, both ways.

    server   `rlcore tinker serve` serves the API the official `tinker` SDK calls over an rlcore
             trainer world (serve.py, app.py, service.py; the SDK's data on the wire: wire.py; its
             losses as rlcore's: losses.py; sampling: sampler.py)
    client   trainer.remote tinker://...: rlcore's loop trains through a Tinker service
             (trainer.py, a TrainerHandle; its rollout workers sample with engine_type tinker,
             rollout/engines/tinker.py)
"""
