"""A small training project that needs only python3: a one-hidden-layer MLP (tanh, softmax)
trained with mini-batch SGD on a generated two-moons data set.

Run by hand:   python3 train.py --lr 0.1 --hidden 16
Run by app:    app submit sweep.yaml   (from this directory; see README.md)

Under app's worker it uses what the worker gives every job:
  $APP_METRICS_FILE    one JSON line per epoch (train_loss, val_loss, val_accuracy): the
                       leaderboard and the web page's charts read them;
  $APP_CHECKPOINT_DIR  its state after every epoch (checkpoint.json, replaced atomically): if
                       the worker dies, the next attempt continues from the last epoch saved;
                       stopped with SIGTERM (a cancel, a worker shutting down, a preemption), it
                       ends the epoch it is in, saves it and exits, so no epoch's work is lost;
  $APP_OUTPUT_DIR      the trained model (model.json) and its history, kept as the run's result.
Without them it writes into ./out/.
"""

import argparse
import json
import math
import os
import random
import signal
import sys
import time


def moons(count, noise, seed):
    """Two interleaving half circles ("two moons"), labels 0 and 1: not linearly separable."""
    rng = random.Random(seed)
    points = []
    for index in range(count):
        label = index % 2
        angle = rng.uniform(0, math.pi)
        if label == 0:
            x, y = math.cos(angle), math.sin(angle)
        else:
            x, y = 1 - math.cos(angle), 0.5 - math.sin(angle)
        points.append(([x + rng.gauss(0, noise) - 0.5, y + rng.gauss(0, noise) - 0.25], label))
    rng.shuffle(points)
    return points


class Mlp:
    def __init__(self, inputs, hidden, outputs, seed):
        rng = random.Random(seed)
        self.w1 = [[rng.gauss(0, 1 / math.sqrt(inputs)) for _ in range(inputs)] for _ in range(hidden)]
        self.b1 = [0.0] * hidden
        self.w2 = [[rng.gauss(0, 1 / math.sqrt(hidden)) for _ in range(hidden)] for _ in range(outputs)]
        self.b2 = [0.0] * outputs

    def state(self):
        return {"w1": self.w1, "b1": self.b1, "w2": self.w2, "b2": self.b2}

    def load(self, state):
        self.w1, self.b1, self.w2, self.b2 = state["w1"], state["b1"], state["w2"], state["b2"]

    def forward(self, x):
        hidden = [math.tanh(sum(w * v for w, v in zip(row, x)) + b) for row, b in zip(self.w1, self.b1)]
        logits = [sum(w * h for w, h in zip(row, hidden)) + b for row, b in zip(self.w2, self.b2)]
        top = max(logits)
        exps = [math.exp(logit - top) for logit in logits]
        total = sum(exps)
        return hidden, [e / total for e in exps]

    def loss(self, data):
        total, correct = 0.0, 0
        for x, label in data:
            _, probs = self.forward(x)
            total -= math.log(max(probs[label], 1e-12))
            correct += probs.index(max(probs)) == label
        return total / len(data), correct / len(data)

    def step(self, batch, lr):
        """One SGD step on a batch; returns its mean loss."""
        g1 = [[0.0] * len(self.w1[0]) for _ in self.w1]
        gb1 = [0.0] * len(self.b1)
        g2 = [[0.0] * len(self.w2[0]) for _ in self.w2]
        gb2 = [0.0] * len(self.b2)
        loss = 0.0
        for x, label in batch:
            hidden, probs = self.forward(x)
            loss -= math.log(max(probs[label], 1e-12))
            delta = [p - (1.0 if k == label else 0.0) for k, p in enumerate(probs)]
            for k, d in enumerate(delta):
                gb2[k] += d
                for j, h in enumerate(hidden):
                    g2[k][j] += d * h
            for j, h in enumerate(hidden):
                back = sum(delta[k] * self.w2[k][j] for k in range(len(delta))) * (1 - h * h)
                gb1[j] += back
                for i, v in enumerate(x):
                    g1[j][i] += back * v
        scale = lr / len(batch)
        for row, grads in zip(self.w1 + self.w2, g1 + g2):
            for i, g in enumerate(grads):
                row[i] -= scale * g
        for biases, grads in ((self.b1, gb1), (self.b2, gb2)):
            for i, g in enumerate(grads):
                biases[i] -= scale * g
        return loss / len(batch)


def write_json(path, value):
    """Writes aside, then renames: a reader (or a crash) never sees half a file."""
    partial = path + ".partial"
    with open(partial, "w") as out:
        json.dump(value, out)
    os.replace(partial, path)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--hidden", type=int, default=16)
    parser.add_argument("--epochs", type=int, default=40)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--samples", type=int, default=600)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--epoch-seconds", type=float, default=0.0, help="pause after each epoch (to watch it)")
    args = parser.parse_args()

    output_dir = os.environ.get("APP_OUTPUT_DIR", "out")
    checkpoint_dir = os.environ.get("APP_CHECKPOINT_DIR", os.path.join(output_dir, "checkpoint"))
    metrics_file = os.environ.get("APP_METRICS_FILE", os.path.join(output_dir, "metrics.jsonl"))
    for directory in (output_dir, checkpoint_dir):
        os.makedirs(directory, exist_ok=True)
    checkpoint = os.path.join(checkpoint_dir, "checkpoint.json")

    data = moons(args.samples, noise=0.15, seed=args.seed)
    split = len(data) * 4 // 5
    train, val = data[:split], data[split:]
    model = Mlp(2, args.hidden, 2, seed=args.seed)
    history, first_epoch = [], 1
    if os.path.exists(checkpoint):
        with open(checkpoint) as saved:
            state = json.load(saved)
        model.load(state["model"])
        history, first_epoch = state["history"], state["epoch"] + 1
        resumed = os.environ.get("APP_RESUMED_FROM")
        source = f"attempt {resumed}'s checkpoint" if resumed else checkpoint
        print(f"resuming at epoch {first_epoch} from {source}", flush=True)

    # SIGTERM asks to stop: the epoch under way ends and is saved first (the worker waits its
    # grace before SIGKILL). Python's default would end the process at once, mid-epoch.
    stopping = []
    signal.signal(signal.SIGTERM, lambda signum, frame: stopping.append(signum))

    for epoch in range(first_epoch, args.epochs + 1):
        started = time.time()
        order = train[:]
        # Seeded by the epoch alone: a resumed run shuffles exactly as an uninterrupted one.
        random.Random(args.seed * 100_003 + epoch).shuffle(order)
        losses = [model.step(order[i:i + args.batch_size], args.lr) for i in range(0, len(order), args.batch_size)]
        val_loss, val_accuracy = model.loss(val)
        # One JSON object per line, `step` plus numbers: the worker's metrics format.
        entry = {
            "step": epoch,
            "train_loss": round(sum(losses) / len(losses), 6),
            "val_loss": round(val_loss, 6),
            "val_accuracy": round(val_accuracy, 4),
        }
        history.append(dict(entry, seconds=round(time.time() - started, 3)))
        with open(metrics_file, "a") as metrics:
            metrics.write(json.dumps(entry) + "\n")
        write_json(checkpoint, {"epoch": epoch, "model": model.state(), "history": history})
        print(f"epoch {epoch:3d}  train_loss {entry['train_loss']:.4f}  val_loss {val_loss:.4f}  "
              f"val_accuracy {val_accuracy:.3f}", flush=True)
        if not stopping:
            time.sleep(args.epoch_seconds)
        if stopping:
            print(f"stopped by SIGTERM after epoch {epoch}, which is saved: a next attempt resumes at "
                  f"epoch {epoch + 1}", flush=True)
            sys.exit(128 + signal.SIGTERM)

    best = min(history, key=lambda entry: entry["val_loss"])
    write_json(os.path.join(output_dir, "model.json"), {"config": vars(args), "model": model.state()})
    write_json(os.path.join(output_dir, "history.json"), history)
    print(f"best val_loss {best['val_loss']:.4f} at epoch {best['step']}; model saved to {output_dir}/model.json")


if __name__ == "__main__":
    main()
