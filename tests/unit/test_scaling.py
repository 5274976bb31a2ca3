"""The scaling model of experiments/scaling.py on synthetic numbers: the ring all-reduce cost, DDP's buckets, what
backward hides, the slowest-of-n wait, and the α-β fit of an all-reduce sweep."""

import math

import pytest

from experiments.scaling import (Link, OneRank, buckets, expected_max_of_normals, fit_link, predict, predict_step_s,
                                 ring_allreduce_s)

LINK = Link(alpha=1e-5, bandwidth=1e9)  # 10 us, 1 GB/s
ONE = OneRank(batch=128, data=0.01, forward=0.03, backward=0.06, optimizer=0.01, other=0.0, sigma=0.004)


def test_the_ring_all_reduce_costs_its_latency_and_twice_the_data_less_one_share():
    assert ring_allreduce_s(1, 10 ** 8, LINK) == 0
    assert ring_allreduce_s(2, 10 ** 8, LINK) == pytest.approx(2e-5 + 0.1)  # 2(n-1)/n = 1
    assert ring_allreduce_s(4, 10 ** 8, LINK, k=2) == pytest.approx(2 * 6e-5 + 1.5 * 0.1)


def test_ddp_buckets_the_first_mebibyte_then_25_each():
    assert [buckets(b) for b in (1000, 2 ** 20, 2 ** 20 + 1, 26 * 2 ** 20, 26 * 2 ** 20 + 1)] == [1, 1, 2, 2, 3]


def test_one_bucket_is_all_exposed_and_more_buckets_hide_behind_backward():
    small = predict_step_s(2, ONE, 10 ** 6, LINK)  # one bucket: nothing to overlap with
    assert small["comm"] == pytest.approx(ring_allreduce_s(2, 10 ** 6, LINK))
    big = 60 * 2 ** 20  # 4 buckets: 3/4 of backward (45 ms) can hide the first three
    comm = ring_allreduce_s(2, big, LINK, 4)
    assert predict_step_s(2, ONE, big, LINK)["comm"] == pytest.approx(max(comm / 4, comm - 0.045))
    assert predict_step_s(2, ONE, big, LINK)["wait"] == pytest.approx(0.004 / math.sqrt(math.pi))


def test_the_slowest_of_n_ranks_leads_by_the_expected_maximum_of_n_normals():
    # 1/sqrt(pi) for 2 exactly; 3/(2 sqrt(pi)) for 3; tabulated values for 10 and 100 (Tippett 1925)
    assert expected_max_of_normals(1) == 0.0
    assert expected_max_of_normals(2) == pytest.approx(1 / math.sqrt(math.pi), abs=1e-6)
    assert expected_max_of_normals(3) == pytest.approx(1.5 / math.sqrt(math.pi), abs=1e-6)
    assert expected_max_of_normals(10) == pytest.approx(1.5388, abs=1e-4)
    assert expected_max_of_normals(100) == pytest.approx(2.5076, abs=1e-4)


def test_images_per_sec_and_efficiency_against_n_times_one_rank():
    one = predict(1, ONE, 10 ** 6, LINK)
    assert one["images_per_sec"] == pytest.approx(128 / 0.11) and one["efficiency"] == pytest.approx(1.0)
    two = predict(2, ONE, 10 ** 6, LINK, slowdown=1.1)
    step = 0.11 * 1.1 + ring_allreduce_s(2, 10 ** 6, LINK) + 0.004 * 1.1 / math.sqrt(math.pi)
    assert two["images_per_sec"] == pytest.approx(2 * 128 / step)
    assert two["efficiency"] == pytest.approx(0.11 / step)


def test_the_sweep_fit_recovers_alpha_and_bandwidth():
    sizes = [4096, 65536, 2 ** 20, 2 ** 24]
    times = [2 * 3e-5 + s / 2e9 for s in sizes]  # n = 2: 2(n-1)α + S/B
    link = fit_link(sizes, times)
    assert link.alpha == pytest.approx(3e-5) and link.bandwidth == pytest.approx(2e9)
