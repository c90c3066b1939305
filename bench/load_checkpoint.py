"""Loads a checkpoint of `app train` into a PyTorch module and runs it.

The weights are a plain state dict with PyTorch's keys, so loading takes two lines:

    import torch
    state = torch.load("model_best.pt")        # weights_only=True, torch's default since 2.6

(or `safetensors.torch.load_file("model_best.safetensors")`). This script also rebuilds the
model from the run's config.json, with the same attribute names (fc0, bn0, ..., out), loads the
state dict strictly and, given --input, writes the model's outputs for those rows (eval mode) to
--output. It prints what it loaded as one JSON line. The trainer's tests and
scripts/gpu-check.sh use it.

    .venv-torch/bin/python bench/load_checkpoint.py RUN_DIR [--checkpoint model_best.pt]
        [--input x.npy --output y.npy]
"""

import argparse
import json
import os

import torch
from torch import nn

ACTIVATIONS = {"relu": nn.ReLU, "gelu": nn.GELU, "tanh": nn.Tanh, "silu": nn.SiLU}


class AppModel(nn.Module):
    """The MLP (and the CNN's blocks) as `app train` builds them."""

    def __init__(self, model, state):
        super().__init__()
        self.steps = []
        activation = ACTIVATIONS[model["activation"]]
        if model["name"] == "cnn":
            for block, _ in enumerate(model["channels"]):
                weight = state[f"conv{block}.weight"]
                self.add(f"conv{block}", nn.Conv2d(weight.shape[1], weight.shape[0], 3, padding=1))
                if model["batch_norm"]:
                    self.add(f"conv_bn{block}", nn.BatchNorm2d(weight.shape[0]))
                self.steps.append(activation())
                self.steps.append("pool")
        self.steps.append("flatten")
        for layer, _ in enumerate(model["hidden_dims"]):
            weight = state[f"fc{layer}.weight"]
            self.add(f"fc{layer}", nn.Linear(weight.shape[1], weight.shape[0]))
            if model["batch_norm"]:
                self.add(f"bn{layer}", nn.BatchNorm1d(weight.shape[0]))
            self.steps.append(activation())
        weight = state["out.weight"]
        self.add("out", nn.Linear(weight.shape[1], weight.shape[0]))

    def add(self, name, module):
        setattr(self, name, module)
        self.steps.append(module)

    def forward(self, x):
        for step in self.steps:
            if step == "flatten":
                x = x.flatten(1)
            elif step == "pool":
                if x.shape[-1] >= 2 and x.shape[-2] >= 2:
                    x = nn.functional.max_pool2d(x, 2)
            else:
                x = step(x)
        return x


def load(path):
    if path.endswith(".safetensors"):
        from safetensors.torch import load_file

        return load_file(path), "safetensors.torch.load_file"
    return torch.load(path), "torch.load (weights_only default)"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("run_dir")
    parser.add_argument("--checkpoint", default="model_best.pt")
    parser.add_argument("--input")
    parser.add_argument("--output")
    args = parser.parse_args()

    state, how = load(os.path.join(args.run_dir, args.checkpoint))
    with open(os.path.join(args.run_dir, "config.json")) as file:
        config = json.load(file)
    model = AppModel(config["model"], state)
    model.load_state_dict(state, strict=True)
    model.eval()
    report = {"loaded_with": how, "torch": torch.__version__, "keys": list(state.keys())}
    if args.input:
        import numpy

        x = torch.from_numpy(numpy.load(args.input))
        if config["model"]["name"] == "cnn" and x.dim() == 2:
            x = x.reshape(x.shape[0], 1, 1, -1)
        with torch.no_grad():
            y = model(x)
        numpy.save(args.output, y.numpy())
        report["rows"] = x.shape[0]
    print(json.dumps(report))


if __name__ == "__main__":
    main()
