"""The committed mutation report (``docs/mutation-report.md``) describes the code as it is: it
records a hash of each input of the ``make mutation`` run that wrote it (the domain's sources,
the unit tier, the ``[tool.mutmut]`` configuration), and these tests fail as soon as one of them
changes, so the change is committed together with a fresh report. Skipped inside a mutation
run itself, which is what rewrites the report."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from mutation_report import (
    REPORT,
    ROOT,
    THRESHOLD,
    input_hashes,
    layout_problems,
    recorded_hashes,
    recorded_score,
    stale_inputs,
    unit_tier_files,
)

pytestmark = pytest.mark.skipif("MUTANT_UNDER_TEST" in os.environ,
                                reason="a mutation run is rewriting the report")


def test_the_mutation_report_was_written_for_the_current_domain_and_unit_tier() -> None:
    stale = stale_inputs()
    assert stale == [], (
        f"changed since {REPORT.relative_to(ROOT)} was written: {'; '.join(stale)}. "
        "Run `make mutation` (minutes) and commit docs/mutation-report.md with the change.")


def test_the_mutation_report_meets_its_threshold() -> None:
    score, threshold = recorded_score(REPORT.read_text())
    assert threshold == THRESHOLD and score >= threshold


def test_the_report_records_every_input() -> None:
    assert set(recorded_hashes(REPORT.read_text())) == set(input_hashes())


def _small_project(root: Path) -> None:
    """A project shaped like this one, with one file of each input."""
    (root / "domain").mkdir()
    (root / "domain" / "rules.py").write_text("LIMIT = 1\n")
    (root / "tests" / "unit").mkdir(parents=True)
    (root / "tests" / "unit" / "test_rules.py").write_text("from support.states import STATE\n")
    (root / "tests" / "unit" / "equivalent_mutants.md").write_text("| mutant | why |\n")
    (root / "tests" / "support").mkdir()
    (root / "tests" / "support" / "states.py").write_text("STATE = 1\n")
    (root / "tests" / "support" / "servers.py").write_text("SERVER = 1\n")  # not imported by the unit tier
    (root / "pyproject.toml").write_text('[tool.mutmut]\nsource_paths = ["leasehold/domain/"]\n\n[tool.other]\nx = 1\n')


@pytest.mark.parametrize(("path", "text", "changes"), [
    ("domain/rules.py", "LIMIT = 2\n", 0),
    ("domain/new_rules.py", "X = 1\n", 0),
    ("tests/unit/test_rules.py", "from support.states import STATE  # edited\n", 1),
    ("tests/unit/equivalent_mutants.md", "| mutant | why |\n| `m` | r |\n", 1),
    ("tests/support/states.py", "STATE = 2\n", 1),
    ("pyproject.toml", '[tool.mutmut]\nsource_paths = ["domain/"]\n\n[tool.other]\nx = 1\n', 2),
])
def test_a_change_to_an_input_changes_its_hash_alone(tmp_path: Path, path: str, text: str, changes: int) -> None:
    _small_project(tmp_path)
    before = list(input_hashes(tmp_path).values())
    (tmp_path / path).write_text(text)
    after = list(input_hashes(tmp_path).values())
    assert [i for i, (b, a) in enumerate(zip(before, after, strict=True)) if b != a] == [changes]


def test_what_the_unit_tier_does_not_judge_leaves_the_hashes_alone(tmp_path: Path) -> None:
    _small_project(tmp_path)
    before = input_hashes(tmp_path)
    (tmp_path / "tests" / "support" / "servers.py").write_text("SERVER = 2\n")
    (tmp_path / "pyproject.toml").write_text(
        '[tool.mutmut]\nsource_paths = ["leasehold/domain/"]\n\n[tool.other]\nx = 2\n')
    (tmp_path / "domain" / "__pycache__").mkdir()
    (tmp_path / "domain" / "__pycache__" / "rules.cpython-311.pyc").write_bytes(b"\0")
    assert input_hashes(tmp_path) == before


def test_the_unit_tier_includes_the_support_modules_it_imports() -> None:
    support = {p.name for p in unit_tier_files() if p.parent.name == "support"}
    assert {"task_states.py", "refusals.py"} <= support


def test_a_report_with_a_stale_hash_is_found_out(tmp_path: Path) -> None:
    _small_project(tmp_path)
    (tmp_path / "docs").mkdir()
    rows = "\n".join(f"| {name} | `{digest}` |" for name, digest in input_hashes(tmp_path).items())
    (tmp_path / "docs" / "mutation-report.md").write_text(f"| input | sha256 |\n|---|---|\n{rows}\n")
    assert stale_inputs(tmp_path) == []
    shutil.rmtree(tmp_path / "tests" / "support")
    (tmp_path / "tests" / "unit" / "test_rules.py").write_text("X = 1\n")
    assert stale_inputs(tmp_path) == [list(input_hashes(tmp_path))[1]]


def test_a_run_whose_tests_imported_the_original_domain_is_refused(tmp_path: Path) -> None:
    """``mutants/leasehold/domain`` is what the tests import during a run: a link to the original
    folder, or a copy of it without mutants, would let every mutant survive unseen."""
    results = {"leasehold.domain.rules.x_limit__mutmut_1": "killed"}
    (tmp_path / "domain").mkdir()
    (tmp_path / "domain" / "rules.py").write_text("def limit(): ...\n")
    (tmp_path / "mutants" / "leasehold").mkdir(parents=True)
    (tmp_path / "mutants" / "leasehold" / "domain").symlink_to(tmp_path / "domain")
    assert "a link, or missing" in layout_problems(results, tmp_path)[0]

    (tmp_path / "mutants" / "leasehold" / "domain").unlink()
    shutil.copytree(tmp_path / "domain", tmp_path / "mutants" / "leasehold" / "domain")
    assert layout_problems(results, tmp_path) == [
        "mutants/leasehold/domain/rules.py holds no mutants: the tests would judge the original"]

    (tmp_path / "mutants" / "leasehold" / "domain" / "rules.py").write_text(
        "def x_limit__mutmut_orig(): ...\ndef x_limit__mutmut_1(): ...\n")
    assert layout_problems(results, tmp_path) == []
    assert "not in mutants/leasehold/domain" in layout_problems({"domain.rules.x_limit__mutmut_1": "killed"},
                                                                 tmp_path)[0]
