"""The step progress bar: absolute steps, the postfix numbers, resumed runs."""

from __future__ import annotations

import io

from rlcore.core.monitor.progress import StepProgress


def last_render(out: io.StringIO) -> str:
    return out.getvalue().replace("\n", "\r").split("\r")[-2]  # tqdm redraws with \r; ends with \n on close


def test_progress_renders_step_total_and_postfix() -> None:
    out = io.StringIO()
    bar = StepProgress(total=10, desc="grpo", file=out)
    bar.update(
        1,
        {
            "rollout/reward_mean": 0.5,
            "actor/loss": 0.1234567,
            "actor/kl_loss": 0.002,
            "perf/tokens_per_s": 12345.6,
        },
    )
    bar.update(2, {"eval/arith/accuracy": 1.0})  # no training numbers: the last ones stay shown
    bar.close()
    line = last_render(out)
    assert line.startswith("grpo:  20%")
    assert " 2/10 " in line
    # 0.1234567 -> 0.1235 (4 significant digits), 12345.6 -> 12.3k
    assert line.endswith("reward=0.5, loss=0.1235, kl=0.002, tok/s=12.3k]")


def test_progress_sft_loss_and_unknown_total() -> None:
    out = io.StringIO()
    bar = StepProgress(total=None, desc="sft", file=out)
    bar.update(1, {"sft/loss": 2.5})
    bar.update(2, {"sft/loss": 2.25})
    bar.close()
    line = last_render(out)
    assert line.startswith("sft: 2step")
    assert line.endswith("loss=2.25]")


def test_resumed_run_starts_the_bar_at_the_resumed_step() -> None:
    out = io.StringIO()
    bar = StepProgress(total=100, desc="grpo", file=out)
    bar.update(51, {"actor/loss": 1.0})  # steps 1..50 ran before the resume
    assert bar.bar.n == 51
    assert bar.bar.format_dict["initial"] == 50  # the rate counts only this process's steps
    bar.close()
    assert " 51/100 " in last_render(out)


def test_the_final_step_is_drawn_once() -> None:
    """The last step's bar is drawn by close() only: a log of the run (a pipe, `tee`) shows it once."""
    out = io.StringIO()
    bar = StepProgress(total=3, desc="rl", file=out)
    bar.bar.mininterval = bar.bar.miniters = 0  # every update draws (a slow run's steps do)
    for step in (1, 2, 3):
        bar.update(step, {"actor/loss": float(step)})
    bar.close()
    drawn = [part for part in out.getvalue().replace("\n", "\r").split("\r") if part.startswith("rl: 100%")]
    assert len(drawn) == 1 and drawn[0].rstrip().endswith("loss=3]"), drawn  # tqdm pads a shorter line
