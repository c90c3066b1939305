#!/usr/bin/env python3
"""Two builds of app side by side on short jobs: each round starts `app --server-only` and one
`app --client-only --max-jobs 2` of each build in turn (alternating which goes first), runs a
warm-up and then COUNT jobs of COMMAND, and prints jobs/s and the server's and the worker's CPU
per job; then the medians. This is how the same-sitting A/Bs in docs/benchmarks.md were taken.

`--churn N` makes and removes N empty files in the temporary directory before each build's
turn, as the other systems of a peers run do between app's rounds: ext4 then skips every inode
freed in the last minutes when it hands out a new one, which is how the worker's per-job files
were found to cost ever more (ARCHITECTURE.md, "Attempt files keep their inodes").

`--tsp` runs task-spooler in each round too (after both builds, each round in a fresh `tsp`
server), so the two builds' figures come with the peer's of the same sitting.

    python3 bench/ab.py OLD_BINARY NEW_BINARY [--rounds 6] [--count 2000] [--command true] [--churn 20000] [--tsp]
"""

import argparse
import shlex
import shutil
import statistics
import tempfile

import peers


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("binaries", nargs=2)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--count", type=int, default=2000)
    parser.add_argument("--command", default="true")
    parser.add_argument("--churn", type=int, default=0, help="files made and removed before each turn")
    parser.add_argument("--tsp", action="store_true", help="task-spooler in each round too")
    args = parser.parse_args()
    words = shlex.split(args.command)
    figures = {binary: [] for binary in args.binaries}
    tsp_rates = []
    for round_number in range(1, args.rounds + 1):
        order = args.binaries if round_number % 2 else list(reversed(args.binaries))
        for binary in order:
            if args.churn:
                churn = tempfile.mkdtemp(prefix="bench-churn-")
                for number in range(args.churn):
                    open(f"{churn}/{number}", "w").close()
                shutil.rmtree(churn)
            app = peers.App(binary)
            try:
                app.run(words, 200)
                elapsed, (server, worker) = app.run(words, args.count)
            finally:
                app.stop()
            figure = (args.count / elapsed, server / args.count * 1e3, worker / args.count * 1e3)
            figures[binary].append(figure)
            print(f"round {round_number} {binary}: {figure[0]:.0f} jobs/s, "
                  f"server {figure[1]:.3f} ms/job, worker {figure[2]:.3f} ms/job", flush=True)
        if args.tsp:
            elapsed, _ = peers.run_tsp(words, args.count)
            tsp_rates.append(args.count / elapsed)
            print(f"round {round_number} task-spooler: {tsp_rates[-1]:.0f} jobs/s", flush=True)
    for binary, rows in figures.items():
        rate, server, worker = (statistics.median(row[i] for row in rows) for i in range(3))
        print(f"{binary}: median {rate:.0f} jobs/s, server CPU {server:.3f} ms/job, worker {worker:.3f} ms/job")
    if tsp_rates:
        tsp_rate = statistics.median(tsp_rates)
        ratios = ", ".join(f"{statistics.median(row[0] for row in rows) / tsp_rate:.2f}x" for rows in figures.values())
        print(f"task-spooler: median {tsp_rate:.0f} jobs/s; the builds' medians are {ratios} of it")


if __name__ == "__main__":
    main()
