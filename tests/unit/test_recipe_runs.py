"""benchmarks/recipe_runs.py's back-to-back comparison: the order of the runs and the ratio it quotes."""

from benchmarks.recipe_runs import run_series, time_ratio


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
