"""The plain loop the CPU records are measured against: what a competent user writes without this project, a
two-conv-layer CNN with batch norm trained in memory, in fp32 and NCHW, by AdamW with a one-cycle schedule, random
horizontal flips and label smoothing, 5 epochs at batch 128. Its training time on a machine is the budget of
configs/recipes/record_cpu.yaml there (docs/results.md; the series: docs/lab/recipes.md).

    FASHION_MNIST_DIR=../shared/data python -m benchmarks.plain_loop [--seed 42] [--json FILE]

Prints one JSON line: training seconds (the epochs' steps only, as train.py's Cumulative Time: no loading, no
evaluation) and test accuracy (one evaluation after training, on the whole test split).
"""

import argparse
import json
import os
import time

import torch
from torch import nn
from torchvision.datasets import FashionMNIST


def network() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),  # 28 -> 14
        nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),  # 14 -> 7
        nn.Flatten(), nn.Linear(64 * 7 * 7, 128), nn.ReLU(), nn.Linear(128, 10))


def load(root: str, train: bool):
    """The whole split as one float tensor N×1×28×28, normalised by the training set's mean and std."""
    split = FashionMNIST(root, train=train, download=False)
    images = split.data.float().div(255).unsqueeze(1)
    return (images - 0.2860) / 0.3530, split.targets


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch_size", type=int, default=128)
    parser.add_argument("--lr", type=float, default=0.01, help="OneCycleLR's max_lr")
    parser.add_argument("--data_dir", default=os.environ.get("FASHION_MNIST_DIR", "data"))
    parser.add_argument("--json", help="also write the result to this file")
    opts = parser.parse_args(argv)

    torch.manual_seed(opts.seed)
    train_x, train_y = load(opts.data_dir, train=True)
    test_x, test_y = load(opts.data_dir, train=False)
    model = network()
    optimizer = torch.optim.AdamW(model.parameters(), lr=opts.lr, weight_decay=0.01)
    steps_per_epoch = -(-len(train_y) // opts.batch_size)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=opts.lr, epochs=opts.epochs,
                                                    steps_per_epoch=steps_per_epoch)
    loss_fn = nn.CrossEntropyLoss(label_smoothing=0.1)

    model.train()
    started = time.perf_counter()
    for _ in range(opts.epochs):
        order = torch.randperm(len(train_y))
        for first in range(0, len(order), opts.batch_size):
            index = order[first:first + opts.batch_size]
            images, labels = train_x[index], train_y[index]
            flip = torch.rand(len(index)) < 0.5
            images = torch.where(flip[:, None, None, None], images.flip(-1), images)
            loss = loss_fn(model(images), labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            scheduler.step()
    train_s = time.perf_counter() - started

    model.eval()
    with torch.no_grad():
        correct = sum(int((model(x).argmax(1) == y).sum()) for x, y in zip(test_x.split(1000), test_y.split(1000)))
    result = {"loop": "plain", "seed": opts.seed, "epochs": opts.epochs, "train_s": round(train_s, 3),
              "images_per_sec": round(opts.epochs * len(train_y) / train_s), "test_acc": correct / len(test_y),
              "threads": torch.get_num_threads()}
    print(json.dumps(result), flush=True)
    if opts.json:
        with open(opts.json, "w") as out:
            out.write(json.dumps(result) + "\n")
    return result


if __name__ == "__main__":
    main()
