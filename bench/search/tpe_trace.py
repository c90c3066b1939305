"""Optuna's TPE, proposal by proposal, for the trial-by-trial check of docs/decisions/0075.

Usage: tpe_trace.py PROBLEM SEED [TRIALS [multivariate]] > trace.json
  PROBLEM: branin or hartmann6; `multivariate` passes multivariate=True (Optuna 4's option).
Runs Optuna's TPESampler and records, for every model proposal, the finished trials it saw,
the 24 candidates it drew from l(x), their log l(x) - log g(x), and the chosen one.
The Rust test `search::comparison::same_model_as_optuna` (ignored; APP_TPE_TRACE=trace.json)
scores the same candidates on the same history with app's kernels and compares.
"""

import json
import sys
import warnings

import optuna
from optuna.samplers import TPESampler

from optuna_bench import branin, hartmann6


def main():
    problem = {"branin": branin, "hartmann6": hartmann6}[sys.argv[1]]
    seed = int(sys.argv[2])
    trials = int(sys.argv[3]) if len(sys.argv) > 3 else 40
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.simplefilter("ignore")
    steps = []
    original = TPESampler._compute_acquisition_func

    def recording(self, samples, mpe_below, mpe_above):
        values = original(self, samples, mpe_below, mpe_above)
        names = list(samples)
        steps.append({"candidates": [[float(samples[n][i]) for n in names] for i in range(len(values))],
                      "scores": [float(v) for v in values]})
        return values

    TPESampler._compute_acquisition_func = recording
    options = {"multivariate": True} if sys.argv[4:] == ["multivariate"] else {}
    study = optuna.create_study(sampler=TPESampler(seed=seed, **options))
    history = []

    def objective(trial):
        before = len(steps)
        value = problem(trial, seed)
        if len(steps) > before:
            steps[-1]["history"] = [dict(h) for h in history]
            steps[-1]["chosen"] = [trial.params[n] for n in trial.params]
        history.append({"values": [trial.params[n] for n in trial.params], "metric": value})
        return value

    study.optimize(objective, n_trials=trials)
    json.dump({"optuna_version": optuna.__version__, "multivariate": bool(options), "problem": sys.argv[1], "seed": seed, "steps": steps},
              sys.stdout)


if __name__ == "__main__":
    main()
