"""The scanner plugin of ``bench/chaos.py``: it records each execution, works a while, reports.

A plugin like any other (see docs/guides/plugins.md): the worker agent runs it as the
executable ``<plugins dir>/chaos``, a two-line wrapper that ``exec``s this file with the worker's
interpreter in ``-S`` mode (standard library only: it starts in ~20 ms, which matters when a
soak runs thousands of them on two cores).

1. **Record the execution** in the side table ``chaos_executions``, keyed by attempt: one row
   per (``attempt_id``, ``run_id``), ``run_id`` random per process, inserted with
   ``ON CONFLICT DO NOTHING`` so a retried insert (the server crashed around the commit) stays
   one row. Two rows for one attempt mean the attempt ran twice. Written with ``psql`` reading
   the statement from stdin with ``-v`` variables (psql quotes them; no string building).
2. **Work** for a time drawn from the attempt id within ``CHAOS_WORK_SECONDS`` (``"min,max"``);
   a share ``CHAOS_LONG_SHARE`` of attempts works ``CHAOS_LONG_SECONDS`` instead (longer than
   the lease: they must be renewed). ``CHAOS_RECORDS`` records (``raw``, each naming its task,
   attempt and index) are printed evenly over that time, so batches leave while it runs.
3. **Mark it finished** (``finished_at``), then exit 0.

While the database is unreachable (a restart), each write is retried for up to
``CHAOS_DB_PATIENCE_SECONDS``; after that the plugin exits 1 (a retryable failure: the
attempt fails and the task is retried). Environment (set on the worker process, inherited here):
``CHAOS_DATABASE_URL``, ``CHAOS_PSQL``, ``CHAOS_WORKER``, plus the agent's ``LEASEHOLD_*``.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
import uuid

RECORD = """
INSERT INTO chaos_executions (attempt_id, run_id, task_id, attempt_number, worker, pid)
VALUES (:'attempt_id', :'run_id', :'task_id', :'attempt_number', :'worker', :'pid')
ON CONFLICT (attempt_id, run_id) DO NOTHING;
"""
FINISH = """
UPDATE chaos_executions SET finished_at = clock_timestamp()
WHERE attempt_id = :'attempt_id' AND run_id = :'run_id' AND finished_at IS NULL;
"""


def psql(statement: str, variables: dict[str, str]) -> None:
    """Run ``statement`` until it succeeds, or exit 1 once the database stayed away too long."""
    command = [os.environ["CHAOS_PSQL"], "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", os.environ["CHAOS_DATABASE_URL"]]
    for name, value in variables.items():
        command += ["-v", f"{name}={value}"]
    patience = float(os.environ.get("CHAOS_DB_PATIENCE_SECONDS", "60"))
    deadline = time.monotonic() + patience
    delay = 0.1
    while True:
        done = subprocess.run(command, input=statement, capture_output=True, text=True, check=False,
                              env={**os.environ, "PGCONNECT_TIMEOUT": "3"})
        if done.returncode == 0:
            return
        if time.monotonic() > deadline:
            print(f"chaos plugin: the database stayed unreachable for {patience:g}s: {done.stderr.strip()}",
                  file=sys.stderr)
            sys.exit(1)
        time.sleep(delay)
        delay = min(delay * 2, 1.0)


def work_seconds(attempt_id: str) -> float:
    draw = int(hashlib.sha256(attempt_id.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF
    if draw < float(os.environ.get("CHAOS_LONG_SHARE", "0")):
        return float(os.environ.get("CHAOS_LONG_SECONDS", "0"))
    low, high = (float(x) for x in os.environ.get("CHAOS_WORK_SECONDS", "0.2,1.5").split(","))
    return low + (high - low) * draw


def main() -> None:
    json.load(sys.stdin)  # the protocol's input document; the scope only names the task
    task_id, attempt_id = os.environ["LEASEHOLD_TASK_ID"], os.environ["LEASEHOLD_ATTEMPT_ID"]
    ids = {"attempt_id": attempt_id, "run_id": str(uuid.uuid4()), "task_id": task_id,
           "attempt_number": os.environ["LEASEHOLD_ATTEMPT_NUMBER"],
           "worker": os.environ.get("CHAOS_WORKER", "?"), "pid": str(os.getpid())}
    psql(RECORD, ids)
    records = int(os.environ.get("CHAOS_RECORDS", "3"))
    pause = work_seconds(attempt_id) / max(records, 1)
    for index in range(records):
        time.sleep(pause)
        print(json.dumps({"type": "raw", "task": task_id, "attempt": attempt_id, "i": index}), flush=True)
    psql(FINISH, ids)


if __name__ == "__main__":
    main()
