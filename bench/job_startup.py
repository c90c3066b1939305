#!/usr/bin/env python3
"""Where a short job's time goes between processes, from the kernel's own scheduler events
(`perf record -e sched:...`, needs root or perf_event_paranoid <= 1): COUNT jobs of
`sleep 0.01` under app (server + one worker, as bench/peers.py starts them), task-spooler or
two shell loops (the exec floor), and for each job process

- start-up: from its exec to its `clock_nanosleep` (loader, libc, locale: the same work under
  every system, so a longer one means it waited for a CPU);
- preempted: the share of start-ups that were preempted, how long they waited, and by whom;
- gap: from one job's exit to the next job's exec (what the queue itself costs).

This is how the worker was found preempting its short jobs' start-ups (ARCHITECTURE.md, "Tried
and reverted: the worker daemon as SCHED_BATCH").

    sudo python3 bench/job_startup.py [--system app|tsp|floor] [--app target/release/app] [--count 400]
"""

import argparse
import bisect
import collections
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import peers

EVENTS = "sched:sched_process_exec,sched:sched_process_exit,sched:sched_switch,syscalls:sys_enter_clock_nanosleep"
LINE = re.compile(r"\s*(\S+)\s+(\d+)\s+\[\d+\]\s+([\d.]+):\s+(\S+):\s*(.*)")
SWITCH = re.compile(r"prev_pid=(\d+) .*prev_state=(\S+) ==> next_comm=(\S+) next_pid=(\d+)")


def analyse(lines):
    execs, sleeps, exits = {}, {}, {}
    preempted, waited, preemptors, left_at = collections.Counter(), collections.Counter(), collections.Counter(), {}
    for line in lines:
        match = LINE.match(line)
        if not match:
            continue
        comm, pid, at, event, rest = match.groups()
        pid, at = int(pid), float(at)
        if event.endswith("sched_process_exec") and "/sleep" in rest.split()[0]:
            execs[pid] = at
        elif event.endswith("sys_enter_clock_nanosleep") and pid in execs:
            sleeps.setdefault(pid, at)
        elif event.endswith("sched_process_exit") and pid in execs:
            exits[pid] = at
        elif event.endswith("sched_switch"):
            switch = SWITCH.search(rest)
            if not switch:
                continue
            prev, state, next_comm, next_pid = int(switch[1]), switch[2], switch[3], int(switch[4])
            # A job process taken off its CPU while runnable, before its sleep: preempted.
            if prev in execs and prev not in sleeps and state.startswith("R"):
                preempted[prev] += 1
                preemptors[next_comm] += 1
                left_at[prev] = at
            if next_pid in left_at:
                waited[next_pid] += at - left_at.pop(next_pid)
    jobs = [pid for pid in execs if pid in sleeps]
    starts = sorted(execs.values())
    gaps = []
    taken = set()
    for end in sorted(exits.values()):
        index = bisect.bisect_right(starts, end)
        while index < len(starts) and index in taken:
            index += 1
        if index < len(starts) and starts[index] - end < 0.005:
            taken.add(index)
            gaps.append(starts[index] - end)
    return {
        "jobs": len(jobs),
        "start-up median (ms)": statistics.median(sleeps[pid] - execs[pid] for pid in jobs) * 1e3,
        "start-ups preempted": sum(1 for pid in jobs if preempted[pid]) / len(jobs),
        "wait when preempted, mean per job (ms)": sum(waited[pid] for pid in jobs) / len(jobs) * 1e3,
        "exit -> next exec median (ms)": statistics.median(gaps) * 1e3 if gaps else float("nan"),
        "preempted by": dict(preemptors.most_common(5)),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--system", choices=["app", "tsp", "floor"], default="app")
    parser.add_argument("--app", default="target/release/app")
    parser.add_argument("--count", type=int, default=400)
    args = parser.parse_args()
    words = ["sleep", "0.01"]
    with tempfile.TemporaryDirectory(prefix="job-startup-") as directory:
        data = os.path.join(directory, "perf.data")
        run = {
            "app": f"import peers; print(peers.run_app({str(Path(args.app).resolve())!r}, {words!r}, {args.count}))",
            "tsp": f"import peers; print(peers.run_tsp({words!r}, {args.count}))",
            "floor": f"import peers; print(peers.run_floor([], {words!r}, {args.count}))",
        }[args.system]
        bench = os.path.dirname(os.path.abspath(__file__))
        subprocess.run(["perf", "record", "-q", "-a", "-e", EVENTS, "-o", data, sys.executable, "-c", run],
                       check=True, cwd=bench, stdout=subprocess.DEVNULL)
        script = subprocess.run(["perf", "script", "-i", data], check=True, capture_output=True, text=True)
    for name, value in analyse(script.stdout.splitlines()).items():
        print(f"{name}: {value:.3f}" if isinstance(value, float) else f"{name}: {value}")


if __name__ == "__main__":
    main()
