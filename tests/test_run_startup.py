"""``python run.py``'s start-up: the cyclic collector off until the job, one OpenBLAS thread.

Checked in a fresh interpreter that executes ``run.py`` as a script up to Hydra (``--help``
stops there) and then starts the job's collection the way ``main`` does.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

SCRIPT = """
import contextlib, gc, io, json, os, sys
sys.argv = ["run.py", "--help"]
script = {"__name__": "__main__", "__file__": os.path.abspath("run.py")}
with contextlib.suppress(SystemExit), contextlib.redirect_stdout(io.StringIO()):
    exec(compile(open("run.py", encoding="utf-8").read(), "run.py", "exec"), script)
state = {"during_start_up": gc.isenabled(), "blas": os.environ.get("OPENBLAS_NUM_THREADS")}
script["_collect_from_here"]()
state["in_the_job"] = gc.isenabled()
state["frozen"] = gc.get_freeze_count()
gc.collect()
script["_collect_from_here"]()  # the next job of a sweep: nothing more is frozen
state["frozen_after_a_second_job"] = gc.get_freeze_count()
import run  # imported, not run: the importer's collector is left as it is
state["imported"] = gc.isenabled()
print(json.dumps(state))
"""


def test_start_up_runs_without_the_collector_and_the_job_with_it() -> None:
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    env["PYTHONPATH"] = str(ROOT)
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    state = json.loads(proc.stdout)
    assert state["during_start_up"] is False
    assert state["in_the_job"] is True
    assert state["frozen"] > 10_000  # the libraries and the schemas, out of the collector's walks
    assert state["frozen_after_a_second_job"] == state["frozen"]
    assert state["imported"] is True
    assert state["blas"] == "1"
