"""Summarise a ``mutmut run`` over the domain (``make mutation``): the score, every surviving
mutant with its diff, the mutants ``tests/unit/equivalent_mutants.md`` lists as equivalent, and
the hashes of what the run judged.

The score counts a mutant as caught when the unit tier fails (killed) or hangs (timeout) on it,
out of all mutants except the equivalent ones, which no test can tell apart from the original.
A mutant in code no unit test reaches ("no tests") counts as surviving. The report goes to
stdout and to ``docs/mutation-report.md``; the exit status is 1 when the score is below the
threshold (``--min``, percent), when the list of equivalents names a mutant that was killed or
no longer exists (so the list cannot go stale quietly), or when ``mutants/`` does not hold a
mutated copy of the package the tests import (so a run that mutated nothing cannot pass).

The report records a sha256 of each input of the run (:func:`input_hashes`: the domain's
sources, the unit tier with the support modules it imports, and the ``[tool.mutmut]``
configuration); ``tests/unit/test_mutation_report.py`` fails when they no longer match the
working tree, so a change to any of them needs a fresh ``make mutation`` and its report
committed with it. ``--check`` makes the same comparison without a run.

Run from the project root after ``mutmut run``: ``python tests/unit/mutation_report.py``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import subprocess
import sys
import tomllib
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EQUIVALENTS = ROOT / "tests" / "unit" / "equivalent_mutants.md"
REPORT = ROOT / "docs" / "mutation-report.md"
MUTMUT = Path(sys.executable).with_name("mutmut")
#: Where the tests import the domain from during a run: mutmut's copy of the package, in which
#: these files must be the mutated ones (a copy of the originals would survive every mutant).
MUTATED_PACKAGE = Path("mutants") / "leasehold" / "domain"
#: The input hashes as they were when the run started (``make mutation`` writes them first).
RUN_INPUTS = Path("mutants") / "inputs.json"
THRESHOLD = 95.0
CAUGHT = {"killed", "timeout"}
_RESULT = re.compile(r"^\s*(\S+): (.+)$")
_EQUIVALENT = re.compile(r"^\|\s*`([^`]+)`\s*\|\s*(.+?)\s*\|\s*$")
_SUPPORT_IMPORT = re.compile(r"^from support\.(\w+) import", re.MULTILINE)
_INPUT_ROW = re.compile(r"^\| (.+?) \| `([0-9a-f]{64})` \|$", re.MULTILINE)
_SCORE = re.compile(r"^Score: caught / \(mutants - equivalent\) = \d+ / \d+ = ([0-9.]+)% \(threshold ([0-9.]+)%\)",
                    re.MULTILINE)


# --- what the run judged ---------------------------------------------------------------------


def _files_hash(root: Path, files: Iterable[Path]) -> str:
    """sha256 over each file's path (relative to ``root``) and bytes, in path order."""
    digest = hashlib.sha256()
    for path in sorted(files):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def _sources(folder: Path, *patterns: str) -> list[Path]:
    return [p for pattern in patterns for p in folder.rglob(pattern)
            if p.is_file() and "__pycache__" not in p.parts and ".hypothesis" not in p.parts]


def unit_tier_files(root: Path = ROOT) -> list[Path]:
    """The unit tier: every file of ``tests/unit`` (tests, conftest, this script, the list of
    equivalents) and the modules of ``tests/support`` that it imports."""
    unit = _sources(root / "tests" / "unit", "*.py", "*.md")
    support = {m for path in unit if path.suffix == ".py" for m in _SUPPORT_IMPORT.findall(path.read_text())}
    return unit + [root / "tests" / "support" / f"{name}.py" for name in sorted(support)]


def input_hashes(root: Path = ROOT) -> dict[str, str]:
    """A sha256 per input of a mutation run, by the name the report gives it."""
    config = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["mutmut"]
    return {
        "`domain/` (its `.py` files: the mutated code)": _files_hash(root, _sources(root / "domain", "*.py")),
        "`tests/unit/` and the `tests/support` modules it imports": _files_hash(root, unit_tier_files(root)),
        "`[tool.mutmut]` of `pyproject.toml`": hashlib.sha256(
            json.dumps(config, sort_keys=True).encode()).hexdigest(),
    }


def recorded_hashes(report: str) -> dict[str, str]:
    """The input hashes a report records (see :func:`input_hashes`)."""
    return dict(_INPUT_ROW.findall(report))


def recorded_score(report: str) -> tuple[float, float]:
    """The score and the threshold a report records, in percent."""
    found = _SCORE.search(report)
    if found is None:
        raise ValueError("the report has no score line")
    return float(found[1]), float(found[2])


def stale_inputs(root: Path = ROOT) -> list[str]:
    """The inputs whose hash differs from the one the committed report records (empty: the report
    describes the working tree)."""
    recorded = recorded_hashes((root / "docs" / "mutation-report.md").read_text())
    return [name for name, digest in input_hashes(root).items() if recorded.get(name) != digest]


# --- the run's results ---------------------------------------------------------------------


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


def module_of(mutant: str) -> str:
    """The module a mutant name belongs to (``leasehold.domain.task.x__create__mutmut_3`` ->
    ``leasehold.domain.task``)."""
    parts = mutant.split(".")
    return ".".join(parts[:next(i for i, p in enumerate(parts) if p.startswith(("x_", "xǁ")))])


def layout_problems(results: dict[str, str], root: Path = ROOT) -> list[str]:
    """Why the last run's ``mutants/`` would not have judged the mutated domain (empty: fine):
    the tests import ``leasehold.domain`` from ``mutants/``, so each module mutmut reports
    mutants of must be there, as a file holding them, not as a link to (or copy of) the original."""
    package = root / MUTATED_PACKAGE
    if package.is_symlink() or not package.is_dir():
        return [f"{MUTATED_PACKAGE} is not a folder of mutated files (a link, or missing): the tests would"
                " import the original domain; check [tool.mutmut] source_paths"]
    problems = []
    for module in sorted({module_of(m) for m in results}):
        path = root / "mutants" / Path(*module.split(".")).with_suffix(".py")
        if not path.resolve().is_relative_to(package.resolve()):
            problems.append(f"mutants of {module} are not in {MUTATED_PACKAGE}, which the tests import")
        elif "__mutmut_orig" not in path.read_text():
            problems.append(f"{path.relative_to(root)} holds no mutants: the tests would judge the original")
    return problems


def render(results: dict[str, str], listed: dict[str, str], threshold: float,
           hashes: dict[str, str]) -> tuple[str, float, list[str]]:
    """The report's text, the score, and the stale entries of the list of equivalents."""
    counts = Counter(results.values())
    caught = sum(counts[s] for s in CAUGHT)
    equivalent = sorted(m for m in listed if m in results and results[m] not in CAUGHT)
    stale = sorted(m for m in listed if m not in results or results[m] in CAUGHT)
    surviving = sorted(m for m, s in results.items() if s not in CAUGHT and m not in listed)
    judged = len(results) - len(equivalent)
    score = 100.0 * caught / judged if judged else 100.0

    out = ["# Mutation testing of domain/ against the unit tier", "",
           "Written by `make mutation` (mutmut over `domain/`, imported as `leasehold.domain`, each mutant",
           "judged by `tests/unit` alone). **Whoever changes `domain/`, `tests/unit/` (or the `tests/support`",
           "modules it imports) or `[tool.mutmut]` reruns `make mutation` and commits this report with the",
           "change**: it records a hash of each of those inputs below, and `tests/unit/test_mutation_report.py`",
           "fails when they no longer match the code (`python tests/unit/mutation_report.py --check` says",
           "which).", "",
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
           f"(threshold {threshold:g}%).", "", "## Inputs of this run", "",
           "| input | sha256 |", "|---|---|"]
    out += [f"| {name} | `{digest}` |" for name, digest in hashes.items()]
    out += ["", "## Surviving mutants", ""]
    if not surviving:
        out.append("None.")
    for mutant in surviving:
        out += [f"### `{mutant}` ({results[mutant]})", "", "```diff", diff(mutant), "```", ""]
    if stale:
        out += ["", "## Stale entries in the list of equivalents", "",
                "Killed, or no longer generated: remove them from `tests/unit/equivalent_mutants.md`.", ""]
        out += [f"- `{m}` ({results.get(m, 'not generated')})" for m in stale]
    return "\n".join(out).rstrip() + "\n", score, stale


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--min", type=float, default=THRESHOLD, help="lowest acceptable score in percent")
    parser.add_argument("--check", action="store_true",
                        help="only say whether the committed report's input hashes match the working tree")
    parser.add_argument("--inputs", action="store_true",
                        help="only print the input hashes as JSON (make mutation keeps them before the run)")
    args = parser.parse_args()

    if args.inputs:
        print(json.dumps(input_hashes(), indent=2))
        return 0
    if args.check:
        stale = stale_inputs()
        for name in stale:
            print(f"changed since {REPORT.relative_to(ROOT)} was written: {name}", file=sys.stderr)
        return 1 if stale else 0

    results = statuses()
    problems = layout_problems(results) if results else ["no mutmut results: run `make mutation` first"]
    hashes = input_hashes()
    run_inputs = ROOT / RUN_INPUTS
    if not run_inputs.exists():
        problems.append(f"{RUN_INPUTS} is missing: run `make mutation`, which records the inputs first")
    elif json.loads(run_inputs.read_text()) != hashes:
        problems.append("domain/, the unit tier or [tool.mutmut] changed while mutmut ran: run `make mutation` again")
    if problems:
        print("\n".join(problems), file=sys.stderr)
        return 1
    text, score, stale = render(results, equivalents(), args.min, hashes)
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
