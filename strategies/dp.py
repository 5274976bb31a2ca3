"""``--strategy dp``: torch.nn.DataParallel in one process (placeholder, see the strategies issue)."""

from lightning.pytorch.strategies import SingleDeviceStrategy


class DataParallelStrategy(SingleDeviceStrategy):
    """Not implemented yet."""

    strategy_name = "dp"
