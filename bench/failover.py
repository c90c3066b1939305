#!/usr/bin/env python3
"""Issue 15's failover measurement: two `app --server-only` replicas on one PostgreSQL database
and one shared data directory, four workers given both URLs, a sweep of JOBS `sleep` jobs;
replica A is killed with SIGKILL a few seconds in. Prints how long the workers took to go on
(the gap in finishing times around the kill), and checks from the database that every job
succeeded exactly once (one `succeeded` transition each, no job lost or run twice).

    python3 bench/failover.py [--app target/release/app] [--jobs 1000] [--sleep 0.05]

Starts Debian's PostgreSQL in a temporary directory (as `nobody` under root), like
scripts/bench-replicas.sh.
"""

import argparse
import glob
import os
import shutil
import signal
import subprocess
import tempfile
import time

from peers import free_port, http


def wait(what, check, timeout=30):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            if check():
                return
        except OSError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"{what} did not happen within {timeout} s")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--app", default="target/release/app")
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--sleep", default="0.05")
    parser.add_argument("--kill-after", type=float, default=3.0)
    args = parser.parse_args()
    app = os.path.abspath(args.app)
    bin_dir = sorted(glob.glob("/usr/lib/postgresql/*/bin"))[-1]
    scratch = tempfile.mkdtemp(prefix="failover-")
    as_nobody = []
    if os.getuid() == 0:
        os.chown(scratch, 65534, 65534)
        as_nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    processes = []
    try:
        subprocess.run(as_nobody + [f"{bin_dir}/initdb", "-D", f"{scratch}/pg", "-U", "app", "--auth=trust",
                                    "-E", "UTF8", "--locale=C"], check=True, stdout=subprocess.DEVNULL)
        pg_port = free_port()
        postgres = subprocess.Popen(as_nobody + [f"{bin_dir}/postgres", "-D", f"{scratch}/pg", "-p", str(pg_port),
                                                 "-k", scratch, "-c", "listen_addresses=127.0.0.1"],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        processes.append(postgres)
        wait("PostgreSQL", lambda: subprocess.run([f"{bin_dir}/pg_isready", "-h", "127.0.0.1", "-p", str(pg_port)],
                                                  stdout=subprocess.DEVNULL).returncode == 0)
        database = f"postgres://app@127.0.0.1:{pg_port}/postgres"
        shared = tempfile.mkdtemp(prefix="failover-data-")
        env = {k: v for k, v in os.environ.items() if not k.startswith("APP_")}
        env["RUST_LOG"] = "warn"
        replicas = []
        for name in ["a", "b"]:
            port = free_port()
            log = open(f"{shared}/../failover-{name}.log", "w")
            server = subprocess.Popen([app, "--server-only", "--bind", f"127.0.0.1:{port}", "--data-dir", shared,
                                       "--database-url", database], env=env, stdout=log, stderr=log)
            processes.append(server)
            url = f"http://127.0.0.1:{port}"
            wait(f"replica {name}", lambda url=url: http(f"{url}/api/health"))
            replicas.append((server, url))
        urls = ",".join(url for _, url in replicas)
        for number in range(4):
            log = open(f"{shared}/../failover-worker-{number}.log", "w")
            processes.append(subprocess.Popen(
                [app, "--client-only", "--url", urls, "--max-jobs", "1", "--name", f"w{number}",
                 "--work-dir", f"{scratch}-work-{number}"], env=env, stdout=log, stderr=log))
        values = ", ".join(str(i) for i in range(args.jobs))
        sweep = f"name: failover\ncommand: 'sleep {args.sleep}'\ngrid: {{i: [{values}]}}\n"
        b = replicas[1][1]
        http(f"{b}/api/sweeps", "POST", sweep.encode(), "application/yaml")
        started = time.time()
        time.sleep(args.kill_after)
        killed_at = time.time()
        replicas[0][0].send_signal(signal.SIGKILL)
        wait("the sweep's end", lambda: http(f"{b}/api/sweeps/failover")["counts"]["succeeded"] == args.jobs,
             timeout=600)
        elapsed = time.time() - started
        # Finishing times around the kill, from the database through the replica that lives.
        jobs = http(f"{b}/api/jobs?sweep=failover&limit={args.jobs}")["jobs"]
        finished = sorted(job["finished_at"] / 1000 for job in jobs)
        before = [at for at in finished if at <= killed_at]
        after = [at for at in finished if at > killed_at]
        # Each worker's first finish after the kill: the slowest one is when all had gone on.
        resumed = {}
        for job in jobs:
            at = job["finished_at"] / 1000
            if at > killed_at:
                resumed[job["worker"]] = min(resumed.get(job["worker"], at), at)
        gap = max(resumed.values()) - killed_at if len(resumed) == 4 else float("nan")
        events = subprocess.run([f"{bin_dir}/psql", "-h", "127.0.0.1", "-p", str(pg_port), "-U", "app", "-d",
                                 "postgres", "-At", "-c",
                                 "SELECT count(*), count(DISTINCT job_id) FROM job_events "
                                 "WHERE to_status = 'succeeded'"], capture_output=True, text=True, check=True)
        succeeded, distinct = map(int, events.stdout.strip().split("|"))
        counts = http(f"{b}/api/sweeps/failover")["counts"]
        print(f"{args.jobs} jobs of `sleep {args.sleep}` on 4 workers over 2 replicas; replica A killed "
              f"(SIGKILL) {args.kill_after:.0f} s in")
        print(f"- all done in {elapsed:.1f} s; {len(before)} finished before the kill, {len(after)} after")
        print(f"- every worker finished a job again within {gap:.2f} s of the kill "
              f"({', '.join(f'{name} {at - killed_at:.2f} s' for name, at in sorted(resumed.items()))})")
        print(f"- succeeded transitions {succeeded}, distinct jobs {distinct}; counts {counts}")
        ok = succeeded == distinct == args.jobs
        print("- every job succeeded exactly once" if ok else "- NOT exactly once")
    finally:
        for process in reversed(processes):
            if process.poll() is None:
                process.send_signal(signal.SIGTERM if process is not processes[0] else signal.SIGINT)
        for process in reversed(processes):
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
        shutil.rmtree(scratch, ignore_errors=True)
        for leftover in glob.glob(f"{scratch}-work-*") + glob.glob(f"{tempfile.gettempdir()}/failover-*"):
            shutil.rmtree(leftover, ignore_errors=True)


if __name__ == "__main__":
    main()
