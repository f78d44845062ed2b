"""One line per failure (runtime/failure.py): a user-facing ValueError is never cut (its end says
what to do); a library's long error keeps its start and its end."""

from __future__ import annotations

from rlcore.runtime.failure import MAX_CHARS, one_line


def test_a_users_error_is_whole_and_a_librarys_keeps_both_ends() -> None:
    advice = "x " * 400 + "delete the last checkpoint folder and resume"
    assert one_line(ValueError(advice)) == " ".join(advice.split())
    long = RuntimeError("start " + "y" * 2000 + " the end\nwith a second line")
    line = one_line(long)
    assert len(line) <= MAX_CHARS + 5 and "\n" not in line
    assert line.startswith("RuntimeError: start yyy") and line.endswith("the end with a second line")
    assert one_line(KeyError()) == "KeyError: no message"
