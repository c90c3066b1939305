#!/usr/bin/env python3
"""Short jobs side by side: app against HyperQueue, task-spooler and GNU parallel (issue 11).

Each round runs every system on the same workloads, in an order that rotates from round to
round, and the table gives the median jobs/s over the rounds, the range, and the ratio to app;
app's own server and worker CPU per job; dispatch latency (submission to the job's process
running: the job writes the wall clock to a file); and the time to submit 100,000 jobs.

Like for like: every system runs the job's program directly (`true`, `sleep 0.01`; the latency
job is the same `sh -c` line everywhere) at parallelism 2; GNU parallel gets SHELL=/bin/sh (dash, as the floor). The floors are two
loops of `sh -c true` and of `true`, one process start per job, each loop in /bin/sh (dash), the
shell jobs run under.

Each measurement runs in a fresh Python process (`--one`), so no system inherits another's
state: HyperQueue's later rounds in one process took twice as long as its first. HyperQueue is
run as its users run it from Python (the PyPI wheel ships no `hq` binary): one job of N tasks
of one program, on a local cluster with one worker of 2 cores; its end is taken precisely, at
the close of the last task's stdout file (inotify), not from `wait_for_jobs`, which polls once
a second. Every system's directories (app's data and work directories, task-spooler's output,
HyperQueue's server and task directories) are under `--dir`: the tables are printed for a
directory on the disk and for one on a tmpfs, because a disk that just deleted thousands of
files slows the peers that create a file per job more than app, which keeps its files. `--check`
runs the independent harness instead: each system once on 10x the jobs, its end taken the way
its own tools wait (app's CLI `submit --wait`, `tsp -w`, HyperQueue's `wait_for_jobs`), so
their coarser clocks cost little.

    scripts/bench-peers.sh [--rounds 5] [--app target/release/app] [--check]
"""

import argparse
import collections
import ctypes
import json
import os
import select
import shutil
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

WORKLOADS = [("true", ["true"], 2000), ("sleep 0.01", ["sleep", "0.01"], 500)]
PARALLEL = 2
TICKS = os.sysconf("SC_CLK_TCK")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(pid):
    """User + system CPU of one process (not its children), in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def http(url, method="GET", body=None, content_type="application/json"):
    request = urllib.request.Request(url, data=body, method=method)
    if body is not None:
        request.add_header("content-type", content_type)
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.loads(response.read())


class App:
    """`app --server-only` and one `app --client-only --max-jobs 2` on loopback."""

    def __init__(self, binary, workers=True):
        self.dir = tempfile.mkdtemp(prefix="bench-app-", dir=BASE)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {k: v for k, v in os.environ.items() if not k.startswith("APP_")}
        env["RUST_LOG"] = "warn"
        quiet = dict(stdout=subprocess.DEVNULL, stderr=open(f"{self.dir}/log", "w"), env=env)
        self.server = subprocess.Popen(
            [binary, "--server-only", "--bind", f"127.0.0.1:{self.port}", "--data-dir", f"{self.dir}/data"], **quiet
        )
        self.wait(lambda: http(f"{self.url}/api/health"))
        self.worker = None
        if workers:
            self.worker = subprocess.Popen(
                [binary, "--client-only", "--url", self.url, "--max-jobs", str(PARALLEL), "--name", "bench",
                 "--work-dir", f"{self.dir}/work"], **quiet)
            self.wait(lambda: http(f"{self.url}/api/workers") or None)
        self.sweeps = 0

    @staticmethod
    def wait(check, timeout=30):
        deadline = time.time() + timeout
        while True:
            try:
                if check():
                    return
            except OSError:
                pass
            if time.time() > deadline:
                raise RuntimeError("app did not come up")
            time.sleep(0.05)

    def submit(self, command, count):
        self.sweeps += 1
        name = f"bench-{self.sweeps}"
        values = ", ".join(str(i) for i in range(count))
        yaml = f"name: {name}\ncommand: {json.dumps(command)}\ngrid: {{i: [{values}]}}\n"
        http(f"{self.url}/api/sweeps", "POST", yaml.encode(), "application/yaml")
        return name

    def done(self, name):
        counts = http(f"{self.url}/api/sweeps/{name}")["counts"]
        return counts["queued"] == 0 and counts["running"] == 0

    def wait_for_last(self, name):
        """Long-polls the log of the sweep's last job until its attempt ends, as `tsp -w` waits
        for the last job and HyperQueue's `wait_for_jobs` for its jobs: polling the sweep every
        20 ms instead cost the server 0.2 ms of CPU per `sleep 0.01` job, a quarter of its
        share, and took that CPU from the run being measured."""
        last = http(f"{self.url}/api/jobs?sweep={name}&order=desc&limit=1")["jobs"][0]["id"]
        offset = 0
        while True:
            log = http(f"{self.url}/api/jobs/{last}/log?offset={offset}&wait_ms=10000")
            if log["finished"]:
                return
            offset = log["next_offset"]

    def run(self, words, count):
        command = " ".join(words)
        cpu = (cpu_seconds(self.server.pid), cpu_seconds(self.worker.pid))
        started = time.perf_counter()
        name = self.submit(command, count)
        self.wait_for_last(name)
        # Dispatch is in id order, so only the jobs beside the last one may still be running.
        while not self.done(name):
            time.sleep(0.002)
        elapsed = time.perf_counter() - started
        used = (cpu_seconds(self.server.pid) - cpu[0], cpu_seconds(self.worker.pid) - cpu[1])
        return elapsed, used

    def stop(self):
        for process in (self.worker, self.server):
            if process:
                process.send_signal(signal.SIGTERM)
        for process in (self.worker, self.server):
            if process:
                try:
                    process.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    process.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


def run_app(binary, words, count):
    app = App(binary)
    try:
        return app.run(words, count)
    finally:
        app.stop()


class Quiet:
    """Sends this process's stdout and stderr to /dev/null (HyperQueue prints a server table and
    a progress bar from native code)."""

    def __enter__(self):
        sys.stdout.flush()
        sys.stderr.flush()
        self.saved = (os.dup(1), os.dup(2))
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 1)
        os.dup2(null, 2)
        os.close(null)

    def __exit__(self, *exc):
        os.dup2(self.saved[0], 1)
        os.dup2(self.saved[1], 2)
        os.close(self.saved[0])
        os.close(self.saved[1])


def run_hq(words, count):
    with Quiet():
        return run_hq_loud(words, count)


IN_CLOSE_WRITE = 0x8


def closed_files(fd):
    """The names of the files an inotify descriptor saw closed after writing, since last asked."""
    names = []
    try:
        data = os.read(fd, 1 << 20)
    except BlockingIOError:
        return names
    at = 0
    while at < len(data):
        _, _, _, length = struct.unpack_from("iIII", data, at)
        names.append(data[at + 16 : at + 16 + length].rstrip(b"\0").decode())
        at += 16 + length
    return names


def run_hq_loud(words, count):
    from hyperqueue import Job
    from hyperqueue.cluster import LocalCluster, WorkerConfig

    libc = ctypes.CDLL(None, use_errno=True)
    with tempfile.TemporaryDirectory(prefix="bench-hq-", dir=BASE) as directory:
        tasks = os.path.join(directory, "tasks")
        os.makedirs(tasks)
        with LocalCluster(os.path.join(directory, "hq")) as cluster:
            cluster.start_worker(WorkerConfig(cores=PARALLEL))
            client = cluster.client()
            job = Job()
            for _ in range(count):
                # Each task's stdout and stderr files go to its working directory; the worker
                # hands the task the files it opened, so each stdout file is closed for the
                # last time (one IN_CLOSE_WRITE) when its task has ended.
                job.program(words, cwd=tasks)
            watch = libc.inotify_init1(os.O_NONBLOCK)
            libc.inotify_add_watch(watch, tasks.encode(), IN_CLOSE_WRITE)
            ended = set()
            started = time.perf_counter()
            submitted = client.submit(job)
            while len(ended) < count:
                select.select([watch], [], [], 1.0)
                ended.update(name for name in closed_files(watch) if name.endswith(".stdout"))
            elapsed = time.perf_counter() - started
            os.close(watch)
            client.wait_for_jobs([submitted])
            return elapsed, None


def tsp(env, *args):
    return subprocess.run(["tsp", *args], env=env, capture_output=True, text=True, check=True).stdout.strip()


def run_tsp(words, count):
    with tempfile.TemporaryDirectory(prefix="bench-tsp-", dir=BASE) as directory:
        # TMPDIR: where tsp writes each job's output (ts-out.*), removed with the directory.
        env = dict(os.environ, TS_SOCKET=f"{directory}/socket", TS_MAXFINISHED="10", TS_SAVELIST="", TMPDIR=directory)
        tsp(env, "-S", str(PARALLEL))
        started = time.perf_counter()
        ids = [tsp(env, *words) for _ in range(count)]
        for job in ids[-PARALLEL * 2:]:
            subprocess.run(["tsp", "-w", job], env=env, capture_output=True)
        elapsed = time.perf_counter() - started
        subprocess.run(["tsp", "-K"], env=env, capture_output=True)
        return elapsed, None


def run_parallel(words, count):
    env = dict(os.environ, SHELL="/bin/sh", TMPDIR=BASE)
    started = time.perf_counter()
    subprocess.run(["parallel", f"-j{PARALLEL}", "-N0", *words, ":::", *map(str, range(count))], env=env,
                   check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - started, None


def run_floor(prefix, words, count):
    # The program by absolute path: a bare `true` would be the shell's builtin, no process.
    program = [shutil.which(words[0])] + words[1:] if not prefix else words
    loop = " ".join(prefix + program)
    script = " ".join(
        f"(i=0; while [ $i -lt {count // PARALLEL} ]; do {loop}; i=$((i+1)); done) &" for _ in range(PARALLEL)
    ) + " wait"
    started = time.perf_counter()
    subprocess.run(["/bin/sh", "-c", script], check=True)
    return time.perf_counter() - started, None


def stamp(target):
    """The job writes the wall clock at its start: a file's mtime is the kernel's coarse clock
    (a tick, up to 4 ms), which can read earlier than the submission it follows."""
    return f"date +%s%N > {target}.part && mv {target}.part {target}"


def started_at(target):
    with open(target) as file:
        return int(file.read().strip())


def dispatch_latencies(system, binary, samples):
    """Seconds from submission to the job's process running, for `samples` single jobs."""
    latencies = []
    with tempfile.TemporaryDirectory(prefix="bench-latency-") as directory:
        if system == "app":
            app = App(binary)
            try:
                for sample in range(samples):
                    target = f"{directory}/{sample}"
                    submitted = time.time_ns()
                    name = app.submit(stamp(target), 1)
                    while not os.path.exists(target):
                        time.sleep(0.001)
                    latencies.append((started_at(target) - submitted) / 1e6)
                    while not app.done(name):
                        time.sleep(0.005)
            finally:
                app.stop()
        elif system == "hq":
            quiet = Quiet()
            quiet.__enter__()
            from hyperqueue import Job
            from hyperqueue.cluster import LocalCluster, WorkerConfig

            with LocalCluster(str(Path(directory) / "hq")) as cluster:
                cluster.start_worker(WorkerConfig(cores=PARALLEL))
                client = cluster.client()
                for sample in range(samples):
                    target = f"{directory}/{sample}"
                    job = Job()
                    job.program(["/bin/sh", "-c", stamp(target)], cwd=directory)
                    submitted = time.time_ns()
                    client.wait_for_jobs([client.submit(job)])
                    latencies.append((started_at(target) - submitted) / 1e6)
            quiet.__exit__(None, None, None)
        elif system == "tsp":
            env = dict(os.environ, TS_SOCKET=f"{directory}/socket", TS_SAVELIST="", TMPDIR=directory)
            tsp(env, "-S", str(PARALLEL))
            for sample in range(samples):
                target = f"{directory}/{sample}"
                submitted = time.time_ns()
                job = tsp(env, "/bin/sh", "-c", stamp(target))
                subprocess.run(["tsp", "-w", job], env=env, capture_output=True)
                latencies.append((started_at(target) - submitted) / 1e6)
            subprocess.run(["tsp", "-K"], env=env, capture_output=True)
    return latencies


def submit_100k(system, binary):
    if system == "app":
        app = App(binary, workers=False)
        try:
            values = ", ".join(str(i) for i in range(100_000))
            yaml = f"name: big\ncommand: \"true\"\ngrid: {{i: [{values}]}}\n".encode()
            started = time.perf_counter()
            http(f"{app.url}/api/sweeps", "POST", yaml, "application/yaml")
            return time.perf_counter() - started
        finally:
            app.stop()
    from hyperqueue import Job
    from hyperqueue.cluster import LocalCluster

    with Quiet(), tempfile.TemporaryDirectory(prefix="bench-hq-") as directory:
        with LocalCluster(directory) as cluster:
            client = cluster.client()
            job = Job()
            for _ in range(100_000):
                job.program(["true"], cwd=directory)
            started = time.perf_counter()
            client.submit(job)
            return time.perf_counter() - started


def percentile(values, fraction):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(fraction * (len(ordered) - 1))))]


BASE = None
SYSTEMS = ["app", "HyperQueue", "task-spooler", "GNU parallel", "`sh -c` floor", "exec floor"]


def measure(system, binary, words, count):
    """One measurement of `system`: (seconds, app's (server, worker) CPU seconds or None)."""
    if system == "app":
        return run_app(binary, words, count)
    if system == "HyperQueue":
        return run_hq(words, count)
    if system == "task-spooler":
        return run_tsp(words, count)
    if system == "GNU parallel":
        return run_parallel(words, count)
    if system == "`sh -c` floor":
        return run_floor(["/bin/sh", "-c", "'" + " ".join(words) + "'"], [], count)
    return run_floor([], words, count)


def in_fresh_process(args, system, workload, check=False):
    """Runs one measurement in a new Python process; its (seconds, cpu)."""
    command = [sys.executable, __file__, "--app", args.app, "--dir", BASE, "--one", system, str(workload)]
    if check:
        command.append("--check")
    output = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    return json.loads(output.strip().splitlines()[-1])


def check_one(system, binary, words, count):
    """The independent harness: each system's own waiting, on many jobs."""
    if system == "app":
        app = App(binary)
        try:
            values = ", ".join(str(i) for i in range(count))
            sweep = os.path.join(app.dir, "check.yaml")
            with open(sweep, "w") as file:
                file.write(f"name: check\ncommand: {json.dumps(' '.join(words))}\ngrid: {{i: [{values}]}}\n")
            env = {k: v for k, v in os.environ.items() if not k.startswith("APP_")}
            started = time.perf_counter()
            subprocess.run([binary, "submit", sweep, "--no-code", "--wait", "--url", app.url], env=env, check=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            return time.perf_counter() - started, None
        finally:
            app.stop()
    if system == "HyperQueue":
        from hyperqueue import Job
        from hyperqueue.cluster import LocalCluster, WorkerConfig

        with Quiet(), tempfile.TemporaryDirectory(prefix="bench-hq-", dir=BASE) as directory:
            with LocalCluster(os.path.join(directory, "hq")) as cluster:
                cluster.start_worker(WorkerConfig(cores=PARALLEL))
                client = cluster.client()
                job = Job()
                for _ in range(count):
                    job.program(words, cwd=directory)
                started = time.perf_counter()
                client.wait_for_jobs([client.submit(job)])
                return time.perf_counter() - started, None
    if system == "task-spooler":
        with tempfile.TemporaryDirectory(prefix="bench-tsp-", dir=BASE) as directory:
            env = dict(os.environ, TS_SOCKET=f"{directory}/socket", TS_MAXFINISHED="10", TS_SAVELIST="",
                       TMPDIR=directory)
            tsp(env, "-S", str(PARALLEL))
            started = time.perf_counter()
            for _ in range(count):
                tsp(env, *words)
            # `tsp -w` with no job waits for the last one queued.
            subprocess.run(["tsp", "-w"], env=env, capture_output=True)
            elapsed = time.perf_counter() - started
            subprocess.run(["tsp", "-K"], env=env, capture_output=True)
            return elapsed, None
    raise ValueError(system)


def main():
    global BASE
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--app", default="target/release/app")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--latency-samples", type=int, default=30)
    parser.add_argument("--dir", help="where every system keeps its files (default: both /var/tmp and /dev/shm)")
    parser.add_argument("--check", action="store_true", help="the independent harness (10x the jobs)")
    parser.add_argument("--one", nargs=2, metavar=("SYSTEM", "WORKLOAD"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.app = str(Path(args.app).resolve())
    if args.one:
        BASE = args.dir
        system, workload = args.one[0], int(args.one[1])
        _, words, count = WORKLOADS[workload]
        if args.check:
            elapsed, cpu = check_one(system, args.app, words, count * 10)
        else:
            elapsed, cpu = measure(system, args.app, words, count)
        print(json.dumps([elapsed, cpu]))
        return
    places = [args.dir] if args.dir else ["/var/tmp", "/dev/shm"]
    for place in places:
        BASE = tempfile.mkdtemp(prefix="bench-peers-", dir=place)
        try:
            if args.check:
                report_check(args, place)
            else:
                report(args, place)
        finally:
            shutil.rmtree(BASE, ignore_errors=True)
    BASE = None
    print("Dispatch latency, submission to the job running (ms)\n")
    print("| system | p50 | p99 |")
    print("|---|---|---|")
    for system in ["app", "hq", "tsp"]:
        latencies = dispatch_latencies(system, args.app, args.latency_samples)
        print(f"| {system} | {percentile(latencies, 0.5):.1f} | {percentile(latencies, 0.99):.1f} |")
    print("\nSubmitting 100,000 jobs (s, median of 3, alternating)\n")
    times = {"app": [], "hq": []}
    for _ in range(3):
        for system in times:
            times[system].append(submit_100k(system, args.app))
    for system, values in times.items():
        print(f"- {system}: {statistics.median(values):.3f} s")


def report(args, place):
    names = SYSTEMS
    rates = {(name, workload): [] for name in names for workload, _, _ in WORKLOADS}
    app_cpu = {workload: [] for workload, _, _ in WORKLOADS}
    for round_number in range(args.rounds):
        order = names[round_number % len(names):] + names[: round_number % len(names)]
        for index, (workload, _, count) in enumerate(WORKLOADS):
            for name in order:
                elapsed, cpu = in_fresh_process(args, name, index)
                rates[(name, workload)].append(count / elapsed)
                if cpu:
                    app_cpu[workload].append((cpu[0] * 1e3 / count, cpu[1] * 1e3 / count))
                print(f"{place} round {round_number + 1} {workload:>10} {name:>14}: {count / elapsed:8.1f} jobs/s",
                      file=sys.stderr, flush=True)
    print(f"\nFiles in {place} ({filesystem(place)}); {PARALLEL} at a time, {args.rounds} alternating rounds, each "
          f"measurement in a fresh process; median (range) jobs/s; ratio to app\n")
    for workload, _, count in WORKLOADS:
        print(f"{count} x `{workload}`\n")
        print("| system | jobs/s | range | vs app |")
        print("|---|---|---|---|")
        app_median = statistics.median(rates[("app", workload)])
        for name in names:
            values = rates[(name, workload)]
            median = statistics.median(values)
            print(f"| {name} | {median:,.0f} | {min(values):,.0f}-{max(values):,.0f} | {median / app_median:.2f}x |")
        server = statistics.median(cpu[0] for cpu in app_cpu[workload])
        worker = statistics.median(cpu[1] for cpu in app_cpu[workload])
        print(f"\napp CPU per job: server {server:.2f} ms, worker {worker:.2f} ms (median of rounds)\n")


def report_check(args, place):
    print(f"\nIndependent harness, files in {place} ({filesystem(place)}): each system once on 10x the jobs, "
          f"its end as its own tools wait for it\n")
    print("| workload | system | jobs/s | vs app |")
    print("|---|---|---|---|")
    for index, (workload, _, count) in enumerate(WORKLOADS):
        rates = {}
        for system in ["app", "HyperQueue", "task-spooler"]:
            elapsed, _ = in_fresh_process(args, system, index, check=True)
            rates[system] = count * 10 / elapsed
            print(f"{place} check {workload:>10} {system:>14}: {rates[system]:8.1f} jobs/s", file=sys.stderr, flush=True)
        for system, rate in rates.items():
            print(f"| {count * 10} x `{workload}` | {system} | {rate:,.0f} | {rate / rates['app']:.2f}x |")


def filesystem(path):
    """The filesystem type of `path` (from /proc/mounts: the longest mount point above it)."""
    best, kind = "", "?"
    with open("/proc/mounts") as mounts:
        for line in mounts:
            fields = line.split()
            if len(fields) > 2 and path.startswith(fields[1]) and len(fields[1]) > len(best):
                best, kind = fields[1], fields[2]
    return kind


if __name__ == "__main__":
    main()
