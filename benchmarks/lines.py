"""Lines of Python per folder: all, code (not blank, comment or docstring), docstring; and lines over 120 characters.

    python -m benchmarks.lines fashion_mnist_dp          # the harness package (docs/architecture.md)
    python -m benchmarks.lines benchmarks experiments callbacks datamodules lightning_modules fashion_mnist_dp train.py
"""

import io
import sys
import tokenize
from pathlib import Path
from typing import Tuple

LAYOUT = (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER)


def count(source: str) -> Tuple[int, int, int]:
    """(lines, code lines, docstring lines) of one file: a docstring is a string that stands alone as a statement."""
    doc, code, previous = set(), set(), tokenize.INDENT
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        lines = range(token.start[0], token.end[0] + 1)
        if token.type == tokenize.STRING and previous in (tokenize.INDENT, tokenize.DEDENT, tokenize.NEWLINE):
            doc.update(lines)
        elif token.type not in LAYOUT:
            code.update(lines)
        if token.type not in (tokenize.COMMENT, tokenize.NL):
            previous = token.type
    return len(source.splitlines()), len(code - doc), len(doc)


def main(places) -> int:
    total = [0, 0, 0]
    for place in places:
        files = [Path(place)] if place.endswith(".py") else sorted(Path(place).rglob("*.py"))
        sums = [0, 0, 0]
        for path in files:
            source = path.read_text()
            sums = [a + b for a, b in zip(sums, count(source))]
            for number, line in enumerate(source.splitlines(), 1):
                if len(line) > 120:
                    print(f"{path}:{number}: {len(line)} characters")
        total = [a + b for a, b in zip(total, sums)]
        print(f"{place}: {sums[0]} lines, {sums[1]} code, {sums[2]} docstring")
    print(f"total: {total[0]} lines, {total[1]} code, {total[2]} docstring")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or ["fashion_mnist_dp"]))
