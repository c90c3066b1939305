"""PyTorch eager baseline for `app train`: the same MLP, batch, optimizer and data handling.

An MLP with hidden layers (default 3 x 512, ReLU) on synthetic classification data (default
65,536 rows x 32 features, 2 classes, 20% held out), Adam at lr 1e-3, batch 1024, shuffled each
epoch, features standardised with the training split's statistics, the validation split
evaluated under no_grad after each epoch. Prints one JSON line per epoch with samples_per_s
measured over the training part of the epoch, as `app train` does.

On a GPU (--device cuda) the data lives on the device, as `app train` keeps a dataset that
fits, and --precision picks fp32 (TF32 off), tf32, bf16 or fp16 (autocast; fp16 with a
GradScaler), as `app bench --amp` does.

    .venv-torch/bin/python bench/torch_mlp.py --epochs 3
    python3 bench/torch_mlp.py --device cuda --precision bf16 --hidden 4096,4096,4096,4096 \
        --features 4096 --classes 10 --samples 131072 --batch-size 8192 --val-fraction 0
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
    parser.add_argument("--val-fraction", type=float, default=0.2)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--precision", default="fp32", choices=["fp32", "tf32", "bf16", "fp16"])
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    if cuda:
        tf32 = "tf32" if args.precision == "tf32" else "ieee"
        torch.backends.cuda.matmul.fp32_precision = tf32
        torch.backends.cudnn.conv.fp32_precision = tf32
    autocast_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(args.precision)

    torch.manual_seed(0)
    x = torch.randn(args.samples, args.features)
    y = (x @ torch.randn(args.features, args.classes)).argmax(1)
    order = torch.randperm(args.samples)
    n_val = round(args.samples * args.val_fraction)
    x_val, y_val = x[order[:n_val]], y[order[:n_val]]
    x_train, y_train = x[order[n_val:]], y[order[n_val:]]
    mean, std = x_train.mean(0, keepdim=True), x_train.std(0, unbiased=False, keepdim=True).clamp_min(1e-6)
    x_train, x_val = (x_train - mean) / std, (x_val - mean) / std
    x_train, y_train, x_val, y_val = (t.to(device) for t in (x_train, y_train, x_val, y_val))

    layers, width = [], args.features
    for hidden in map(int, args.hidden.split(",")):
        layers += [nn.Linear(width, hidden), nn.ReLU()]
        width = hidden
    model = nn.Sequential(*layers, nn.Linear(width, args.classes)).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    scaler = torch.amp.GradScaler(device.type, enabled=args.precision == "fp16")
    loss_fn = nn.CrossEntropyLoss()

    def sync():
        if cuda:
            torch.cuda.synchronize(device)

    for epoch in range(1, args.epochs + 1):
        model.train()
        sync()
        started = time.perf_counter()
        perm = torch.randperm(x_train.shape[0], device=device)
        loss_sum = torch.zeros((), device=device)
        for start in range(0, x_train.shape[0], args.batch_size):
            rows = perm[start : start + args.batch_size]
            xb, yb = x_train[rows], y_train[rows]
            with torch.autocast(device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
                loss = loss_fn(model(xb).float(), yb)
            optimizer.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            loss_sum += loss.detach() * len(rows)
        sync()
        seconds = time.perf_counter() - started
        report = {
            "epoch": epoch,
            "train_loss": loss_sum.item() / x_train.shape[0],
            "samples_per_s": x_train.shape[0] / seconds,
            "threads": torch.get_num_threads(),
            "device": str(device),
            "precision": args.precision,
        }
        if n_val:
            model.eval()
            with torch.no_grad(), torch.autocast(device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
                logits = model(x_val).float()
                report["val_loss"] = loss_fn(logits, y_val).item()
                report["val_accuracy"] = (logits.argmax(1) == y_val).float().mean().item()
        print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
