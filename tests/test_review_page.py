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
    or more points inside its plot area, spread over a tenth of its height or more (not drawn flat); so has each tag
    the page names on the SCALARS and TIME SERIES pages (validation twice an epoch: 4 points, of which the outlier
    rule draws the inner 2)."""
    result = run_train(["--data_dir", str(fashion_root), "--epochs", "2", "--network", "mlp", "--batch_size", "16",
                        "--lr", "0.0005", "--trainer.log_every_n_steps", "2", "--check_every_n_steps", "2",
                        "--test_after_fit", "false"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    with browser.tensorboard(tmp_path / "runs") as url, browser.chromium() as driver:
        titles, tags = browser.layout_titles(url), browser.named_tags(url)
        pages = {"review page": browser.drawn_charts(driver, url), "SCALARS": browser.scalar_cards(driver, url, tags),
                 "TIME SERIES": browser.time_series_cards(driver, url, tags)}
    assert "images/sec (all ranks)" in titles and "comm" not in titles  # one rank: nothing communicated
    assert {"val/acc", "val/acc_low95", "val/loss", "throughput/window/images_per_sec"} <= set(tags)
    for page, charts in pages.items():
        assert sorted(card["title"] for card in charts) == sorted(titles if page == "review page" else tags), page
        drawn = {card["title"]: any(line["inside"] >= 2 and line["spread"] >= line["height"] / 10
                                    for line in card["lines"]) for card in charts}
        assert all(drawn.values()), (page, [card for card in charts if not drawn[card["title"]]])
