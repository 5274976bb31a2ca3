"""Where a data-parallel step's time goes, per rank (data, forward, backward, comm, wait, optimizer, other: they add
up to the rank's training time): the arithmetic over the marks callbacks/step_marks.py takes, the ranks' split of
wait, the epoch's and each window's figures. ThroughputReport owns it (one record, one epoch-end gather);
docs/reporting.md, "Where the step time goes", defines each part, how wait is split and every column written."""

import math
import statistics
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

PARTS = ("data", "forward", "backward", "comm", "wait", "optimizer", "other")
NAN = float("nan")


@dataclass
class StepMarks:
    """One training batch on one rank, in monotonic seconds (NaN: the hook did not run for this batch)."""

    data_s: float
    start: float
    before_backward: float = NAN
    first_launch: float = NAN  # the first bucket reached the comm hook
    arrival: float = NAN  # the last bucket reached it: this rank's last gradient is ready
    after_backward: float = NAN
    before_optimizer: float = NAN
    end: float = NAN
    buckets: int = 0
    gradient_bytes: int = 0
    window: int = 0  # the window between decision points: optimizer steps before this batch // check_every_n_steps
    collectives: List[Tuple[float, float]] = field(default_factory=list)  # fsdp's, inside forward and backward


@dataclass
class RankEpoch:
    """One rank's epoch: seconds per part before the ranks' exchange (``comm_wait`` not yet split), and per synced
    step its arrival and the span from it to the end of backward."""

    parts: Dict[str, float] = field(default_factory=lambda: dict.fromkeys(PARTS, 0.0))
    arrivals: List[float] = field(default_factory=list)
    spans: List[float] = field(default_factory=list)  # after_backward - arrival: wait + transfer
    overlapped_s: float = 0.0  # communication under way while backward still ran (first launch -> arrival)
    gradient_bytes: int = 0  # per synced step
    buckets: int = 0
    step_std_s: float = 0.0  # spread of its steps' busy time (data to end, less comm and wait): the model's σ


def _span(end: float, start: float) -> float:
    return end - start if math.isfinite(end) and math.isfinite(start) else 0.0


def synced(m: StepMarks) -> bool:
    """The ranks synchronised in this step: DDP's comm hook saw its buckets, or fsdp's collectives ran."""
    return math.isfinite(m.arrival) or bool(m.collectives)


def summarise(marks: Sequence[StepMarks]) -> RankEpoch:
    """A rank's epoch from its batches' marks. ``comm`` holds wait + transfer until :func:`split_wait`."""
    epoch = RankEpoch()
    busy = []
    for m in marks:
        p = epoch.parts
        p["data"] += m.data_s
        backward_end = m.arrival if math.isfinite(m.arrival) else m.after_backward
        in_forward = sum(end - start for start, end in m.collectives if start < m.before_backward)
        inside = sum(end - start for start, end in m.collectives)
        p["forward"] += _span(m.before_backward, m.start) - in_forward
        p["backward"] += _span(backward_end, m.before_backward) - (inside - in_forward)
        p["comm"] += _span(m.after_backward, backward_end) + inside
        p["optimizer"] += _span(m.end, m.before_optimizer)
        claimed = sum(_span(*pair) for pair in ((m.before_backward, m.start), (backward_end, m.before_backward),
                                                (m.after_backward, backward_end), (m.end, m.before_optimizer)))
        p["other"] += max(0.0, _span(m.end, m.start) - claimed)
        busy.append(m.data_s + _span(m.end, m.start) - _span(m.after_backward, backward_end) - inside)
        if synced(m):
            epoch.arrivals.append(m.arrival)  # NaN under fsdp: no one arrival, so its wait is estimated
            epoch.spans.append(_span(m.after_backward, m.arrival) + inside)
            epoch.overlapped_s += _span(m.arrival, m.first_launch)
            epoch.gradient_bytes, epoch.buckets = m.gradient_bytes, m.buckets
    epoch.step_std_s = statistics.stdev(busy) if len(busy) > 1 else 0.0
    return epoch


def split_wait(arrivals: Sequence[Sequence[float]], spans: Sequence[Sequence[float]],
               same_clock: bool) -> List[float]:
    """Each rank's wait over the epoch's synced steps. ``same_clock`` (one host) and one arrival per rank (ddp): the
    latest rank's arrival − this rank's, at most its span; otherwise the span less the shortest rank's (the
    transfer, estimated)."""
    waits = [0.0] * len(arrivals)
    for step in range(min((len(s) for s in spans), default=0)):
        if any(math.isnan(s[step]) for s in spans):
            continue  # a rank synced fewer steps (padding): not comparable
        exact = same_clock and all(math.isfinite(a[step]) for a in arrivals)
        latest = max(a[step] for a in arrivals)
        shortest = min(s[step] for s in spans)
        for rank, (a, s) in enumerate(zip(arrivals, spans)):
            wait = latest - a[step] if exact else s[step] - shortest
            waits[rank] += min(max(wait, 0.0), s[step])
    return waits


@dataclass
class Breakdown:
    """The epoch's figures over all ranks."""

    ranks: List[Dict[str, float]]  # per rank: seconds per part
    step_std_s: List[float]  # per rank: spread of a step's busy time
    slowest_rank: int
    slowest_lead: float  # its busy time (wall − wait) over the median rank's, − 1
    hidden_share: Optional[float]  # of the communication time, the share under way while backward ran
    gradient_bytes: int
    buckets: int
    algbw_gbps: Optional[float]  # gradient bytes per second of exposed comm, per step
    busbw_gbps: Optional[float]  # algbw · 2(n−1)/n (nccl-tests' all-reduce bus bandwidth)
    estimated: bool  # no shared clock (hosts, GPUs) or no one arrival (fsdp): transfer = the shortest rank's span
    sampled_every: int = 1  # one batch in this many was timed, the parts scaled to all (CUDA ranks)


def combine(epochs: Sequence[RankEpoch], same_clock: bool = True) -> Breakdown:
    waits = split_wait([e.arrivals for e in epochs], [e.spans for e in epochs], same_clock)
    ranks = []
    for epoch, wait in zip(epochs, waits):
        parts = dict(epoch.parts)
        parts["wait"], parts["comm"] = wait, max(0.0, parts["comm"] - wait)
        ranks.append(parts)
    busy = [sum(p.values()) - p["wait"] for p in ranks]
    slowest = max(range(len(ranks)), key=lambda r: busy[r])
    median = statistics.median(busy)
    steps = max((len(e.arrivals) for e in epochs), default=0)
    comm = statistics.mean(p["comm"] for p in ranks)
    overlapped = statistics.mean(e.overlapped_s for e in epochs)
    n, grad_bytes = len(epochs), max((e.gradient_bytes for e in epochs), default=0)
    algbw = grad_bytes * steps / comm / 1e9 if comm > 0 and steps and grad_bytes else None
    estimated = not same_clock or any(math.isnan(a) and math.isfinite(s) for e in epochs
                                      for a, s in zip(e.arrivals, e.spans))
    return Breakdown(
        ranks=ranks, step_std_s=[e.step_std_s for e in epochs], slowest_rank=slowest,
        slowest_lead=busy[slowest] / median - 1 if median > 0 else 0.0,
        hidden_share=overlapped / (overlapped + comm) if steps and overlapped + comm > 0 else None,
        gradient_bytes=grad_bytes, buckets=max((e.buckets for e in epochs), default=0), algbw_gbps=algbw,
        busbw_gbps=algbw * 2 * (n - 1) / n if algbw is not None else None, estimated=estimated)


class EpochParts:
    """One rank's breakdown of an epoch, handed whole to the report (callbacks/throughput.py): the row it adds to the
    report's one gather, then the ranks' figures, the epoch's and each window's, from the gathered rows."""

    def __init__(self, epoch: RankEpoch, marks: Sequence[StepMarks], sampled_every: int, same_clock: bool) -> None:
        self.epoch, self.marks, self.sampled_every, self.same_clock = epoch, marks, sampled_every, same_clock
        self.windows: Dict[int, List[StepMarks]] = {}  # the batches of each window between decision points, in order
        for m in marks:
            self.windows.setdefault(m.window, []).append(m)

    def row(self) -> List[float]:
        e = self.epoch
        return [*e.parts.values(), e.overlapped_s, e.gradient_bytes, e.buckets, len(e.spans), e.step_std_s,
                len(self.windows)]

    def combine(self, rows: Sequence[Sequence[float]], gather) -> Tuple[Breakdown, List[Tuple[int, Breakdown]]]:
        """``rows``: every rank's :meth:`row`; ``gather``: the second collective, once per epoch, for each rank's
        per-step arrivals and spans (to split comm from wait) and its windows' parts."""
        n, mine = len(PARTS), self.epoch
        epochs = [RankEpoch(dict(zip(PARTS, row[:n])), overlapped_s=row[n], gradient_bytes=int(row[n + 1]),
                            buckets=int(row[n + 2]), step_std_s=row[n + 4]) for row in rows]
        steps_synced, most = int(max(row[n + 3] for row in rows)), int(max(row[n + 5] for row in rows))
        sums = [value for window in map(summarise, self.windows.values())
                for value in (*window.parts.values(), window.overlapped_s)]
        pad = [NAN] * (steps_synced - len(mine.spans)) if len(rows) > 1 else []
        unused = [NAN] * ((n + 1) * (most - len(self.windows)))
        own = mine.arrivals + pad + mine.spans + pad + sums + unused
        gathered = gather(own) if len(rows) > 1 else [own]
        steps = len(mine.arrivals + pad)
        for epoch, row in zip(epochs, gathered):
            epoch.arrivals, epoch.spans = row[:steps], row[steps:2 * steps]
        windows = self.window_results([row[2 * steps:] for row in gathered], epochs)
        result = combine(epochs, same_clock=self.same_clock)
        result.sampled_every = self.sampled_every
        return result, windows

    def window_results(self, vectors: Sequence[Sequence[float]],
                       epochs: Sequence[RankEpoch]) -> List[Tuple[int, Breakdown]]:
        """Each window's figures over the ranks: ``vectors`` holds per rank, for each window in turn, its parts then
        its overlapped seconds; ``epochs`` the ranks' per-step arrivals and spans, split by the window of each synced
        step (this rank's marks say which: every rank trains the same steps)."""
        width = len(PARTS) + 1
        step_windows = [m.window for m in self.marks if synced(m)]
        results = []
        for index, window in enumerate(self.windows):
            chosen = [i for i, w in enumerate(step_windows) if w == window]
            ranks = []
            for epoch, vector in zip(epochs, vectors):
                mine = vector[index * width:(index + 1) * width]
                ranks.append(RankEpoch(dict(zip(PARTS, mine)), overlapped_s=mine[-1],
                                       arrivals=[epoch.arrivals[i] for i in chosen],
                                       spans=[epoch.spans[i] for i in chosen]))
            results.append((window, combine(ranks, same_clock=self.same_clock)))
        return results


def parts_of(ranks: int) -> Tuple[str, ...]:
    """The parts that apply to a run of ``ranks`` processes: with one, nothing is communicated and no one waits, so
    ``comm`` and ``wait`` (always 0 there) are left out of what is logged and of the review page."""
    return PARTS if ranks > 1 else tuple(part for part in PARTS if part not in ("comm", "wait"))


def part_columns(prefix: str, result: Breakdown) -> Dict[str, float]:
    """``<prefix>/<part>/rank<k>`` for the parts that apply, then the slowest rank and its lead (with several)."""
    shown = parts_of(len(result.ranks))
    values = {f"{prefix}/{part}/rank{rank}": parts[part] for rank, parts in enumerate(result.ranks) for part in shown}
    if len(result.ranks) > 1:
        values.update({f"{prefix}/slowest_rank": result.slowest_rank, f"{prefix}/slowest_lead": result.slowest_lead})
    return values


def metrics(result: Breakdown) -> Dict[str, float]:
    """The record's columns: ``time/<part>/rank<k>`` in seconds per epoch, then the run's figures; what does not
    apply (comm on one rank, DDP's buckets under fsdp, bandwidths when nothing synced) is left out, not logged as 0."""
    values = part_columns("time", result)
    values.update({f"time/step_std_s/rank{rank}": std for rank, std in enumerate(result.step_std_s)})
    values["time/sampled_every"] = result.sampled_every
    if result.buckets:  # DDP's comm hook saw the gradients
        values.update({"comm/gradient_bytes": result.gradient_bytes, "comm/buckets": result.buckets})
    optional = {"comm/hidden_share": result.hidden_share, "comm/algbw_gbps": result.algbw_gbps,
                "comm/busbw_gbps": result.busbw_gbps}  # None (nothing synced, no comm time): left out
    return {**values, **{key: value for key, value in optional.items() if value is not None}}


def format_line(result: Breakdown) -> str:
    """``Step time (slowest rank 1, +12 % over the median): compute 71 %, comm 9 %, wait 12 %, data 6 %, ...``:
    shares of the ranks' mean training time."""
    mean = {part: statistics.mean(r[part] for r in result.ranks) for part in PARTS}
    wall = sum(mean.values()) or 1.0
    shares = {"compute": mean["forward"] + mean["backward"], **{p: mean[p] for p in PARTS[3:] + ("data",)}}
    order = ("compute", "comm", "wait", "data", "optimizer", "other")
    estimate = ", comm/wait estimated" if result.estimated else ""
    estimate += f", 1 step in {result.sampled_every} timed" if result.sampled_every > 1 else ""
    return (f"Step time (slowest rank {result.slowest_rank}, {result.slowest_lead:+.0%} over the median{estimate}): "
            + ", ".join(f"{name} {shares[name] / wall:.0%}" for name in order)).replace("%", " %")
