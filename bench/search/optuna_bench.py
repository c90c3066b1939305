"""Optuna's side of `app-bench search`: the same problems, the same budgets, the same seeds.

Usage: optuna_bench.py [SEEDS [FIRST_SEED]]
OPTUNA_ONLY=branin,mixed5 runs only those problems (and no pruners); OPTUNA_GP=1 adds
Optuna's GPSampler (it needs torch and scipy), OPTUNA_GP=only runs it alone.

Writes JSON: {"search": {problem: {"tpe, 1 worker": [[true value of the best-reported trial
              after trial 1..100] per seed], ...}},
              "pruning": {pruner: {"saved": median fraction, "best_in_top3": seeds}}}.
Problems are defined exactly as in bench/src/search_table.rs, learning curves as in
bench/src/search.rs (SplitMix64 noise), so both sides see the same numbers.
"""

import json
import math
import os
import statistics
import sys

import optuna

TRIALS = 100
CONFIGS = 81
MAX_STEP = 81
MASK = (1 << 64) - 1


def unit(seed, a, b):
    state = (seed * 1_000_003 + a * 1_009 + b) & MASK
    state = (state + 0x9E3779B97F4A7C15) & MASK
    state = ((state ^ (state >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    state = ((state ^ (state >> 27)) * 0x94D049BB133111EB) & MASK
    state ^= state >> 31
    return (state >> 11) / float(1 << 53)


def branin(x):
    x1, x2 = x
    b, c, t = 5.1 / (4 * math.pi**2), 5 / math.pi, 1 / (8 * math.pi)
    return (x2 - b * x1 * x1 + c * x1 - 6) ** 2 + 10 * (1 - t) * math.cos(x1) + 10


ALPHA = [1.0, 1.2, 3.0, 3.2]
A = [
    [10, 3, 17, 3.5, 1.7, 8],
    [0.05, 10, 17, 0.1, 8, 14],
    [3, 3.5, 1.7, 10, 17, 8],
    [17, 8, 0.05, 10, 0.1, 14],
]
P = [
    [1312, 1696, 5569, 124, 8283, 5886],
    [2329, 4135, 8307, 3736, 1004, 9991],
    [2348, 1451, 3522, 2883, 3047, 6650],
    [4047, 8828, 8732, 5743, 1091, 381],
]


def hartmann6(x):
    return -sum(
        ALPHA[i] * math.exp(-sum(A[i][j] * (x[j] - P[i][j] * 1e-4) ** 2 for j in range(6))) for i in range(4)
    )


def rosenbrock(x):
    return sum(100 * (x[i + 1] - x[i] ** 2) ** 2 + (1 - x[i]) ** 2 for i in range(len(x) - 1))


def styblinski_tang(x):
    return 0.5 * sum(v**4 - 16 * v * v + 5 * v for v in x)


def mixed(x):
    lr, wd, n, kind, act = x
    return 1 + (math.log10(lr) + 3) ** 2 + 0.5 * (math.log10(wd) + 4) ** 2 + (n - 6) ** 2 / 10 + [0.0, 0.5, 1.0][kind] + [0.3, 0.0][act]


def choices(x):
    opt, lr, batch, dropout = x
    return (
        1
        + [0.3, 0.0, 0.05][opt]
        + 0.1 * (lr - [4, 2, 2][opt]) ** 2
        + [0.1, 0.0, 0.05, 0.2][batch]
        + [0.15, 0.05, 0.0, 0.05, 0.3][dropout]
    )


def choices_space(trial):
    return [trial.suggest_categorical(name, list(range(n))) for name, n in (("opt", 3), ("lr", 6), ("batch", 4), ("dropout", 5))]


WIDE_OFFSETS = [0.8, 0.35, 1.2, 0.0, 0.6, 0.25, 0.9, 0.45, 1.5, 0.15, 0.7, 0.3, 1.0, 0.5, 0.1]


def wide_choice(x):
    arch, lr, wd = x
    shift = 0.5 * (arch % 3 - 1)
    return 1 + WIDE_OFFSETS[arch] + (math.log10(lr) + 3 + shift) ** 2 + 0.5 * (math.log10(wd) + 4) ** 2


def wide_choice_space(trial):
    return [
        trial.suggest_categorical("arch", list(range(15))),
        trial.suggest_float("lr", 1e-5, 1e-1, log=True),
        trial.suggest_float("wd", 1e-6, 1e-2, log=True),
    ]


def floats(names, low, high, log=False):
    return lambda trial: [trial.suggest_float(name, low, high, log=log) for name in names]


def mixed_space(trial):
    return [
        trial.suggest_float("lr", 1e-5, 1e-1, log=True),
        trial.suggest_float("wd", 1e-6, 1e-2, log=True),
        trial.suggest_int("n", 1, 10),
        trial.suggest_categorical("kind", [0, 1, 2]),
        trial.suggest_categorical("act", [0, 1]),
    ]


# name: (space, true objective, noise sd); as PROBLEMS in bench/src/search_table.rs.
PROBLEMS = {
    "branin": (lambda t: [t.suggest_float("x1", -5.0, 10.0), t.suggest_float("x2", 0.0, 15.0)], branin, 0.0),
    "hartmann6": (floats([f"x{j}" for j in range(6)], 0.0, 1.0), hartmann6, 0.0),
    "rosenbrock4_log": (floats([f"x{j}" for j in range(4)], 0.01, 10.0, log=True), rosenbrock, 0.0),
    "styblinski_tang8": (floats([f"x{j}" for j in range(8)], -5.0, 5.0), styblinski_tang, 0.0),
    "mixed5": (mixed_space, mixed, 0.0),
    "noisy_hartmann6": (floats([f"x{j}" for j in range(6)], 0.0, 1.0), hartmann6, 0.1),
    "choices4": (choices_space, choices, 0.0),
    "wide_choice": (wide_choice_space, wide_choice, 0.0),
}


def gaussian(seed, trial):
    u1 = 1.0 - unit(seed, trial, 11)
    u2 = unit(seed, trial, 12)
    return math.sqrt(-2.0 * math.log(u1)) * math.cos(2.0 * math.pi * u2)


def sampler_of(name, seed):
    if name == "tpe":
        return optuna.samplers.TPESampler(seed=seed)
    if name == "gp":
        return optuna.samplers.GPSampler(seed=seed)
    return optuna.samplers.RandomSampler(seed=seed)


def search(problem, sampler, workers, seeds):
    """The true value of the best-reported trial after each trial, per seed: `workers` trials
    asked at once, the oldest told first (as a queue of equal-length runs)."""
    space, truth, noise = PROBLEMS[problem]
    curves = []
    for seed in seeds:
        study = optuna.create_study(sampler=sampler_of(sampler, seed))
        flying, told = [], 0
        best_reported, best_true, curve = math.inf, math.nan, []
        while told < TRIALS:
            while len(flying) < workers and told + len(flying) < TRIALS:
                trial = study.ask()
                flying.append((trial, space(trial)))
            trial, x = flying.pop(0)
            value = truth(x)
            reported = value + noise * gaussian(seed, trial.number)
            study.tell(trial, reported)
            told += 1
            if reported < best_reported:
                best_reported, best_true = reported, value
            curve.append(best_true)
        curves.append(curve)
    return curves


def curve(seed, config, step):
    last = 0.1 + 0.9 * unit(seed, config, 0)
    amplitude = 0.5 + 2.0 * unit(seed, config, 1)
    rate = 0.3 + 0.7 * unit(seed, config, 2)
    return last + amplitude * step ** (-rate) + 0.02 * (unit(seed, config, 100 + step) - 0.5)


def final_loss(seed, config):
    last = 0.1 + 0.9 * unit(seed, config, 0)
    amplitude = 0.5 + 2.0 * unit(seed, config, 1)
    rate = 0.3 + 0.7 * unit(seed, config, 2)
    return last + amplitude * MAX_STEP ** (-rate)


def pruning(make_pruner, seeds):
    saved, kept = [], 0
    for seed in seeds:
        study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=seed), pruner=make_pruner())
        steps, completed = 0, []
        for config in range(CONFIGS):
            trial = study.ask()
            value = None
            for step in range(1, MAX_STEP + 1):
                value = curve(seed, config, step)
                steps += 1
                trial.report(value, step)
                if trial.should_prune():
                    study.tell(trial, state=optuna.trial.TrialState.PRUNED)
                    value = None
                    break
            if value is not None:
                study.tell(trial, value)
                completed.append((value, config))
        saved.append(1 - steps / (CONFIGS * MAX_STEP))
        truth = min(range(CONFIGS), key=lambda config: final_loss(seed, config))
        completed.sort()
        kept += any(config == truth for _, config in completed[:3])
    return {"saved": statistics.median(saved), "best_in_top3": kept}


def main():
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 15
    first = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    seeds = range(first, first + count)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    # GPSampler needs torch and scipy; without them it is left out (run.sh --gp installs them).
    # OPTUNA_GP=only runs GPSampler alone (its hour apart from the others' minutes).
    configs = [("tpe", 1), ("tpe", 8), ("random", 1)]
    if os.environ.get("OPTUNA_GP") == "1":
        configs += [("gp", 1), ("gp", 8)]
    if os.environ.get("OPTUNA_GP") == "only":
        configs = [("gp", 1), ("gp", 8)]
    only = [name for name in os.environ.get("OPTUNA_ONLY", "").split(",") if name]
    unknown = [name for name in only if name not in PROBLEMS]
    if unknown:
        sys.exit(f"unknown problems {unknown}; known: {list(PROBLEMS)}")
    results = {
        "optuna_version": optuna.__version__,
        "first_seed": first,
        "seeds": count,
        "search": {
            problem: {
                f"{sampler}, {workers} worker{'s' if workers > 1 else ''}": search(problem, sampler, workers, seeds)
                for sampler, workers in configs
            }
            for problem in PROBLEMS
            if not only or problem in only
        },
        # The pruners once, with TPE's run: not again with GPSampler's alone.
        "pruning": {} if only or os.environ.get("OPTUNA_GP") == "only" else {
            f"{name} (min {low})": pruning(make(low), seeds)
            for low in (1, 3)
            for name, make in (
                ("SuccessiveHalving", lambda low: lambda: optuna.pruners.SuccessiveHalvingPruner(min_resource=low, reduction_factor=3)),
                ("Hyperband", lambda low: lambda: optuna.pruners.HyperbandPruner(min_resource=low, max_resource=MAX_STEP, reduction_factor=3)),
            )
        }
        | {"Median (warmup 5)": pruning(lambda: optuna.pruners.MedianPruner(n_startup_trials=5, n_warmup_steps=5), seeds)},
    }
    json.dump(results, sys.stdout)


if __name__ == "__main__":
    main()
