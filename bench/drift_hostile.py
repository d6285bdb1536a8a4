"""The drift gate on hostile inputs: each case's exit status, error, seconds and peak memory.

Takes: ``--only NAME`` (repeatable; default every case of
:data:`storyforge.testing.drift_hostile.CASES`). Gives: a Markdown table, one row per case
plus a baseline row (the same gate on the well-formed base files): the bound that stopped it,
the exit status, the wall seconds and the peak resident memory of the ``storyforge drift``
process (``ru_maxrss`` of the child, so the stand-in server and this script are not counted),
and the first words of its one-line error. docs/drift.md holds the table.

    python bench/drift_hostile.py
    python bench/drift_hostile.py --only go-doubling --only server-endless-body
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from storyforge.testing.drift_hostile import CASES, Case, StandIn, export_and_tokenizer, prepare


def run(args: list[str]) -> tuple[int, float, float, str]:
    """(exit status, seconds, peak MiB, stderr's last line) of ``storyforge drift ARGS``."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    start = time.perf_counter()
    child = subprocess.Popen(
        [sys.executable, "-m", "storyforge.cli", "drift", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=env,
        text=True,
    )
    assert child.stderr is not None
    err = child.stderr.read()
    _, status, usage = os.wait4(child.pid, 0)
    seconds = time.perf_counter() - start
    child.returncode = os.waitstatus_to_exitcode(status)
    lines = [line for line in err.splitlines() if line.strip() and "PyTorch was not found" not in line]
    return child.returncode, seconds, usage.ru_maxrss / 1024, lines[-1] if lines else ""


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--only", action="append", default=[], metavar="NAME")
    options = parser.parse_args()
    cases: list[Case] = [c for c in CASES if not options.only or c.name in options.only]
    print("| case | input | bound hit | exit | seconds | peak MiB | error (start) |")
    print("|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp, StandIn() as standin:
        root = Path(tmp)
        export, tokenizer = export_and_tokenizer(root / "baseline")
        code, seconds, peak, _ = run(
            [str(export), "--tokenizer", str(tokenizer), "--gguf", str(root / "baseline" / "base.gguf")]
        )
        print(f"| baseline | the well-formed base GGUF | - | {code} | {seconds:.1f} | {peak:.0f} | - |")
        for case in cases:
            args = prepare(case, root / case.name, standin.url)
            code, seconds, peak, line = run(args)
            shown = line.removeprefix("error: ")[:90].replace("|", "\\|")
            print(
                f"| {case.name} | {case.what} | {case.bound} | {code} | {seconds:.1f} | {peak:.0f} | {shown} |"
            )


if __name__ == "__main__":
    main()
