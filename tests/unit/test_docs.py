"""The documentation does not drift from the code: the shorthand table is fashion_mnist_dp/cli/shorthand.py's, and every
``python train.py`` command in README.md and docs/cli.md parses."""

import re
import shlex

import pytest

from fashion_mnist_dp.cli.app import main
from benchmarks.launch import REPO
from fashion_mnist_dp.cli.shorthand import CLASS_NAMES, KNOWN_GOOD_LR, NETWORK_LR, SHORTHAND_TABLE

COMMANDS = [line.strip() for name in ("README.md", "docs/cli.md") for line in (REPO / name).read_text().splitlines()
            if line.strip().startswith("python train.py")]


def test_the_shorthand_table_in_docs_cli_is_the_one_the_code_uses():
    rows = re.findall(r"^\| `(--\w+)` \| `(--[\w.]+)` \| `(--\w+) ([^`]+)` \|$", (REPO / "docs/cli.md").read_text(), re.M)
    assert {short: (full, example) for short, full, _, example in rows} == SHORTHAND_TABLE
    assert all(short == again for short, _, again, _ in rows)


def test_the_short_name_tables_in_docs_cli_are_the_ones_the_code_uses():
    text = (REPO / "docs/cli.md").read_text()
    network_rows = re.findall(r"^\| `(\w+)`(?: \(default\))? \| `([\w.]+)` \| ([\d.]*) ?\|$", text, re.M)
    networks = {name: path for name, path, _ in network_rows}
    assert {(name, "sgd"): lr for name, _, lr in network_rows if lr} == NETWORK_LR
    optimizers = re.findall(r"^\| `(\w+)`(?: \(default\))? \| `([\w.]+)` \| ([\d.]+) \| [\d.]+ %", text, re.M)
    assert networks == CLASS_NAMES["--model.network"]
    assert {name: path for name, path, _ in optimizers} == CLASS_NAMES["--model.optimizer"]
    assert {name: lr for name, _, lr in optimizers} == KNOWN_GOOD_LR


@pytest.mark.parametrize("command", COMMANDS)
def test_every_documented_command_parses(capsys, monkeypatch, command):
    monkeypatch.chdir(REPO)  # the commands name configs/ relative to it; --print_config writes nothing
    args = shlex.split(command.split("#")[0])[2:]
    with pytest.raises(SystemExit) as printed:
        main([*args, "--print_config"])
    assert printed.value.code in (0, None), capsys.readouterr().err


def test_reliability_md_names_every_run_safety_callback_the_start_block_knows():
    """docs/reliability.md's table of who carries each guarantee lists every class the start block checks for."""
    from fashion_mnist_dp.cli.start_block import SAFETY

    table = (REPO / "docs" / "reliability.md").read_text().split("## Who carries each guarantee", 1)[1].split("\n## ")[0]
    listed = set(re.findall(r"`fashion_mnist_dp\.runtime\.(\w+)`", table))
    assert {kind.__name__ for kind in SAFETY} <= listed, listed


def test_make_bench_rewrites_its_section_of_the_results_page():
    """`make bench` (benchmarks/speed.py --write) replaces the text between its two markers; without them it would
    append a second section at the page's end. The results page holds each marker once, begin before end."""
    from benchmarks import speed

    assert speed.DOC == REPO / "docs" / "results.md"
    text = speed.DOC.read_text()
    assert text.count(speed.BEGIN) == 1 and text.count(speed.END) == 1
    assert text.index(speed.BEGIN) < text.index(speed.END)
