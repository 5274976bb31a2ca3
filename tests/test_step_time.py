"""Where the step time goes, proved with a known fault on one of 2 gloo ranks: each shows up in the right part, on
the right rank, by about its size (metrics.csv's ``time/<part>/rank<k>``, summed over the run's epochs).

Marked ``alone``: ``make test`` runs these after the rest, one at a time, so no other test shares the 2 cores; the
delay (0.5 s a step) is over 100 times the step's own jitter here (a step of the mlp at batch 32 takes a few ms), and
a window's 20 % (0.2 s) over 4 times what load once took from a window's wait (44 ms at a delay of 0.1 s:
docs/testing.md, "Fault tests under load"), so they pass with a CPU hog on one of the two cores. What load could move
is kept out of the numbers: the ranks leave ``on_train_start`` together (tests.recorder.AlignedStart), where rank 0's
start-up work put it up to 0.3 s behind or ahead of rank 1 at the first step.

A part the fault goes to is held to the fault's size within 20 % on both sides: below, the breakdown lost some of it
(or put it in another part); above, it took in time that is not the fault's. A part the fault must not reach is
bounded above only, by a fifth of the fault's size."""

import math
import re

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.custom_scalar import layout_pb2

from callbacks.run_record import read_rows
from callbacks.step_time import PARTS
from tests.conftest import run_dir, run_train

pytestmark = [pytest.mark.multiprocess, pytest.mark.alone]

DELAY_S = 0.5
EPOCHS = 2
STEPS = EPOCHS * 4  # 256 images / (2 ranks x 32) per epoch


def run(tmp_path, fashion_root, *extra, strategy="ddp") -> dict:
    """A 2-rank run of the mlp; its parts per rank, summed over the epochs, and its epoch lines' breakdown."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    result = run_train(["--strategy", strategy, "--devices", "2", "--accelerator", "cpu", "--network", "mlp",
                        "--batch_size", "32", "--epochs", str(EPOCHS), "--data_dir", str(fashion_root),
                        "--test_after_fit", "false", "--data.num_workers", "0",
                        "--trainer.callbacks+=tests.recorder.AlignedStart", *extra], cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [line for line in result.stdout.splitlines() if line.startswith("Step time (")]
    assert len(lines) == EPOCHS, result.stdout
    sums, slowest, lead_s = {}, [], []
    rows = read_rows(run_dir(tmp_path) / "metrics.csv")
    for row in rows:
        for key, text in row.items():
            if key.startswith("time/") and key.count("/") == 2 and text:
                sums[key] = sums.get(key, 0.0) + float(text)
        if row.get("time/slowest_rank"):
            slowest.append((int(float(row["time/slowest_rank"])), float(row["time/slowest_lead"])))
            busy = [sum(float(row[f"time/{part}/rank{rank}"]) for part in PARTS) - float(row[f"time/wait/rank{rank}"])
                    for rank in (0, 1)]
            lead_s.append(slowest[-1][1] * sum(busy) / 2)  # the lead in seconds: over the median (of 2: the mean)
    parts = {rank: {part: sums[f"time/{part}/rank{rank}"] for part in PARTS} for rank in (0, 1)}
    windows = [row for row in rows if row.get("window/wait/rank0")]
    return {"parts": parts, "slowest": slowest, "lead_s": lead_s, "lines": lines, "windows": windows,
            "wall": {r: sum(p.values()) for r, p in parts.items()}}


def test_a_rank_slower_by_a_known_delay_makes_the_other_wait_that_long(tmp_path, fashion_root):
    slow = run(tmp_path, fashion_root, "--trainer.callbacks+=tests.recorder.SlowRank",
               f"--trainer.callbacks.seconds={DELAY_S}", "--check_every_n_steps", "2")
    expected = DELAY_S * STEPS
    rank0, rank1 = slow["parts"][0], slow["parts"][1]
    assert rank0["wait"] == pytest.approx(expected, rel=0.2), slow
    assert rank1["wait"] < 0.2 * expected, slow
    assert rank1["backward"] - rank0["backward"] == pytest.approx(expected, rel=0.2), slow  # where rank 1 spent it
    assert [rank for rank, _ in slow["slowest"]] == [1] * EPOCHS, slow
    assert all(line.startswith("Step time (slowest rank 1, +") for line in slow["lines"]), slow["lines"]
    # per window between decision points (every 2 steps): 2 windows an epoch, each with 2 steps' delay, the first
    # too (the start is aligned); a window holding a step too few or too many (1 or 3 delays) is outside 20 %
    windows = slow["windows"]
    assert [int(float(row["step"])) for row in windows] == [1, 3, 5, 7], windows
    for row in windows:
        assert float(row["window/wait/rank0"]) == pytest.approx(2 * DELAY_S, rel=0.2), row
        assert float(row["window/wait/rank1"]) < 0.2 * 2 * DELAY_S and row["window/slowest_rank"] == "1.0", row


def test_a_slower_data_loader_on_one_rank_shows_as_its_data_time_not_its_compute(tmp_path, fashion_root):
    clean = run(tmp_path / "clean", fashion_root)
    slow = run(tmp_path / "slow", fashion_root, "--trainer.callbacks+=tests.recorder.SlowData",
               f"--trainer.callbacks.seconds={DELAY_S}")
    expected = DELAY_S * STEPS
    assert slow["parts"][1]["data"] - clean["parts"][1]["data"] == pytest.approx(expected, rel=0.2), (clean, slow)
    compute = lambda r: r["forward"] + r["backward"]  # noqa: E731
    assert abs(compute(slow["parts"][1]) - compute(clean["parts"][1])) < 0.2 * expected, (clean, slow)
    # rank 0 waits for it: 7 to 8 delays, as one delay of the first epoch can meet as much work that rank 0 does
    # alone in that step (with a CPU hog on the other core: 0.71 s, its first epoch's windows 3 delays, the second's 4)
    assert slow["parts"][0]["wait"] == pytest.approx(expected, rel=0.2), slow


def test_a_slower_all_reduce_shows_as_comm_on_both_ranks_and_no_straggler(tmp_path, fashion_root):
    clean = run(tmp_path / "clean", fashion_root)
    slow = run(tmp_path / "slow", fashion_root, "--trainer.callbacks+=tests.recorder.SlowAllReduce",
               f"--trainer.callbacks.seconds={DELAY_S}")
    expected = DELAY_S * STEPS
    for rank in (0, 1):
        assert slow["parts"][rank]["comm"] - clean["parts"][rank]["comm"] == pytest.approx(expected, rel=0.2), \
            (rank, clean, slow)
    # no straggler: a slow link slows every rank alike, so no rank's lead holds a fifth of the epoch's delay. In
    # seconds, not as a share of the step: load stretches each rank's few ms of own work a step, not the delay (with
    # a CPU hog and a load average near 8: a lead of 7 %, 0.19 s, at a delay of 0.5 s)
    assert all(seconds < 0.2 * expected / EPOCHS for seconds in slow["lead_s"]), slow


def test_under_fsdp_its_collectives_are_comm_and_a_slower_rank_makes_the_other_wait_that_long(tmp_path, fashion_root):
    """fsdp's all-gathers and reduce-scatters run inside forward and backward; timed, they leave them for ``comm``,
    and the wait in them is estimated (each rank's excess over the shortest rank's, per step)."""
    clean = run(tmp_path / "clean", fashion_root, strategy="fsdp")
    slow = run(tmp_path / "slow", fashion_root, "--trainer.callbacks+=tests.recorder.SlowRank",
               f"--trainer.callbacks.seconds={DELAY_S}", strategy="fsdp")
    expected = DELAY_S * STEPS
    for rank in (0, 1):  # other, what no part claims: at most 5 % (0.1-1.3 % with a CPU hog on the other core)
        assert clean["parts"][rank]["comm"] > 0 and clean["parts"][rank]["other"] <= 0.05 * clean["wall"][rank], clean
    assert slow["parts"][0]["wait"] == pytest.approx(expected, rel=0.2), slow
    assert slow["parts"][1]["wait"] < 0.2 * expected and abs(slow["parts"][0]["comm"] - slow["parts"][1]["comm"]) < \
        0.2 * expected, slow
    assert slow["parts"][1]["backward"] - slow["parts"][0]["backward"] == pytest.approx(expected, rel=0.2), slow
    assert [rank for rank, _ in slow["slowest"]] == [1] * EPOCHS, slow
    assert all("comm/wait estimated" in line for line in slow["lines"]), slow["lines"]


def test_on_a_clean_run_the_parts_add_up_and_other_is_at_most_5_percent(tmp_path, fashion_root):
    clean = run(tmp_path, fashion_root, "--trainer.log_every_n_steps", "2")  # windows of images/sec: the page's
    for rank in (0, 1):
        parts = clean["parts"][rank]
        assert all(seconds >= 0 and math.isfinite(seconds) for seconds in parts.values()), parts
        assert parts["other"] <= 0.05 * clean["wall"][rank], parts  # what no part claims (see the fsdp test)
        assert parts["comm"] > 0 and parts["forward"] > 0 and parts["backward"] > 0, parts
    # TensorBoard: the custom-scalars page's every chart matches tags the run logged
    events = EventAccumulator(str(run_dir(tmp_path)), size_guidance={"tensors": 0})
    events.Reload()
    (config,) = events.Tensors("custom_scalars__config__")
    layout = layout_pb2.Layout.FromString(config.tensor_proto.string_val[0])
    scalars = events.Tags()["scalars"]
    charts = [chart for category in layout.category for chart in category.chart]
    # images/sec twice, FLOP/s and MFU (the CPU probe's peak), accuracy, loss; and each part per window, comm and
    # wait included with 2 ranks
    assert len(charts) == 6 + len(PARTS), layout
    for chart in charts:
        margin = chart.margin.series[0] if chart.HasField("margin") else None
        tags = [f"^{margin.value}$", f"^{margin.lower}$", f"^{margin.upper}$"] if margin else chart.multiline.tag
        for pattern in tags:
            assert [tag for tag in scalars if re.search(pattern, tag)], (chart.title, pattern, scalars)
    assert {tag for tag in scalars if re.search(r"^time/wait/rank\d+$", tag)} == {"time/wait/rank0", "time/wait/rank1"}
