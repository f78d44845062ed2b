"""Environments written for rlcore's tests against other libraries' interfaces (verifiers)."""
