"""The documentation does not drift from the code: the shorthand table is fashion_mnist_dp/cli/shorthand.py's, and every
``python train.py`` command in README.md and docs/cli.md parses."""

import re
import shlex

import pytest
import yaml

from fashion_mnist_dp.cli.app import main
from benchmarks.launch import REPO
from fashion_mnist_dp.cli.shorthand import CLASS_NAMES, SHORT_FILES, SHORTHAND_TABLE, flat

COMMANDS = [line.strip() for name in ("README.md", "docs/cli.md") for line in (REPO / name).read_text().splitlines()
            if line.strip().startswith("python train.py")]


def test_the_shorthand_table_in_docs_cli_is_the_one_the_code_uses():
    rows = re.findall(r"^\| `(--\w+)` \| `(--[\w.]+)` \| `(--\w+) ([^`]+)` \|$", (REPO / "docs/cli.md").read_text(), re.M)
    assert {short: (full, example) for short, full, _, example in rows} == SHORTHAND_TABLE
    assert all(short == again for short, _, again, _ in rows)


def test_the_short_name_tables_in_docs_cli_are_the_config_files_the_names_load():
    text = (REPO / "docs/cli.md").read_text()

    def base_lr(key, name):
        return str(flat(yaml.safe_load(SHORT_FILES[key][name].read_text())).get("model.optimizer.init_args.lr", ""))

    network_rows = re.findall(r"^\| `(\w+)`(?: \(default\))? \| `([\w.]+)` \| ([\d.]*) ?\|$", text, re.M)
    assert {name: path for name, path, _ in network_rows} == CLASS_NAMES["--model.network"]
    assert {name: lr for name, _, lr in network_rows} == {n: base_lr("--model.network", n) for n, *_ in network_rows}
    optimizers = re.findall(r"^\| `(\w+)`(?: \(default\))? \| `([\w.]+)` \| ([\d.]+) \| [\d.]+ %", text, re.M)
    assert {name: path for name, path, _ in optimizers} == CLASS_NAMES["--model.optimizer"]
    assert {name: lr for name, _, lr in optimizers} == {n: base_lr("--model.optimizer", n) for n, *_ in optimizers}


@pytest.mark.parametrize("command", COMMANDS)
def test_every_documented_command_parses(capsys, monkeypatch, command):
    monkeypatch.chdir(REPO)  # the commands name configs/ relative to it; --print_config writes nothing
    args = shlex.split(command.split("#")[0])[2:]
    with pytest.raises(SystemExit) as printed:
        main([*args, "--print_config"])
    assert printed.value.code in (0, None), capsys.readouterr().err


def test_reliability_md_names_every_run_safety_callback_the_start_block_knows():
    """docs/reliability.md's table of who carries each guarantee lists every class the start block checks for: the
    plugin by its path, RunSafety's parts as its parts."""
    from fashion_mnist_dp.cli.start_block import SAFETY

    table = (REPO / "docs" / "reliability.md").read_text().split("## Who carries each guarantee", 1)[1].split("\n## ")[0]
    listed = set(re.findall(r"`fashion_mnist_dp\.runtime\.(\w+)`|^\| (?:`RunSafety`'s|its) (\w+)", table, re.M))
    listed = {name for pair in listed for name in pair if name}
    assert {kind.__name__ for kind in SAFETY} <= listed, listed


def test_make_bench_rewrites_its_section_of_the_results_page():
    """`make bench` (benchmarks/speed.py --write) replaces the text between its two markers; without them it would
    append a second section at the page's end. The results page holds each marker once, begin before end."""
    from benchmarks import speed

    assert speed.DOC == REPO / "docs" / "results.md"
    text = speed.DOC.read_text()
    assert text.count(speed.BEGIN) == 1 and text.count(speed.END) == 1
    assert text.index(speed.BEGIN) < text.index(speed.END)


def test_no_user_facing_text_names_how_the_project_was_built():
    """What users read (README, docs/ with its lab record, configs/, the product's, benchmarks' and experiments'
    code) speaks of the product: no internal goal, period of work, borrowed machine or tracker number. A process
    session (benchmarks/launch.py starts each job in one) is the one technical sense allowed."""
    words = re.compile(r"\b(goals?|leases?|lent|sessions?)\b|\bissues? #?\d+|\(issue\b", re.I)
    technical = re.compile(r"(new|own|its|a) session|session of its own|whatever its session|setsid", re.I)
    files = [REPO / "README.md", REPO / "train.py", *REPO.glob("docs/**/*.md"), *REPO.glob("configs/**/*.yaml"),
             *(path for folder in ("callbacks", "fashion_mnist_dp", "lightning_modules", "datamodules", "benchmarks",
                                   "experiments") for path in (REPO / folder).rglob("*.py"))]
    found = [f"{path.relative_to(REPO)}:{number}: {line.strip()[:100]}" for path in files
             for number, line in enumerate(path.read_text().splitlines(), 1)
             if words.search(technical.sub("", line))]
    assert not found, "\n".join(found)
