"""The step-time breakdown's arithmetic on synthetic marks (callbacks/step_time.py); with real ranks and known
faults: tests/test_step_time.py."""

import time

import pytest
import torch

from callbacks import ThroughputReport
from callbacks.run_record import MetricsCSV, read_rows
from callbacks.step_marks import HostClock, StepTimer
from callbacks.step_time import (PARTS, RankEpoch, StepMarks, combine, format_line, metrics, parts_of, split_wait,
                                 summarise)
from tests.unit.conftest import tiny_fit


def marks(start, data=0.01, forward=0.02, backward=0.03, span=0.01, gap=0.001, optimizer=0.004, first=0.01):
    """A synced batch: forward, backward up to the last bucket, ``span`` until backward returns, ``gap`` unclaimed,
    then the optimizer."""
    b = start + forward
    a = b + backward
    return StepMarks(data_s=data, start=start, before_backward=b, first_launch=a - first, arrival=a,
                     after_backward=a + span, before_optimizer=a + span + gap, end=a + span + gap + optimizer,
                     buckets=2, gradient_bytes=4000)


def test_a_ranks_batches_add_up_to_its_parts_and_the_rest_is_other():
    epoch = summarise([marks(0.0), marks(1.0)])
    assert {k: round(v, 6) for k, v in epoch.parts.items()} == {
        "data": 0.02, "forward": 0.04, "backward": 0.06, "comm": 0.02, "wait": 0.0, "optimizer": 0.008,
        "other": 0.002}
    assert epoch.arrivals == [0.05, 1.05] and epoch.spans == pytest.approx([0.01, 0.01])
    assert epoch.overlapped_s == pytest.approx(0.02) and (epoch.gradient_bytes, epoch.buckets) == (4000, 2)
    unsynced = summarise([StepMarks(data_s=0.0, start=0.0, before_backward=0.1, after_backward=0.3, end=0.3)])
    assert unsynced.parts["backward"] == pytest.approx(0.2) and unsynced.parts["comm"] == 0 and not unsynced.spans


def test_wait_is_the_latest_arrival_less_ones_own_on_one_host_and_estimated_across_hosts():
    arrivals = [[1.00, 2.00], [1.05, 2.00]]  # rank 1 arrives 50 ms late in step 1
    spans = [[0.06, 0.01], [0.01, 0.01]]  # rank 0 sat in the all-reduce 60 ms: 50 waiting, 10 transferring
    assert split_wait(arrivals, spans, same_clock=True) == pytest.approx([0.05, 0.0])
    assert split_wait(arrivals, spans, same_clock=False) == pytest.approx([0.05, 0.0])
    assert split_wait([[1.0], [1.5]], [[0.02], [0.01]], same_clock=True) == pytest.approx([0.02, 0.0])  # at most span
    nan = float("nan")
    assert split_wait([[1.0, nan], [1.0, 2.0]], [[0.01, nan], [0.01, 0.3]], True) == [0.0, 0.0]  # padding skipped


def test_the_epoch_over_ranks_names_the_slowest_its_lead_and_the_all_reduce_bandwidths():
    fast, slow = RankEpoch(), RankEpoch()
    fast.parts.update(forward=1.0, backward=1.0, comm=0.6)  # 0.5 s of it waiting
    slow.parts.update(forward=1.0, backward=1.5, comm=0.1)
    fast.arrivals, fast.spans, slow.arrivals, slow.spans = [1.0], [0.6], [1.5], [0.1]
    for epoch in (fast, slow):
        epoch.overlapped_s, epoch.gradient_bytes, epoch.buckets = 0.3, 10 ** 8, 4
    result = combine([fast, slow])
    assert result.ranks[0]["wait"] == pytest.approx(0.5) and result.ranks[0]["comm"] == pytest.approx(0.1)
    assert result.ranks[1]["wait"] == 0 and result.slowest_rank == 1
    assert result.slowest_lead == pytest.approx(2.6 / 2.35 - 1)  # busy 2.1 and 2.6: the median of two is 2.35
    assert result.hidden_share == pytest.approx(0.3 / 0.4)
    assert result.algbw_gbps == pytest.approx(1.0) and result.busbw_gbps == pytest.approx(1.0)  # 2(n-1)/n = 1
    values = metrics(result)
    assert values["time/wait/rank0"] == pytest.approx(0.5) and values["time/slowest_rank"] == 1
    ranked = {key for key in values if key.endswith("/rank1")}
    assert ranked == {f"time/{part}/rank1" for part in (*PARTS, "step_std_s")}
    assert (values["comm/gradient_bytes"], values["comm/buckets"]) == (10 ** 8, 4)
    assert format_line(result) == ("Step time (slowest rank 1, +11 % over the median): compute 87 %, comm 4 %, "
                                   "wait 10 %, data 0 %, optimizer 0 %, other 0 %")


def test_fsdps_collectives_are_comm_and_its_wait_is_estimated_as_the_excess_over_the_shortest_rank():
    def fsdp_step(scatter):  # an all-gather of 20 ms in forward, a reduce-scatter of ``scatter`` in backward
        return StepMarks(data_s=0.0, start=0.0, before_backward=0.1, after_backward=0.3, before_optimizer=0.3,
                         end=0.31, collectives=[(0.01, 0.03), (0.2, 0.2 + scatter)])

    early, late = summarise([fsdp_step(0.08)]), summarise([fsdp_step(0.02)])  # the early rank waited 60 ms
    assert early.parts["forward"] == pytest.approx(0.08) and early.parts["backward"] == pytest.approx(0.12)
    assert early.parts["comm"] == pytest.approx(0.10) and early.spans == pytest.approx([0.10])
    result = combine([early, late])  # one host, but no one arrival per rank: estimated
    assert result.ranks[0]["wait"] == pytest.approx(0.06) and result.ranks[0]["comm"] == pytest.approx(0.04)
    assert result.ranks[1]["wait"] == 0 and result.slowest_rank == 1 and result.algbw_gbps is None
    assert result.estimated and "over the median, comm/wait estimated)" in format_line(result)
    assert not {"comm/gradient_bytes", "comm/buckets"} & set(metrics(result))  # DDP's buckets: none under fsdp


def test_one_rank_logs_no_comm_wait_or_slowest_rank_that_would_always_be_0():
    alone = combine([summarise([StepMarks(data_s=0.01, start=0.0, before_backward=0.1, after_backward=0.3,
                                          before_optimizer=0.3, end=0.31)])])
    values = metrics(alone)
    assert parts_of(1) == ("data", "forward", "backward", "optimizer", "other") and parts_of(2) == PARTS
    assert {key for key in values if key.startswith("time/") and key.endswith("/rank0")} == {
        *(f"time/{part}/rank0" for part in parts_of(1)), "time/step_std_s/rank0"}
    assert not [key for key in values if key.startswith("comm/") or "slowest" in key], values
    assert sum(alone.ranks[0].values()) == pytest.approx(0.32)  # the parts left out were 0: the rest add up


class FakeBucket:
    def __init__(self, numel):
        self.tensor = torch.zeros(numel)

    def buffer(self):
        return self.tensor


def test_the_timer_wraps_the_runs_own_comm_hook_and_notes_each_bucket():
    now = iter([0.0, 0.5, 1.0, 1.2, 1.5, 1.6, 1.7, 1.8, 2.0, 2.1])
    timer = StepTimer(clock=HostClock(lambda: next(now)))
    calls = []

    def users_hook(state, bucket):
        calls.append(state)
        return "the user's future"

    hook = timer.wrap(users_hook)
    timer.start_epoch()           # 0.0
    timer.batch_start()           # 0.5: data 0.5
    timer.before_backward()       # 1.0
    assert hook("state", FakeBucket(10)) == "the user's future"  # 1.2: the first bucket
    hook("state", FakeBucket(5))  # 1.5: the last bucket, this rank's arrival
    timer.after_backward()        # 1.6
    timer.before_optimizer()      # 1.7
    timer.batch_end()             # 1.8
    epoch = timer.take_epoch()
    assert calls == ["state", "state"] and (epoch.buckets, epoch.gradient_bytes) == (2, 60)
    assert {k: round(v, 6) for k, v in epoch.parts.items()} == {
        "data": 0.5, "forward": 0.5, "backward": 0.5, "comm": 0.1, "wait": 0.0, "optimizer": 0.1, "other": 0.1}
    assert epoch.arrivals == [1.5] and epoch.overlapped_s == pytest.approx(0.3)


def test_each_window_between_decision_points_is_logged_at_its_step_and_the_windows_add_up_to_the_epoch(
        fashion_root, tmp_path):
    """8 steps an epoch, a decision every 3: windows of 3, 3 and 2 steps, logged at steps 2, 5 and 7."""
    logger = MetricsCSV(str(tmp_path), name="run", version=0)
    tiny_fit(fashion_root, tmp_path, [ThroughputReport(check_every_n_steps=3)], logger=logger, limit_val_batches=0)
    rows = read_rows(tmp_path / "run" / "version_0" / "metrics.csv")
    windows = [row for row in rows if row.get("window/data/rank0")]
    epoch = next(row for row in rows if row.get("time/data/rank0"))
    assert [int(row["step"]) for row in windows] == [2, 5, 7]
    assert not [key for key in rows[0] if "slowest" in key or "/comm/" in key or "/wait/" in key]  # one rank
    for part in parts_of(1):
        total = sum(float(row[f"window/{part}/rank0"]) for row in windows)
        assert total == pytest.approx(float(epoch[f"time/{part}/rank0"]), abs=1e-9), part
    assert float(epoch["time/forward/rank0"]) > 0


class LateMark:
    def __init__(self, seconds):
        self.at, self.passed = seconds, False


class LateClock(HostClock):
    """A device's clock as CudaEvents is: a mark is an event the device passes later (here: when the test says, or
    ``lag`` marks later), and reading one it has not passed raises, as ``elapsed_time`` of a pending CUDA event does."""

    shared_by_ranks = False
    polled = True  # as CudaEvents: its marks are polled at each batch's start

    def __init__(self, now=None, lag=None):
        super().__init__(now or time.monotonic)
        self.lag, self.made = lag, []

    def __call__(self):
        self.made.append(LateMark(self.now()))
        if self.lag is not None and len(self.made) > self.lag:
            self.made[-1 - self.lag].passed = True
        return self.made[-1]

    def ready(self, mark):
        return mark.passed

    def wait(self, mark):
        for made in self.made[:self.made.index(mark) + 1]:
            made.passed = True

    def seconds(self, mark):
        assert mark.passed, "read a mark the device has not passed: the host would wait"
        return mark.at


def test_a_device_clocks_marks_are_read_only_once_the_device_is_past_them_a_step_later_or_at_the_epochs_end():
    now = iter([0.0, 0.5, 1.0, 1.5, 1.6, 1.7, 1.8, 2.0, 2.1, 2.5, 2.6, 2.7, 2.8])
    clock = LateClock(lambda: next(now))
    timer = StepTimer(clock=clock)
    hook = timer.wrap(lambda state, bucket: None)
    timer.start_epoch()  # 0.0
    timer.batch_start()  # 0.5
    timer.before_backward()  # 1.0
    hook(None, FakeBucket(4))  # 1.5
    timer.after_backward(), timer.before_optimizer(), timer.batch_end()  # 1.6 1.7 1.8
    timer.batch_start()  # 2.0: the device is not past the first batch yet, so it stays unread
    assert timer.marks == []
    clock.wait(clock.made[-1])  # the device caught up: the first batch is read at the next batch's start
    timer.before_backward(), timer.after_backward(), timer.before_optimizer(), timer.batch_end()  # 2.1 2.5 2.6 2.7
    timer.batch_start()  # 2.8
    assert [m.start for m in timer.marks] == [0.5] and timer.marks[0].arrival == 1.5
    # the epoch's end waits for the device (its last mark): the rest is read there
    assert timer.take_epoch().parts["data"] == pytest.approx(0.5 + 0.2)  # 1.8 to 2.0: the device idle
    assert [m.start for m in timer.marks] == [0.5, 2.0]


def test_a_run_on_a_clock_read_late_reports_every_step_as_the_host_clock_does(fashion_root, tmp_path, monkeypatch):
    """The CUDA path's bookkeeping on CPU: ThroughputReport with a clock whose marks are readable two marks late
    (reading one early fails the run) records all 8 steps, their parts adding up to the epoch."""
    monkeypatch.setattr("callbacks.throughput.HostClock", lambda: LateClock(lag=2))
    report = ThroughputReport(check_every_n_steps=3)
    logger = MetricsCSV(str(tmp_path), name="run", version=0)
    tiny_fit(fashion_root, tmp_path, [report], logger=logger, limit_val_batches=0)
    marks = report.timer.marks
    assert isinstance(report.timer.clock, LateClock) and len(marks) == 8
    rows = read_rows(tmp_path / "run" / "version_0" / "metrics.csv")
    epoch = next(row for row in rows if row.get("time/data/rank0"))
    wall = sum(float(epoch[f"time/{part}/rank0"]) for part in parts_of(1))
    assert wall == pytest.approx(marks[-1].end - (marks[0].start - marks[0].data_s))  # the epoch's first mark to last
    assert float(epoch["time/forward/rank0"]) > 0 and [row["step"] for row in rows if row.get("window/data/rank0")] == [
        "2", "5", "7"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_cuda_events_time_the_gpus_work_and_are_read_without_waiting_for_it():
    from callbacks.step_marks import CudaEvents

    clock, x = CudaEvents(), torch.randn(4096, 4096, device="cuda")
    clock.start_epoch()
    before = clock()
    for _ in range(20):
        x = x @ x / 4096
    after = clock()
    assert not after.query()  # the host is ahead: a mark is not readable when made
    torch.cuda.synchronize()
    assert clock.ready(after) and clock.seconds(after) > clock.seconds(before) >= 0


def test_ddps_all_reduce_is_timed_through_its_public_comm_hook_unless_one_of_yours_is_registered():
    """``register_comm_hook`` on the wrapped model (DDP takes one: a second raises); neither DDP nor fsdp: nothing."""
    from types import SimpleNamespace

    from torch.nn.parallel import DistributedDataParallel

    from callbacks.step_marks import time_collectives

    registered = []

    def ddp(register):
        model = DistributedDataParallel.__new__(DistributedDataParallel)  # no process group: only its comm hook
        object.__setattr__(model, "register_comm_hook", register)
        return SimpleNamespace(model=model)

    timer = StepTimer(HostClock())
    assert time_collectives(timer, ddp(lambda state, hook: registered.append(hook)), torch.nn.Linear(1, 1)) == \
        "times DDP's all-reduce (its comm hook)"
    assert len(registered) == 1 and registered[0].__name__ == "timed"  # the timer's wrap of DDP's own all-reduce

    def taken(state, hook):
        raise RuntimeError("register_comm_hook or register_builtin_comm_hook can only be called once.")

    assert time_collectives(timer, ddp(taken), None) == "DDP's all-reduce untimed (a comm hook of your own: DDP takes one)"
    assert time_collectives(timer, SimpleNamespace(model=object()), torch.nn.Linear(1, 1)) == ""


@pytest.mark.parametrize("device, timed", [("cpu", True), ("cuda", False)])
def test_by_default_the_breakdown_runs_on_cpu_ranks_and_not_on_gpus_where_it_was_measured_to_cost(device, timed):
    from types import SimpleNamespace

    from lightning.pytorch.strategies import DDPStrategy

    report = ThroughputReport()
    report.setup(SimpleNamespace(strategy=DDPStrategy(parallel_devices=[torch.device(device, 0)])), None, "fit")
    assert (report.timer is not None) is timed


def test_the_breakdown_flag_reaches_throughput_report_through_the_config(workdir, fashion_root):
    """``--breakdown false`` (a top-level key, linked to the callback) turns it off where it would be on: a CPU rank."""
    import train

    code = train.main(["--data_dir", str(fashion_root), "--network", "mlp", "--epochs", "1", "--test_after_fit",
                       "false", "--breakdown", "false"])
    rows = read_rows(next((workdir / "runs").glob("*/*/metrics.csv")))
    assert code == 0 and any(row.get("throughput/images_per_sec") for row in rows)
    assert not any(key.startswith("time/forward/") for row in rows for key in row), rows[0].keys()


def test_a_timer_that_starts_mid_epoch_as_a_resumed_run_does_counts_no_data_wait_for_its_first_batch():
    now = iter([1.0, 1.0, 1.5, 1.6, 1.7, 1.8])
    timer = StepTimer(clock=HostClock(lambda: next(now)))
    timer.batch_start()  # no start_epoch: Lightning skips on_train_epoch_start on a mid-epoch resume
    timer.before_backward(), timer.after_backward(), timer.before_optimizer(), timer.batch_end()
    epoch = timer.take_epoch()
    assert epoch.parts["data"] == 0 and epoch.parts["backward"] == pytest.approx(0.1) and len(timer.marks) == 1


class PooledMark:
    def __init__(self, at):
        self.at, self.free = at, False


class PooledClock(HostClock):
    """CudaEvents' bookkeeping on the host: marks polled at each batch's start and given back to a pool once read;
    reading a mark that is back in the pool, or giving one back twice, fails the test (a reused event would hold
    another batch's time)."""

    polled, pooled = True, True

    def __init__(self, times):
        super().__init__(lambda: next(times))
        self.free, self.made = [], 0

    def __call__(self):
        mark = self.free.pop() if self.free else PooledMark(None)
        self.made += 0 if mark.at is not None or mark.free else 1
        mark.at, mark.free = self.now(), False
        return mark

    def seconds(self, mark):
        assert not mark.free, "read a mark already given back"
        return mark.at

    def release(self, mark):
        assert not mark.free, "gave a mark back twice"
        mark.free = True
        self.free.append(mark)


def test_on_a_gpu_one_batch_in_n_is_timed_from_the_end_of_the_batch_before_it_and_scaled_to_all_of_them():
    """The breakdown's GPU design on a scripted clock: with ``sample_every`` 3, batches 1, 4 and 7 of 7 are timed (5
    marks each, and one where the batch before ends), the others cost no mark; the parts are the timed batches' × 7/3;
    marks go back to the pool once read, so the clock makes a handful, not 5 per batch."""
    times = iter([float(t) for t in range(1000)])
    clock = PooledClock(times)
    timer = StepTimer(clock=clock, sample_every=3)
    timer.start_epoch()  # 0: the epoch's origin is the first batch's data start
    for batch in range(7):
        timer.batch_start()
        timer.before_backward(), timer.after_backward(), timer.before_optimizer()
        timer.batch_end()
    epoch = timer.take_epoch()
    assert len(timer.marks) == 3 and timer.batches == 7
    assert [m.data_s for m in timer.marks] == [1.0, 1.0, 1.0]  # from the untimed batch's end, not the last timed one
    assert all(m.end - m.start == 4.0 for m in timer.marks)  # start, before/after backward, before optimizer, end
    assert epoch.parts["data"] == pytest.approx(3 * 7 / 3) and epoch.parts["forward"] == pytest.approx(7)
    assert clock.made <= 12


def test_a_paused_timer_times_nothing_and_resumes_at_the_next_sampled_batch():
    timer = StepTimer(clock=HostClock(), sample_every=2)
    timer.start_epoch()
    timer.paused = True
    for _ in range(4):
        timer.batch_start(), timer.batch_end()
    timer.paused = False
    for _ in range(4):
        timer.batch_start(), timer.batch_end()
    assert len(timer.take_epoch().spans) == 0 and len(timer.marks) == 2 and timer.batches == 8
