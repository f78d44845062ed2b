import subprocess
import sys

CODE = """
import time
from rlcore.core.watchdog import deadline
with deadline(0.5, "a weight sync", "synchronizer.sync_timeout"):
    {body}
print("finished")
"""


def test_stalled_work_becomes_a_clear_error_within_the_deadline():
    proc = subprocess.run(
        [sys.executable, "-c", CODE.format(body="time.sleep(30)")], capture_output=True, text=True, timeout=20
    )
    assert proc.returncode == 3
    first = proc.stderr.splitlines()[0]
    assert (
        first
        == "rlcore: error: a weight sync did not finish within 0.5 s (raise synchronizer.sync_timeout if it is just slow)"
    )
    assert "finished" not in proc.stdout


def test_work_inside_the_deadline_is_untouched():
    proc = subprocess.run(
        [sys.executable, "-c", CODE.format(body="time.sleep(0.01)")],
        capture_output=True,
        text=True,
        timeout=20,
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "finished"
