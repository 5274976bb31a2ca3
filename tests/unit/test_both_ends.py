"""benchmarks/both_ends.py: the two interpreters take turns round by round, a, b and c alternate their order, and the
quotient compares the medians of the rounds' own ratios."""

from benchmarks import both_ends


def test_the_ends_take_turns_and_the_quotient_compares_the_medians_of_each_rounds_ratios(monkeypatch, capsys):
    calls = []
    rates = {"old": [{"a": 100, "b": 120, "c": 80}, {"a": 200, "b": 220, "c": 110}, {"a": 100, "b": 100, "c": 50}],
             "new": [{"a": 100, "b": 100, "c": 100}, {"a": 100, "b": 110, "c": 100}, {"a": 50, "b": 60, "c": 40}]}

    def fake_round(python, network, batch, seconds, steps, order):
        calls.append((python, order))
        return {"rates": rates[python][sum(1 for p, _ in calls if p == python) - 1], "torch": "t", "lightning": "l"}

    monkeypatch.setattr(both_ends, "one_round", fake_round)
    both_ends.main(["--oldest", "old", "--newest", "new", "--rounds", "3"])
    assert calls == [("old", "abc"), ("new", "abc"), ("new", "cba"), ("old", "cba"), ("old", "abc"), ("new", "abc")]
    table = capsys.readouterr().out.splitlines()
    # b/a: oldest 1.2, 1.1, 1.0 -> 1.10; newest 1.0, 1.1, 1.2 -> 1.10; b/c: oldest 1.5, 2.0, 2.0; newest 1.0, 1.1, 1.5
    assert "| **b/a** (median of the rounds' ratios) | 1.10 (1.00-1.20) | 1.10 (1.00-1.20) | 1.00 |" in table
    assert "| **b/c** (median of the rounds' ratios) | 2.00 (1.50-2.00) | 1.10 (1.00-1.50) | 1.82 |" in table
