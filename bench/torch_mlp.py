"""PyTorch eager baseline for `app train`: the same MLP, batch, optimizer and data handling.

An MLP with hidden layers (default 3 x 512, ReLU) on synthetic classification data (default
65,536 rows x 32 features, 2 classes, 20% held out), Adam at lr 1e-3, fp32, batch 1024,
shuffled each epoch, features standardised with the training split's statistics, the
validation split evaluated under no_grad after each epoch. Prints one JSON line per epoch
with samples_per_s measured over the training part of the epoch, as `app train` does.

    .venv-torch/bin/python bench/torch_mlp.py --epochs 3
"""

import argparse
import json
import time

import torch
from torch import nn


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=65536)
    parser.add_argument("--features", type=int, default=32)
    parser.add_argument("--classes", type=int, default=2)
    parser.add_argument("--hidden", type=str, default="512,512,512")
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--threads", type=int, default=0)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    torch.manual_seed(0)
    x = torch.randn(args.samples, args.features)
    y = (x @ torch.randn(args.features, args.classes)).argmax(1)
    order = torch.randperm(args.samples)
    n_val = round(args.samples * 0.2)
    x_val, y_val = x[order[:n_val]], y[order[:n_val]]
    x_train, y_train = x[order[n_val:]], y[order[n_val:]]
    mean, std = x_train.mean(0, keepdim=True), x_train.std(0, unbiased=False, keepdim=True).clamp_min(1e-6)
    x_train, x_val = (x_train - mean) / std, (x_val - mean) / std

    layers, width = [], args.features
    for hidden in map(int, args.hidden.split(",")):
        layers += [nn.Linear(width, hidden), nn.ReLU()]
        width = hidden
    model = nn.Sequential(*layers, nn.Linear(width, args.classes))
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    loss_fn = nn.CrossEntropyLoss()

    for epoch in range(1, args.epochs + 1):
        model.train()
        started = time.perf_counter()
        perm = torch.randperm(x_train.shape[0])
        loss_sum = torch.zeros(())
        for start in range(0, x_train.shape[0], args.batch_size):
            rows = perm[start : start + args.batch_size]
            xb, yb = x_train[rows], y_train[rows]
            loss = loss_fn(model(xb), yb)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            loss_sum += loss.detach() * len(rows)
        seconds = time.perf_counter() - started
        model.eval()
        with torch.no_grad():
            logits = model(x_val)
            val_loss = loss_fn(logits, y_val).item()
            accuracy = (logits.argmax(1) == y_val).float().mean().item()
        print(json.dumps({
            "epoch": epoch,
            "train_loss": loss_sum.item() / x_train.shape[0],
            "val_loss": val_loss,
            "val_accuracy": accuracy,
            "samples_per_s": x_train.shape[0] / seconds,
            "threads": torch.get_num_threads(),
        }), flush=True)


if __name__ == "__main__":
    main()
