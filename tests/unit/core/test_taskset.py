import json
import os

import pytest

from rlcore.core.config.schema import FormatConfig, TasksetConfig
from rlcore.core.data.synthetic import FILLER, write_arithmetic_taskset
from rlcore.core.data.taskset import TaskStream, ensure_taskset, load_tasks


def write_rows(path, rows):
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")


def test_jsonl_and_parquet_load_with_custom_keys(tmp_path):
    rows = [{"q": f"{i}+1=", "sol": str(i + 1), "extra": i} for i in range(5)]
    write_rows(tmp_path / "t.jsonl", rows)
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "t.parquet")
    fmt = FormatConfig(prompt_key="q", answer_key="sol")
    for name in ("t.jsonl", "t.parquet"):
        tasks = load_tasks(
            TasksetConfig(name="x", path=str(tmp_path / name), format=fmt, num_samples=3), "ts"
        )
        assert [t.prompt for t in tasks] == ["0+1=", "1+1=", "2+1="]
        assert [t.answer for t in tasks] == ["1", "2", "3"]
        assert tasks[0].response is None and tasks[2].metadata == {"extra": 2}
        assert tasks[1].task_id == "x-1"


@pytest.mark.parametrize("name", ["t.jsonl.gz", "t.json.bz2", "t.csv.xz"])
def test_compressed_files_load_and_check_like_plain_ones(tmp_path, name):
    """`datasets` reads them (and the checker the launch runs first reads every row of them)."""
    import bz2
    import csv
    import gzip
    import io
    import lzma

    from rlcore.core.data.taskset_check import TasksetError, check_taskset

    rows = [{"prompt": f"{i}+1=", "answer": str(i + 1)} for i in range(4)]
    if name.startswith("t.csv"):
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, fieldnames=["prompt", "answer"])
        writer.writeheader()
        writer.writerows(rows)
        text = buffer.getvalue()
    else:
        text = "".join(json.dumps(r) + "\n" for r in rows)
    opener = {"gz": gzip.open, "bz2": bz2.open, "xz": lzma.open}[name.rsplit(".", 1)[1]]
    with opener(tmp_path / name, "wt") as f:
        f.write(text)
    ts = TasksetConfig(name="x", path=str(tmp_path / name))
    assert [t.answer for t in load_tasks(ts, "ts")] == ["1", "2", "3", "4"]
    assert check_taskset(ts, "ts", needs_answer=True, needs_response=False) == 4
    (tmp_path / "t.parquet.gz").write_bytes(b"")
    with pytest.raises(TasksetError, match=r"unsupported file type of .*t\.parquet\.gz; use one of \.jsonl"):
        check_taskset(
            TasksetConfig(path=str(tmp_path / "t.parquet.gz")), "ts", needs_answer=False, needs_response=False
        )


def test_missing_prompt_column_names_the_key(tmp_path):
    write_rows(tmp_path / "t.jsonl", [{"question": "a"}])
    with pytest.raises(
        ValueError, match=r"ts\.format\.prompt_key: column 'prompt' not in .*columns: question"
    ):
        load_tasks(TasksetConfig(path=str(tmp_path / "t.jsonl")), "ts")


def test_stream_is_seeded_per_epoch_and_resumable_by_index(tmp_path):
    write_rows(tmp_path / "t.jsonl", [{"prompt": str(i)} for i in range(10)])
    tasks = load_tasks(TasksetConfig(path=str(tmp_path / "t.jsonl")), "ts")
    a, b = TaskStream(tasks, 4, seed=1, shuffle=True), TaskStream(tasks, 4, seed=1, shuffle=True)
    assert a.batches_per_epoch == 2  # the incomplete third batch is dropped
    epoch0 = [t.prompt for i in range(2) for t in a.batch(i)]
    assert len(set(epoch0)) == 8  # no repeats inside an epoch
    assert [t.prompt for t in a.batch(3)] == [t.prompt for t in b.batch(3)]  # position = index only
    assert [t.prompt for t in a.batch(2)] != [t.prompt for t in a.batch(0)]  # reshuffled next epoch
    assert [t.prompt for t in TaskStream(tasks, 4, 1, shuffle=False).batch(1)] == ["4", "5", "6", "7"]


def test_generator_writes_disjoint_train_and_test(tmp_path):
    train, test = tmp_path / "train.jsonl", tmp_path / "test.jsonl"
    ensure_taskset(
        TasksetConfig(
            path=str(train), generator="arithmetic", generator_args={"num_tasks": 80, "max_operand": 9}
        ),
        "ts",
    )
    write_arithmetic_taskset(str(test), part="test", num_tasks=20, max_operand=9)
    tr = {json.loads(line)["prompt"] for line in open(train)}
    te = [json.loads(line) for line in open(test)]
    assert len(tr) == 80 and len(te) == 20 and not tr & {r["prompt"] for r in te}
    a, b = te[0]["prompt"].rstrip("=").split("+")
    assert (
        te[0]["answer"] == str(int(a) + int(b)) and te[0]["response"] == f"<answer>{te[0]['answer']}</answer>"
    )
    with pytest.raises(
        ValueError, match=r"ts\.generator_args: num_tasks \(999\) exceeds the 80 train problems"
    ):
        ensure_taskset(
            TasksetConfig(
                path=str(tmp_path / "x.jsonl"),
                generator="arithmetic",
                generator_args={"num_tasks": 999, "max_operand": 9},
            ),
            "ts",
        )


def test_sloppy_demonstrations_forget_carries_but_keep_true_answers(tmp_path):
    from rlcore.core.data.synthetic import _sum_without_carry

    assert (
        _sum_without_carry(27, 15) == 32
        and _sum_without_carry(48, 5) == 43
        and _sum_without_carry(12, 3) == 15
    )
    path = tmp_path / "demos.jsonl"
    write_arithmetic_taskset(str(path), num_tasks=50, max_operand=49, copies=4, wrong_fraction=0.5, seed=3)
    rows = [json.loads(line) for line in open(path)]
    assert len(rows) == 200 and len({r["prompt"] for r in rows}) == 50
    for r in rows:
        a, b = map(int, r["prompt"].rstrip("=").split("+"))
        assert r["answer"] == str(a + b)  # rewards always see the truth
        shown = int(r["response"].removeprefix("<answer>").removesuffix("</answer>"))
        assert shown in (a + b, _sum_without_carry(a, b))
    carry_rows = [
        r
        for r in rows
        if int(r["answer"]) != _sum_without_carry(*map(int, r["prompt"].rstrip("=").split("+")))
    ]
    wrong = sum(r["response"] != f"<answer>{r['answer']}</answer>" for r in carry_rows)
    assert 0.3 < wrong / len(carry_rows) < 0.7


def test_arithmetic_demonstrations_may_show_their_working(tmp_path) -> None:
    """working_fraction: that share of the demonstrations write the ones column's sum before the
    answer; filler_fraction: that share open with words that say nothing (configs/length_penalty.yaml)."""
    worked = tmp_path / "worked.jsonl"
    write_arithmetic_taskset(str(worked), num_tasks=50, max_operand=49, copies=4, working_fraction=0.5, seed=3)
    rows = [json.loads(line) for line in open(worked)]
    shown = 0
    for r in rows:
        a, b = map(int, r["prompt"].rstrip("=").split("+"))
        working, _, answer = r["response"].rpartition("<answer>")
        assert answer == f"{a + b}</answer>"
        assert working in ("", f"{a % 10}+{b % 10}={a % 10 + b % 10} ")
        shown += bool(working)
    assert 0.35 < shown / len(rows) < 0.65
    filled = tmp_path / "filled.jsonl"
    write_arithmetic_taskset(str(filled), num_tasks=50, max_operand=49, copies=4, filler_fraction=0.5, seed=3)
    responses = [json.loads(line)["response"] for line in open(filled)]
    with_filler = [r for r in responses if r.startswith(FILLER)]
    assert 0.35 < len(with_filler) / len(responses) < 0.65
    assert all(r.removeprefix(FILLER).startswith("<answer>") for r in responses)
    with pytest.raises(ValueError, match=r"filler_fraction must be in \[0, 1\]; got -1"):
        write_arithmetic_taskset(str(filled), filler_fraction=-1)
    with pytest.raises(ValueError, match=r"working_fraction must be in \[0, 1\]; got 1.5"):
        write_arithmetic_taskset(str(worked), working_fraction=1.5)
    with pytest.raises(ValueError, match=r"working_fraction .* is defined for ops '\+' only"):
        write_arithmetic_taskset(str(worked), ops="*", working_fraction=0.5)


def test_near_miss_pairs_miss_by_one_or_ten_either_way(tmp_path) -> None:
    """A reward model's pairs (near_misses): the rejected answer is off by 1 or 10, as often too
    large as too small, so "the larger answer is right" does not tell them apart; without it the
    pairs are the sloppy ones they always were (never too large)."""

    def offsets(near: bool) -> list[int]:
        path = str(tmp_path / f"pairs_{near}.jsonl")
        write_arithmetic_taskset(path, num_tasks=400, max_operand=49, preference_pairs=True, near_misses=near)
        rows = [json.loads(line) for line in open(path)]
        assert all(r["chosen"] == f"<answer>{r['answer']}</answer>" for r in rows)
        return [int(r["rejected"][8:-9]) - int(r["answer"]) for r in rows]

    near = offsets(True)
    assert set(near) == {-10, -1, 1, 10}
    assert 0.4 < sum(d > 0 for d in near) / len(near) < 0.6
    assert max(offsets(False)) <= 1 and sum(d == -10 for d in offsets(False)) > 100  # sloppy: carries forgotten


def test_a_generated_taskset_is_not_reused_for_other_generator_args(tmp_path) -> None:
    """A generated file notes what wrote it: the same arguments reuse it, others are refused in one
    line (not read as if they had changed it); a file without a note is taken as it is."""
    path = str(tmp_path / "pairs.jsonl")

    def ensure(**args) -> None:
        ensure_taskset(TasksetConfig(path=path, generator="arithmetic", generator_args=args), "ts")

    ensure(num_tasks=8, max_operand=9)
    first = open(path).read()
    ensure(max_operand=9, num_tasks=8)  # the same arguments, in another order: reused
    assert open(path).read() == first
    with pytest.raises(ValueError, match=r"^ts\.path: '.*pairs\.jsonl' was generated by arithmetic with .*'num_tasks': 8.*"
                                         r"not with the generator_args given now .*'num_tasks': 16.*: delete it"):
        ensure(num_tasks=16, max_operand=9)
    os.remove(path + ".generator.json")
    ensure(num_tasks=16, max_operand=9)  # written by hand (or an older rlcore): taken as it is
    assert open(path).read() == first
