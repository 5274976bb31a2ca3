"""The experiment harness's rules on made-up results: verdicts, torchrun "nodes" for ranks beyond the cores, the
training subset, the devices table (the experiments end to end: tests/test_lab_experiments.py)."""

import math

import pytest

from datamodules import FashionMNISTDataModule
from experiments import devices
from experiments.runner import Budget, RunResult, RunSpec, commands, nodes_for, spread, verdicts
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
    seed_zero, = commands(RunSpec("d", "sgd", 1, seed=0), budget, 2)
    assert seed_zero[seed_zero.index("--seed") + 1] == "0"  # --seeds 0,1,2: seed 0 is not the budget's 42


def test_train_subset_keeps_the_first_n_training_images(fashion_root):
    dm = FashionMNISTDataModule(data_dir=str(fashion_root), download=False, train_subset=100)
    dm.setup("fit")
    assert len(dm.train_set) == 100 and len(dm.test_set) == 101
    images, _ = dm.on_after_batch_transfer(dm.train_set.__getitems__(list(range(100))), 0)
    assert sample_ids(images) == list(range(100))


def test_devices_cells_give_each_rule_and_device_count_the_median_and_range_over_seeds():
    def seeded(n, rule, seed, accs, code=0):
        spec = RunSpec(f"n{n}_{rule}_s{seed}", devices=1, virtual=n, seed=seed, cell=rule)
        rows = [{"epoch": i + 1, "cumulative_s": 1.0, "val_acc": a, "val_loss": 1.0} for i, a in enumerate(accs)]
        summary = {"effective_batch_size": 128 * n, "scaled_lr": 0.05 * n, "total_steps": 384 // n}
        return RunResult(spec, code, 10.0, rows, summary, [])

    runs = [seeded(1, "linear", 42, (0.80, 0.86)), seeded(1, "linear", 43, (0.86, 0.84)),
            seeded(1, "linear", 44, (0.81, 0.88)), seeded(1, "lars", 42, (0.83, 0.87)),
            seeded(64, "linear", 42, (0.10,), code=70), seeded(64, "linear", 43, (0.30, math.nan)),
            seeded(64, "linear", 44, (0.60, 0.70))]
    one_linear, one_lars, many_linear = devices.cells(runs, margin=0.02)
    assert (one_linear["devices"], one_linear["rule"], one_linear["effective_batch"], one_linear["steps"]) == (
        1, "linear", 128, 384)
    assert spread(one_linear["final"]) == "0.860 (0.840–0.880)"  # median of 0.86, 0.84, 0.88
    assert spread(one_linear["best"]) == "0.860 (0.860–0.880)"
    assert (one_lars["rule"], one_lars["runs"]) == ("lars", 1)
    assert one_linear["verdict"] == one_lars["verdict"] == "converged"
    assert many_linear["lr"] == 3.2 and many_linear["diverged"] == 2
    assert many_linear["verdict"] == "diverged 2/3, degraded 1/3"  # exit 70, a NaN val loss; 0.70 < 0.88 - 0.02
    assert spread(many_linear["final"]) == "0.400 (0.100–0.700 + n/a)"  # seed 43 ends on a NaN val acc
    assert spread([None, math.nan]) == "n/a" and spread([0.5]) == "0.500"


def test_report_only_reads_back_finished_runs_and_names_the_first_missing_one(tmp_path):
    from experiments.runner import RESULT_FILE, load

    done = tmp_path / "runs" / "n1_none_s42"
    (done / "logs").mkdir(parents=True)
    (done / RESULT_FILE).write_text('{"returncode": 70, "wall_s": 12.5}\n')
    (done / "logs" / "node0.err").write_text("Training diverged at step 3\n")
    specs = [RunSpec("n1_none_s42", seed=42), RunSpec("n2_none_s42", virtual=2, seed=42)]
    with pytest.raises(FileNotFoundError, match=r"1 of 2 runs have no result.json .*\(first: n2_none_s42\)"):
        load(specs, tmp_path)
    back, = load(specs[:1], tmp_path)
    assert (back.returncode, back.wall_s, back.rows, back.summary) == (70, 12.5, [], {})
    assert "diverged at step 3" in back.stderr_tail and verdicts([back]) == ["diverged"]


def test_resume_keeps_the_finished_runs_of_an_interrupted_grid_and_trains_only_the_rest(tmp_path, monkeypatch):
    from experiments import runner

    done = tmp_path / "runs" / "n1_none_s42"
    (done / "logs").mkdir(parents=True)
    (done / runner.RESULT_FILE).write_text('{"returncode": 0, "wall_s": 30.0}\n')
    trained = []
    monkeypatch.setattr(runner, "run", lambda spec, *a, **k: trained.append(spec.name) or "trained")
    specs = [RunSpec("n1_none_s42", seed=42), RunSpec("n2_none_s42", virtual=2, seed=42)]
    results, wall = runner.run_all(specs, runner.Budget(resume=True), tmp_path)
    assert trained == ["n2_none_s42"] and results[0].wall_s == 30.0 and results[1] == "trained"
    assert wall is None  # the grid's wall time is not this call's
    results, wall = runner.run_all(specs, runner.Budget(), tmp_path)
    assert trained == ["n2_none_s42", "n1_none_s42", "n2_none_s42"] and wall is not None
