"""Rows are read by name: no positional row access in ``persistence/`` and ``gateway/``.

Run by ``make lint`` (``python scripts/check_row_access.py``; paths to check may be given, the
default is the two packages). It reports, as ``path:line: message``, and exits 1 when any:

- an integer subscript anywhere, ``x[0]``, ``x[-1]``: on a row it ties the code to the
  statement's column order (read ``row.name`` instead). A subscript that is not a row's is
  restructured (unpacking a pair, ``next(iter(...))``, a named attribute) or, where that would be
  worse, ends its line with ``# not a row: <why>``;
- a row sliced by integer bounds, ``row[9:]`` (a string or a list of other things may be), or
  spread into positional arguments, ``Partition(*row)``;
- unpacking a row into positional names, ``found_id, name = row``, ``(policy,) = await
  tx.value(...)``, ``for task_id, _ in rows``: a row is a value whose expression fetched it
  (``await x.one(...)``, ``.value``, ``.fetchone``; each of ``.all``, ``.fetchall``,
  ``.fetchmany``; an element of ``await x.read(...)``'s answers), or a name bound to one in the
  same function, or a name called ``row``, ``r`` or ``*_row``. Unpacking the list of answers of
  ``tx.read`` itself is fine (``row, standing = await tx.read(a, b)``).

The rule and the row classes are described in :mod:`persistence.rows`.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_PATHS = ("persistence", "gateway")
ALLOW = "# not a row:"

ROW, ROWS, ANSWERS = "row", "rows", "answers"
_ONE = frozenset({"one", "value", "fetchone"})
_ALL = frozenset({"all", "fetchall", "fetchmany"})
_READ = frozenset({"read"})
_ROW_NAMES = frozenset({"row", "r"})


def _int_literal(node: ast.expr | None) -> bool:
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        node = node.operand
    return isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool)


def _int_slice(node: ast.Subscript) -> bool:
    index = node.slice
    return isinstance(index, ast.Slice) and (_int_literal(index.lower) or _int_literal(index.upper))


class _Function(ast.NodeVisitor):
    """Walks one function body (or a module's top level) in source order, tracking which
    names hold rows, and reporting unpackings of them."""

    def __init__(self, report: list[tuple[int, str]], params: Sequence[str] = ()) -> None:
        self.report = report
        self.kinds: dict[str, str] = {p: ROW for p in params if self._row_name(p)}

    @staticmethod
    def _row_name(name: str) -> bool:
        return name in _ROW_NAMES or name.endswith("_row")

    # --- what an expression holds ------------------------------------------------------------

    def kind(self, node: ast.expr | None) -> str | None:
        if node is None:
            return None
        if isinstance(node, ast.Await):
            return self._fetch(node.value) or self.kind(node.value)
        if isinstance(node, ast.Call):
            direct = self._fetch(node)
            if direct is not None:
                return direct
            # dict(zip(names, await tx.read(...))) and the like: still the answers of a read.
            inner = {self.kind(a) for a in node.args}
            return ANSWERS if ANSWERS in inner else None
        if isinstance(node, ast.Name):
            if node.id in self.kinds:
                return self.kinds[node.id]
            return ROW if self._row_name(node.id) else None
        if isinstance(node, ast.Subscript):
            outer = self.kind(node.value)
            if outer == ANSWERS:
                return ROW  # one answer: a row, or a list of rows
            if outer == ROWS:
                return ROW
            return None
        if isinstance(node, ast.IfExp):
            return self.kind(node.body) or self.kind(node.orelse)
        if isinstance(node, ast.BoolOp):
            return next((k for k in map(self.kind, node.values) if k is not None), None)
        return None

    def _fetch(self, node: ast.expr) -> str | None:
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            attr = node.func.attr
            if attr in _ONE:
                return ROW
            if attr in _ALL:
                return ROWS
            if attr in _READ:
                return ANSWERS
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "sorted" and node.args:
            held = self.kind(node.args[0])
            return ROWS if held in (ROWS, ROW) else None
        return None

    # --- binding names ---------------------------------------------------------------------

    def bind(self, target: ast.expr, held: str | None, line: int) -> None:
        if isinstance(target, ast.Name):
            if held is None:
                self.kinds.pop(target.id, None)
            else:
                self.kinds[target.id] = held
        elif isinstance(target, ast.Starred):
            self.bind(target.value, ROWS if held == ANSWERS else None, line)
        elif isinstance(target, ast.Tuple | ast.List):
            if held in (ROW, ROWS):
                self.report.append((line, "a row unpacked by position: read its columns by name"))
                return
            for element in target.elts:
                self.bind(element, ROW if held == ANSWERS else None, line)

    def visit_Assign(self, node: ast.Assign) -> None:
        self.generic_visit(node)
        held = self.kind(node.value)
        for target in node.targets:
            self.bind(target, held, node.lineno)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        self.generic_visit(node)
        if node.value is not None:
            self.bind(node.target, self.kind(node.value), node.lineno)

    def visit_NamedExpr(self, node: ast.NamedExpr) -> None:
        self.generic_visit(node)
        self.bind(node.target, self.kind(node.value), node.lineno)

    def _loop(self, target: ast.expr, iterable: ast.expr, line: int) -> None:
        held = self.kind(iterable)
        self.bind(target, ROW if held in (ROWS, ROW) else None, line)

    def visit_For(self, node: ast.For) -> None:
        self.visit(node.iter)
        self._loop(node.target, node.iter, node.lineno)
        for statement in [*node.body, *node.orelse]:
            self.visit(statement)

    visit_AsyncFor = visit_For  # type: ignore[assignment]

    def _comprehension(self, node: ast.ListComp | ast.SetComp | ast.GeneratorExp | ast.DictComp) -> None:
        for generator in node.generators:
            self.visit(generator.iter)
            self._loop(generator.target, generator.iter, node.lineno)
            for condition in generator.ifs:
                self.visit(condition)
        for part in ("elt", "key", "value"):
            if hasattr(node, part):
                self.visit(getattr(node, part))

    visit_ListComp = visit_SetComp = visit_GeneratorExp = visit_DictComp = _comprehension  # type: ignore[assignment]

    def visit_Call(self, node: ast.Call) -> None:
        self.generic_visit(node)
        for arg in node.args:
            if isinstance(arg, ast.Starred) and self.kind(arg.value) == ROW:
                self.report.append((node.lineno, "a row spread into positional arguments: pass its columns by name"))

    def visit_Subscript(self, node: ast.Subscript) -> None:
        self.generic_visit(node)
        if _int_slice(node) and self.kind(node.value) in (ROW, ROWS):
            self.report.append((node.lineno, "a row sliced by position: read its columns by name"))

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        _check_function(node, self.report)

    visit_AsyncFunctionDef = visit_FunctionDef  # type: ignore[assignment]

    def visit_Lambda(self, node: ast.Lambda) -> None:
        inner = _Function(self.report, [a.arg for a in node.args.args])
        inner.kinds = {**self.kinds, **inner.kinds}
        inner.visit(node.body)


def _check_function(node: ast.FunctionDef | ast.AsyncFunctionDef, report: list[tuple[int, str]]) -> None:
    args = node.args
    params = [a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)]
    walker = _Function(report, params)
    for statement in node.body:
        walker.visit(statement)


def check_source(source: str, filename: str = "<source>") -> list[tuple[int, str]]:
    """``(line, message)`` for each positional row access in ``source``."""
    tree = ast.parse(source, filename)
    lines = source.splitlines()
    report: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and _int_literal(node.slice):
            report.append((node.lineno, "a positional subscript: read a row's columns by name"))
    _Function(report).visit(tree)
    return sorted({(line, message) for line, message in report if ALLOW not in lines[line - 1]})


def _files(paths: Sequence[str]) -> Iterator[Path]:
    for name in paths:
        path = Path(name) if Path(name).is_absolute() else ROOT / name
        yield from sorted(path.rglob("*.py")) if path.is_dir() else [path]


def main(argv: Sequence[str] | None = None) -> int:
    paths = list(argv if argv is not None else sys.argv[1:]) or list(DEFAULT_PATHS)
    found = 0
    for path in _files(paths):
        for line, message in check_source(path.read_text(), str(path)):
            shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
            print(f"{shown}:{line}: {message}")
            found += 1
    if found:
        print(f"{found} positional row access(es); see scripts/check_row_access.py", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
