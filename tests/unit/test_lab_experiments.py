"""The experiment harness's rules on made-up results: verdicts, torchrun "nodes" for ranks beyond the cores, the
training subset, the devices table (the experiments end to end: tests/test_lab_experiments.py)."""

import math

from datamodules import FashionMNISTDataModule
from experiments import devices
from experiments.runner import Budget, RunResult, RunSpec, commands, nodes_for, verdicts
from tests.idx_files import sample_ids


def result(name="r", code=0, accs=(0.5, 0.8), losses=None, devices_=1, summary=None) -> RunResult:
    losses = losses or [1.0] * len(accs)
    rows = [{"epoch": i + 1, "cumulative_s": 10.0 * (i + 1), "val_acc": a, "val_loss": l}
            for i, (a, l) in enumerate(zip(accs, losses))]
    return RunResult(RunSpec(name, devices=devices_), code, 30.0, rows, summary or {}, [100.0, 120.0, 300.0])


def test_verdicts_diverged_failed_degraded_converged():
    runs = [result(accs=(0.5, 0.90)), result(accs=(0.85, 0.889)), result(accs=(0.7, 0.85)),
            result(code=70, accs=(0.3,)), result(accs=(0.5, 0.6), losses=(1.0, math.nan)), result(code=1, accs=())]
    assert verdicts(runs, margin=0.02) == ["converged", "converged", "degraded", "diverged", "diverged",
                                           "failed (exit 1)"]
    best = runs[0]
    assert best.best_acc == 0.90 and best.to_target(0.85)["epoch"] == 2 and best.to_target(0.95) is None
    assert best.median_images_per_sec == 120.0


def test_ranks_beyond_the_cores_run_as_torchrun_nodes_on_localhost():
    assert [nodes_for(n, 2) for n in (1, 2, 4, 3)] == [1, 1, 2, 3]
    assert nodes_for(2, 1) == 2
    budget = Budget(epochs=1, train_subset=100)
    one, = commands(RunSpec("a", "sgd", 1), budget, 2)
    assert "--strategy" not in one and one[one.index("--devices") + 1] == "1"
    two, = commands(RunSpec("b", "sgd", 2), budget, 2)
    assert two[two.index("--strategy") + 1] == "ddp" and two[two.index("--devices") + 1] == "2"
    node0, node1 = commands(RunSpec("c", None, 4, ["--lr", "0.1"]), budget, 2)
    for node, argv in enumerate((node0, node1)):
        assert argv[0:2] == ["-m", "torch.distributed.run"]
        assert argv[argv.index("--node_rank") + 1] == str(node) and argv[argv.index("--nnodes") + 1] == "2"
        assert argv[argv.index("--devices") + 1] == "2" and argv[argv.index("--num_nodes") + 1] == "2"
        assert argv[argv.index("--data.train_subset") + 1] == "100" and argv[-8:-6] == ["--lr", "0.1"]
        assert argv[argv.index("--seed") + 1] == "42"
    assert node0[node0.index("--master_port") + 1] == node1[node1.index("--master_port") + 1]


def test_train_subset_keeps_the_first_n_training_images(fashion_root):
    dm = FashionMNISTDataModule(data_dir=str(fashion_root), download=False, train_subset=100)
    dm.setup("fit")
    assert len(dm.train_set) == 100 and len(dm.test_set) == 101
    images, _ = dm.on_after_batch_transfer(dm.train_set.__getitems__(list(range(100))), 0)
    assert sample_ids(images) == list(range(100))


def test_devices_table_has_a_row_per_process_count_and_rule():
    summaries = {rule: {"lr_scaling": rule, "effective_batch_size": 128, "base_lr": 0.02, "base_batch_size": None,
                        "batch_size_per_device": 64, "scaled_lr": 0.04} for rule in devices.RULES}
    runs = [result(f"p{n}_{rule}", devices_=n, summary=summaries[rule]) for n in (1, 2, 4) for rule in devices.RULES]
    rows = devices.table_rows(runs, Budget(target=0.8), margin=0.02)
    assert [(r[0], r[1]) for r in rows] == [(str(n), rule) for n in (1, 2, 4) for rule in devices.RULES]
    assert all(len(r) == len(devices.COLUMNS) for r in rows)
    assert rows[1][3] == "0.02 @ 64 → 0.04" and rows[0][6] == "2 / 20.0 s"


