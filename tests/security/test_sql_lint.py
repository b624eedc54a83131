"""No SQL is built by string formatting in the application's packages, and the suite says so.

Three checks over ``domain``, ``projections``, ``gateway``, ``worker`` and ``replay`` (the
migrations are static DDL run by the operator, not by the application): ruff's S608 rule (also
part of ``make lint``), no ``noqa`` silencing it, and a wider scan that S608's heuristics would
miss (it only looks at strings that start like a query): any f-string, ``%``-formatting,
``.format()`` or ``+`` whose literal text holds SQL. Identifiers and fragments are composed with
``psycopg.sql`` instead; values travel as parameters.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("domain", "projections", "persistence", "gateway", "replay", "cli", "worker")
SQL = re.compile(r"\b(SELECT|INSERT\s+INTO|UPDATE|DELETE\s+FROM|FROM|WHERE|VALUES|LISTEN|NOTIFY|UNLISTEN|CREATE|"
                 r"DROP|ALTER|GRANT|REVOKE|TRUNCATE|COPY|SET\s+ROLE|ORDER\s+BY|RETURNING)\b")


def sources() -> list[Path]:
    return sorted(p for package in PACKAGES for p in (ROOT / package).rglob("*.py"))


def formatted_sql(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, kind) of every string formatting whose literal text looks like SQL."""
    found = []
    for node in ast.walk(tree):
        text, kind = "", ""
        if isinstance(node, ast.JoinedStr):
            text = "".join(v.value for v in node.values if isinstance(v, ast.Constant) and isinstance(v.value, str))
            kind = "f-string"
        elif (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod | ast.Add)
              and any(isinstance(x, ast.Constant) and isinstance(x.value, str) for x in (node.left, node.right))):
            text = " ".join(x.value for x in (node.left, node.right)
                            if isinstance(x, ast.Constant) and isinstance(x.value, str))
            kind = "%" if isinstance(node.op, ast.Mod) else "+"
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "format"
              and isinstance(node.func.value, ast.Constant) and isinstance(node.func.value.value, str)):
            text, kind = node.func.value.value, "str.format"
        if text and SQL.search(text):
            found.append((node.lineno, kind))
    return found


def test_ruff_s608_finds_nothing() -> None:
    ruff = Path(sys.executable).parent / "ruff"
    result = subprocess.run([str(ruff), "check", "--no-cache", "--select", "S608", "--output-format", "concise",
                             *PACKAGES], cwd=ROOT, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_s608_is_never_silenced() -> None:
    silenced = [f"{p.relative_to(ROOT)}:{n}" for p in sources()
                for n, line in enumerate(p.read_text().splitlines(), 1) if re.search(r"noqa:[^#]*S608", line)]
    assert silenced == []


def test_no_sql_is_built_by_string_formatting() -> None:
    found = [f"{p.relative_to(ROOT)}:{line} ({kind})" for p in sources()
             for line, kind in formatted_sql(ast.parse(p.read_text(), str(p)))]
    assert found == []


def test_the_scan_sees_what_it_must() -> None:
    """The scan itself: it flags each way of formatting SQL, and leaves composition alone."""
    flagged = formatted_sql(ast.parse('''
a = f"SELECT {cols} FROM t"
b = "DELETE FROM %s" % table
c = "UPDATE {} SET x = 1".format(table)
d = "SELECT * FROM " + table
e = f"LISTEN {channel}"
ok1 = sql.SQL("SELECT {} FROM t").format(sql.Identifier(name))
ok2 = f"worker {name} refused"
'''))
    assert [kind for _, kind in flagged] == ["f-string", "%", "str.format", "+", "f-string"]
