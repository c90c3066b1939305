"""Optuna's TPE on Branin and Hartmann-6, for the comparison in docs/decisions/0075.

Usage: tpe_compare.py SAMPLER [SEEDS [TRIALS [FIRST_SEED]]]
  SAMPLER: default (TPESampler(seed=s)), multivariate (TPESampler(seed=s, multivariate=True)),
           independent (TPESampler(seed=s, multivariate=False)).
Prints one JSON object: {"optuna_version", "sampler", "trials", "best": {problem: [best per
seed]}, "start": {problem: [best of the 10 random start-up trials per seed]}}. Seeds run from
FIRST_SEED (0), as in the Rust side's `search::comparison::tpe_against_optuna` test. The
problems come from optuna_bench.py, so both sides see the same functions.
"""

import json
import math
import sys
import warnings

import optuna

from optuna_bench import branin, hartmann6


def sampler(kind, seed):
    if kind == "default":
        return optuna.samplers.TPESampler(seed=seed)
    return optuna.samplers.TPESampler(seed=seed, multivariate=(kind == "multivariate"))


def best_per_seed(objective, kind, seeds, trials, first):
    """(best after `trials`, best of the first 10) per seed."""
    bests = []
    for seed in range(first, first + seeds):
        study = optuna.create_study(sampler=sampler(kind, seed))
        study.optimize(lambda trial: objective(trial, seed), n_trials=trials)
        values = [trial.value for trial in study.trials]
        bests.append((min(values), min(values[:10])))
    return bests


def main():
    kind = sys.argv[1]
    seeds = int(sys.argv[2]) if len(sys.argv) > 2 else 30
    trials = int(sys.argv[3]) if len(sys.argv) > 3 else 40
    first = int(sys.argv[4]) if len(sys.argv) > 4 else 0
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.simplefilter("ignore")
    runs = {name: best_per_seed(f, kind, seeds, trials, first) for name, f in (("branin", branin), ("hartmann6", hartmann6))}
    best = {name: [b for b, _ in pairs] for name, pairs in runs.items()}
    start = {name: [s for _, s in pairs] for name, pairs in runs.items()}
    json.dump({"optuna_version": optuna.__version__, "sampler": kind, "trials": trials, "best": best, "start": start},
              sys.stdout)
    print()


if __name__ == "__main__":
    main()
