"""The review page as a user opens it: a short run's logs served by TensorBoard, the CUSTOM SCALARS page in headless
Chromium at TensorBoard's default settings (outliers ignored in chart scaling, smoothing 0.6), and every chart of
its layout drawing a line, read from the SVG TensorBoard renders (tests/browser.py). Skipped with the reason where
Chromium cannot be installed; ``FASHION_MNIST_REQUIRE_BROWSER=1`` (CI) turns the skip into a failure."""

import os

import pytest

from tests import browser
from tests.conftest import run_train


@pytest.fixture(scope="module")
def chromium_ready():
    reason = browser.install_reason()
    if reason and os.environ.get(browser.REQUIRE_BROWSER) == "1":
        pytest.fail(f"{browser.REQUIRE_BROWSER}=1 but the browser test cannot run: {reason}", pytrace=False)
    if reason:
        pytest.skip(reason)


def test_every_chart_of_the_review_page_draws_a_line_inside_its_plot_after_a_two_epoch_run(
        tmp_path, fashion_root, chromium_ready):
    """2 epochs of 16 steps, Lightning's logs every 2 steps, a decision point every 2: each chart has a line with two
    or more points inside its plot area, spread over a tenth of its height or more (not drawn flat)."""
    result = run_train(["--data_dir", str(fashion_root), "--epochs", "2", "--network", "mlp", "--batch_size", "16",
                        "--lr", "0.0005", "--trainer.log_every_n_steps", "2", "--check_every_n_steps", "2",
                        "--test_after_fit", "false"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    with browser.tensorboard(tmp_path / "runs") as url, browser.chromium() as driver:
        titles = browser.layout_titles(url)
        charts = browser.drawn_charts(driver, url)
    assert sorted(card["title"] for card in charts) == sorted(titles), charts
    assert "images/sec (all ranks)" in titles and "comm" not in titles  # one rank: nothing communicated
    drawn = {card["title"]: any(line["inside"] >= 2 and line["spread"] >= line["height"] / 10
                                for line in card["lines"]) for card in charts}
    assert all(drawn.values()), [card for card in charts if not drawn[card["title"]]]
