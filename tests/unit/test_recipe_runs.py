"""benchmarks/recipe_runs.py's back-to-back comparisons: the order of the runs and the ratios they quote; and
benchmarks/plain_loop.py, the loop the CPU record is measured against, as data a benchmark reads."""

import json

from benchmarks import plain_loop
from benchmarks.recipe_runs import PLAIN, print_against_plain, run_series, time_ratio


def test_against_alternates_the_recipes_seed_by_seed_and_quotes_the_ratio_of_median_training_times():
    order = []
    seconds = {"old.yaml": [100.0, 110.0, 90.0], "new.yaml": [40.0, 60.0, 50.0]}

    def fake_run(recipe, seed, extra):
        order.append((recipe, seed))
        return {"seed": seed, "epochs": 1, "train_s": seconds[recipe][seed - 42], "images_per_sec": 1.0,
                "val_acc": 0.9, "test_acc": 0.9, "wall_s": 1.0}

    rows = run_series(["old.yaml", "new.yaml"], 3, [], run=fake_run)
    assert order == [("old.yaml", 42), ("new.yaml", 42), ("old.yaml", 43), ("new.yaml", 43), ("old.yaml", 44),
                     ("new.yaml", 44)]
    assert time_ratio(rows["new.yaml"], rows["old.yaml"]) == 0.5  # medians 50 / 100


def row(seed, train_s, test_acc=0.94, val_acc=None):
    return {"seed": seed, "epochs": 5, "train_s": train_s, "images_per_sec": 1.0, "val_acc": val_acc,
            "test_acc": test_acc, "wall_s": 1.0, "load": 0.5}


def test_against_plain_runs_the_plain_loop_first_and_judges_every_run_against_the_plain_run_before_it(capsys):
    order = []
    seconds = {PLAIN: [100.0, 90.0], "record.yaml": [95.0, 91.0]}

    def fake_run(recipe, seed, extra):
        order.append((recipe, seed))
        return row(seed, seconds[recipe][seed - 42])

    rows = run_series([PLAIN, "record.yaml"], 2, [], run=fake_run)
    assert order == [(PLAIN, 42), ("record.yaml", 42), (PLAIN, 43), ("record.yaml", 43)]
    # seed 43 took 91 s against the plain loop's 90: the medians (93 against 95) would hide it
    assert print_against_plain("record.yaml", rows["record.yaml"], rows[PLAIN]) is False
    out = capsys.readouterr().out
    assert "| 43 | 90.0 | 0.50 | 0.9400 | 91.0 | 0.50 | 0.9400 | 1.01 |" in out
    assert "every run within the plain loop's time: no" in out
    assert print_against_plain("record.yaml", [row(42, 95.0)], [row(42, 100.0)]) is True


def test_the_plain_loop_trains_and_writes_its_training_seconds_and_test_accuracy_as_json(fashion_root, tmp_path,
                                                                                         capsys):
    out = tmp_path / "plain.json"
    result = plain_loop.main(["--data_dir", str(fashion_root), "--epochs", "1", "--batch_size", "64", "--seed", "3",
                              "--json", str(out)])
    written = json.loads(out.read_text())
    assert written == result == json.loads(capsys.readouterr().out.strip())
    assert written["epochs"] == 1 and written["seed"] == 3 and written["train_s"] > 0
    assert written["test_acc"] * 101 == round(written["test_acc"] * 101)  # a share of the 101 test images
    assert abs(written["images_per_sec"] * written["train_s"] - 256) < 256 * 0.05  # 256 images in the seconds


def test_each_ablation_variant_takes_out_its_one_choice_of_the_record_recipe(capsys, workdir):
    """benchmarks/ablation.py: each variant's flags, on record_cpu.yaml, change the config where it says and nowhere
    else; the recipe's own row changes nothing."""
    from benchmarks.ablation import HELD_OUT, WITHOUT
    from fashion_mnist_dp.cli.checkpoint_hparams import flat
    from tests.conftest import REPO
    from tests.unit.test_cli import printed_config

    recipe = ["--config", str(REPO / "configs/recipes/record_cpu.yaml"), *HELD_OUT]
    base = flat(printed_config(capsys, recipe))
    assert base["data.val_size"] == 5000 and base["test_after_fit"] is False
    for name, flags in WITHOUT.items():
        variant = flat(printed_config(capsys, [*recipe, *flags]))
        changed = {key for key in base.keys() | variant.keys() if base.get(key) != variant.get(key)}
        if name.startswith("fast_cnn"):  # another class: its init_args replace staged_cnn's
            assert {key for key in changed if not key.startswith("model.network.")} == set(), changed
            assert variant["model.network.class_path"].endswith(".FastCNN") and "model.network.init_args.stages" \
                in changed, changed
        else:
            assert changed == {flag.lstrip("-") for flag in flags[::2]}, (name, changed)


def test_a_relative_data_folder_reaches_the_benchmarks_runs_as_absolute(monkeypatch, tmp_path):
    """The docs' commands say FASHION_MNIST_DIR=../shared/data, and each run trains in a temporary folder: the
    relative path would name a folder that does not exist there."""
    from benchmarks.launch import clean_env

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FASHION_MNIST_DIR", "../shared/data")
    assert clean_env(keep_data_dir=True)["FASHION_MNIST_DIR"] == str(tmp_path.parent / "shared" / "data")
    assert "FASHION_MNIST_DIR" not in clean_env()


def test_make_bench_start_up_rows_see_the_data_folder_from_their_scratch_folder(monkeypatch, tmp_path):
    """benchmarks.speed's start-up rows (its "first step" trains) run in a scratch folder: a relative
    FASHION_MNIST_DIR reaches them absolute, else the row is NaN."""
    import math
    import sys

    from benchmarks.speed import wall_seconds

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FASHION_MNIST_DIR", "data")
    check = f"import os; assert os.environ['FASHION_MNIST_DIR'] == {str(tmp_path / 'data')!r}"
    assert not math.isnan(wall_seconds([sys.executable, "-c", check]))
