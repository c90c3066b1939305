#!/usr/bin/env python3
"""Short jobs side by side: app against HyperQueue, task-spooler and GNU parallel (issue 11).

Each round runs every system on the same workloads, in an order that rotates from round to
round, and the table gives the median jobs/s over the rounds, the range, and the ratio to app;
app's own server and worker CPU per job; dispatch latency (submission to the job's process
running: the job writes the wall clock to a file); and the time to submit 100,000 jobs.

Like for like: every system runs the job's program directly (`true`, `sleep 0.01`; the latency
job is the same `sh -c` line everywhere) at parallelism 2; GNU parallel gets SHELL=/bin/sh (dash, as the floor). The floors are two
loops of `sh -c true` and of `true`, one process start per job.

    scripts/bench-peers.sh [--rounds 5] [--app target/release/app]
"""

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
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
        self.dir = tempfile.mkdtemp(prefix="bench-app-")
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


def run_hq_loud(words, count):
    from hyperqueue import Job
    from hyperqueue.cluster import LocalCluster, WorkerConfig

    with tempfile.TemporaryDirectory(prefix="bench-hq-") as directory:
        with LocalCluster(directory) as cluster:
            cluster.start_worker(WorkerConfig(cores=PARALLEL))
            client = cluster.client()
            job = Job()
            for _ in range(count):
                # Each task's stdout and stderr files go to its working directory.
                job.program(words, cwd=directory)
            started = time.perf_counter()
            submitted = client.submit(job)
            client.wait_for_jobs([submitted])
            return time.perf_counter() - started, None


def tsp(env, *args):
    return subprocess.run(["tsp", *args], env=env, capture_output=True, text=True, check=True).stdout.strip()


def run_tsp(words, count):
    with tempfile.TemporaryDirectory(prefix="bench-tsp-") as directory:
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
    env = dict(os.environ, SHELL="/bin/sh")
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


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--app", default="target/release/app")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--latency-samples", type=int, default=30)
    args = parser.parse_args()
    binary = str(Path(args.app).resolve())
    systems = {
        "app": lambda words, count: run_app(binary, words, count),
        "HyperQueue": run_hq,
        "task-spooler": run_tsp,
        "GNU parallel": run_parallel,
        "`sh -c` floor": lambda words, count: run_floor(["/bin/sh", "-c", "'" + " ".join(words) + "'"], [], count),
        "exec floor": lambda words, count: run_floor([], words, count),
    }
    names = list(systems)
    rates = {(name, workload): [] for name in names for workload, _, _ in WORKLOADS}
    app_cpu = {workload: [] for workload, _, _ in WORKLOADS}
    for round_number in range(args.rounds):
        order = names[round_number % len(names):] + names[: round_number % len(names)]
        for workload, words, count in WORKLOADS:
            for name in order:
                elapsed, cpu = systems[name](words, count)
                rates[(name, workload)].append(count / elapsed)
                if cpu:
                    app_cpu[workload].append((cpu[0] * 1e3 / count, cpu[1] * 1e3 / count))
                print(f"round {round_number + 1} {workload:>10} {name:>14}: {count / elapsed:8.1f} jobs/s",
                      file=sys.stderr, flush=True)
    print(f"\n{PARALLEL} at a time, {args.rounds} alternating rounds, median (range) jobs/s; ratio to app\n")
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
    print("Dispatch latency, submission to the job running (ms)\n")
    print("| system | p50 | p99 |")
    print("|---|---|---|")
    for system in ["app", "hq", "tsp"]:
        latencies = dispatch_latencies(system, binary, args.latency_samples)
        print(f"| {system} | {percentile(latencies, 0.5):.1f} | {percentile(latencies, 0.99):.1f} |")
    print("\nSubmitting 100,000 jobs (s, median of 3, alternating)\n")
    times = {"app": [], "hq": []}
    for _ in range(3):
        for system in times:
            times[system].append(submit_100k(system, binary))
    for system, values in times.items():
        print(f"- {system}: {statistics.median(values):.3f} s")


if __name__ == "__main__":
    main()
