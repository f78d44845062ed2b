"""rlcore speaks Tinker: `rlcore tinker serve` serves the API the official `tinker` SDK calls over
an rlcore trainer world (serve.py, app.py, service.py; the SDK's data on the wire: wire.py; its
losses as rlcore's: losses.py; sampling: sampler.py)."""
