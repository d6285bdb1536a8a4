"""The drift gate on hostile inputs: each case's exit status, error, seconds and peak memory.

Takes: ``--only NAME`` (repeatable; default every case of
:data:`tests.support.drift_hostile.CASES`). Gives: a Markdown table, one row per case
plus a baseline row (the same gate on the well-formed base files): the bound that stopped it,
the exit status, the seconds the gate took (in a child process, timed after its imports, so
the two or more seconds Python takes to import transformers are not counted), the peak
resident memory of that process (``ru_maxrss`` of the child: the stand-in server and this
script are not counted), and the first words of its one-line error. docs/research-qa.md
holds the table.

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

from tests.support.drift_hostile import CASES, Case, StandIn, export_and_tokenizer, prepare


def child(args: list[str]) -> None:
    """In the child: import what the gate uses, then time ``storyforge drift ARGS``."""
    import transformers  # noqa: F401 (imported before the clock starts)

    from storyforge.cli import main as cli_main
    from storyforge.drift import jinja, ollama, serving, training  # noqa: F401

    start = time.perf_counter()
    code = cli_main(["drift", *args])
    sys.stdout.flush()
    os.write(int(os.environ["DRIFT_BENCH_FD"]), f"{time.perf_counter() - start}\n".encode())
    sys.exit(code)


def run(args: list[str]) -> tuple[int, float, float, str]:
    """(exit status, seconds in the gate, peak MiB, stderr's last line) of ``storyforge drift ARGS``."""
    read, write = os.pipe()
    env = {**os.environ, "PYTHONPATH": str(REPO), "DRIFT_BENCH_FD": str(write)}
    child = subprocess.Popen(
        [sys.executable, __file__, "--child", *args],
        stdout=subprocess.DEVNULL,
        pass_fds=(write,),
        stderr=subprocess.PIPE,
        env=env,
        text=True,
    )
    os.close(write)
    assert child.stderr is not None
    err = child.stderr.read()
    _, status, usage = os.wait4(child.pid, 0)
    with os.fdopen(read) as timing:
        seconds = float(timing.read().strip() or "nan")
    child.returncode = os.waitstatus_to_exitcode(status)
    lines = [line for line in err.splitlines() if line.strip() and "PyTorch was not found" not in line]
    return child.returncode, seconds, usage.ru_maxrss / 1024, lines[-1] if lines else ""


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        child(sys.argv[2:])
        return
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
