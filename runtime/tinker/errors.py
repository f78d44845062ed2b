"""What goes wrong in a Tinker request, in the shapes the SDK raises as its own exceptions."""

from __future__ import annotations


class UserError(Exception):
    """Bad input from the client: a 400 on the request itself, or a failed future of category
    "user" (the SDK raises RequestFailedError); one line naming the field and what is allowed."""


class NotFound(Exception):
    """An unknown model, session, sampler, checkpoint or future: a 404."""
