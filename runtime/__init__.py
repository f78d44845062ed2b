"""The roof: the loop (loop.py), the trainer world and its handles, the launcher, the services and
the rank entry points. It wires concrete parts of the sides (rlcore.rollout, rlcore.backends)
together through their lazy registries; nothing below imports it."""
