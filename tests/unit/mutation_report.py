"""Summarise a ``mutmut run`` over ``domain/`` (``make mutation``): the score, every surviving
mutant with its diff, and the mutants ``tests/unit/equivalent_mutants.md`` lists as equivalent.

The score counts a mutant as caught when the unit tier fails (killed) or hangs (timeout) on it,
out of all mutants except the equivalent ones, which no test can tell apart from the original.
A mutant in code no unit test reaches ("no tests") counts as surviving. The report goes to
stdout and to ``docs/mutation-report.md``; the exit status is 1 when the score is below the
threshold (``--min``, percent), or when the list of equivalents names a mutant that was killed
or no longer exists (so the list cannot go stale quietly).

Run from the project root after ``mutmut run``: ``python tests/unit/mutation_report.py``.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EQUIVALENTS = ROOT / "tests" / "unit" / "equivalent_mutants.md"
REPORT = ROOT / "docs" / "mutation-report.md"
MUTMUT = Path(sys.executable).with_name("mutmut")
CAUGHT = {"killed", "timeout"}
_RESULT = re.compile(r"^\s*(\S+): (.+)$")
_EQUIVALENT = re.compile(r"^\|\s*`([^`]+)`\s*\|\s*(.+?)\s*\|\s*$")


def mutmut(*args: str) -> str:
    return subprocess.run([str(MUTMUT), *args], cwd=ROOT, check=True, capture_output=True, text=True).stdout


def statuses() -> dict[str, str]:
    """Every mutant of the last run and its status (killed, survived, no tests, timeout…)."""
    found = {}
    for line in mutmut("results", "--all", "true").splitlines():
        if match := _RESULT.match(line):
            found[match[1]] = match[2]
    return found


def equivalents() -> dict[str, str]:
    """The mutants listed as equivalent, with the reason given for each."""
    return {m[1]: m[2] for line in EQUIVALENTS.read_text().splitlines() if (m := _EQUIVALENT.match(line))}


def diff(mutant: str) -> str:
    """The mutant's change as a diff (``mutmut show`` less its heading line)."""
    lines = mutmut("show", mutant).splitlines()
    return "\n".join(line for line in lines if not line.startswith("# ")).strip()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--min", type=float, default=90.0, help="lowest acceptable score in percent")
    args = parser.parse_args()

    results = statuses()
    if not results:
        print("no mutmut results: run `make mutation` first", file=sys.stderr)
        return 1
    listed = equivalents()
    counts = Counter(results.values())
    caught = sum(counts[s] for s in CAUGHT)
    equivalent = sorted(m for m in listed if m in results and results[m] not in CAUGHT)
    stale = sorted(m for m in listed if m not in results or results[m] in CAUGHT)
    surviving = sorted(m for m, s in results.items() if s not in CAUGHT and m not in listed)
    judged = len(results) - len(equivalent)
    score = 100.0 * caught / judged if judged else 100.0

    out = ["# Mutation testing of domain/ against the unit tier", "",
           "Written by `make mutation` (mutmut over `domain/`, each mutant judged by `tests/unit` alone).",
           "A mutant is caught when a unit test fails (killed) or hangs (timeout) on it. Equivalent",
           "mutants, which cannot change behaviour, are listed with their reasons in",
           "`tests/unit/equivalent_mutants.md` and left out of the score. Every mutant below",
           "*Surviving mutants* is a change to the domain that no unit test notices: kill it with a test,",
           "or, if it truly cannot change behaviour, add it to the list of equivalents.", "",
           "mutmut does not mutate decorated functions (the `@evolve.register` and `@evolve_worker.register`",
           "folds, properties) nor module-level constants; the folds are checked column by column against",
           "the projector in `tests/unit/test_projector.py` instead.", "",
           "| mutants | caught | killed | timeout | equivalent | surviving | score |",
           "|---:|---:|---:|---:|---:|---:|---:|",
           f"| {len(results)} | {caught} | {counts['killed']} | {counts['timeout']} | {len(equivalent)} "
           f"| {len(surviving)} | {score:.1f}% |", "",
           f"Score: caught / (mutants - equivalent) = {caught} / {judged} = {score:.1f}% "
           f"(threshold {args.min:g}%).", "", "## Surviving mutants", ""]
    if not surviving:
        out.append("None.")
    for mutant in surviving:
        out += [f"### `{mutant}` ({results[mutant]})", "", "```diff", diff(mutant), "```", ""]
    if stale:
        out += ["", "## Stale entries in the list of equivalents", "",
                "Killed, or no longer generated: remove them from `tests/unit/equivalent_mutants.md`.", ""]
        out += [f"- `{m}` ({results.get(m, 'not generated')})" for m in stale]
    text = "\n".join(out).rstrip() + "\n"
    REPORT.write_text(text)
    print(text)
    print(f"written to {REPORT.relative_to(ROOT)}")
    if stale:
        print(f"{len(stale)} stale entries in {EQUIVALENTS.relative_to(ROOT)}", file=sys.stderr)
    if score < args.min:
        print(f"mutation score {score:.1f}% is below {args.min:g}%", file=sys.stderr)
    return 1 if stale or score < args.min else 0


if __name__ == "__main__":
    sys.exit(main())
