"""The reference pages of the documentation site, generated from the code at build time.

Each function returns one Markdown page, built from what the running program itself uses, so
the reference cannot drift from it:

* :func:`cli_page` — ``leasehold … --help`` of every command, from the parser the command builds;
* :func:`http_api_page` — the OpenAPI document the Gateway serves, from its route tables;
* :func:`settings_page` — the Gateway's and the worker agent's pydantic settings models, with
  their environment variables, flags and defaults;
* :func:`metrics_page` — the Prometheus families of the Gateway and of the worker agent;
* :func:`events_page` — every event class of :mod:`leasehold.domain.events`.

``scripts/docs_hooks.py`` adds them to the MkDocs build (:data:`PAGES`); ``python
scripts/docs_reference.py DIR`` writes them to ``DIR`` to read them without a build.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import inspect
import json
import os
import re
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
#: The terminal width help is rendered for, as in the committed ``docs/cli`` snapshots.
HELP_COLUMNS = "80"
GENERATED_NOTE = ("!!! info \"Generated from the code\"\n    This page is written by `scripts/docs_reference.py` "
                  "when the site is built{source}; edit the code, not the page.\n")


def _note(source: str) -> str:
    return GENERATED_NOTE.format(source=f", from {source}" if source else "")


def _cell(text: object) -> str:
    """Text for one Markdown table cell: one line, pipes escaped."""
    return " ".join(str(text).split()).replace("|", "\\|")


def _code(text: object) -> str:
    """Inline code for a table cell (backticks inside are doubled around; a pipe inside a code
    span does not split the cell, and an escaped one would show its backslash)."""
    value = " ".join(str(text).split())
    return f"`` {value} ``" if "`" in value else f"`{value}`"


# --- CLI ----------------------------------------------------------------------------------------


@contextlib.contextmanager
def _help_width() -> Iterator[None]:
    saved = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = HELP_COLUMNS
    try:
        yield
    finally:
        if saved is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = saved


def _commands(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    """The parser and every subcommand's parser, depth first, in help order (aliases once)."""
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            seen: set[int] = set()
            for sub in action.choices.values():
                if id(sub) not in seen:
                    seen.add(id(sub))
                    yield from _commands(sub)


def command_helps() -> dict[str, str]:
    """``{"leasehold replay verify": its --help text}`` for every command and command group."""
    from leasehold.cli.main import build_parser

    with _help_width():
        return {p.prog: p.format_help() for p in _commands(build_parser())}


def cli_anchor(prog: str) -> str:
    """The heading id of a command on the CLI page: ``leasehold replay as-of`` -> ``leasehold-replay-as-of``."""
    return prog.replace(" ", "-")


def cli_page() -> str:
    helps = command_helps()
    out = ["# Command line: `leasehold`", "", _note("the parser `leasehold.cli.main.build_parser` builds"),
           "Every command, as `leasehold … --help` prints it. The guides say when to use which; "
           "[Getting started](../getting-started.md) runs the most common ones in order.", "",
           "| command | what it does |", "|---|---|"]
    for prog, text in helps.items():
        first = _description(text)
        out.append(f"| [`{prog}`](#{cli_anchor(prog)}) | {_cell(first)} |")
    out.append("")
    for prog, text in helps.items():
        depth = min(prog.count(" ") + 2, 4)
        out += [f"{'#' * depth} `{prog}` {{ #{cli_anchor(prog)} }}", "", "```text", text.rstrip("\n"), "```", ""]
    return "\n".join(out)


def _description(help_text: str) -> str:
    """The first paragraph after the usage lines of an argparse help text."""
    paragraphs = [p for p in help_text.split("\n\n") if p.strip()]
    for paragraph in paragraphs[1:]:
        if not paragraph.startswith(("positional arguments", "options", "usage")):
            return paragraph.split(". ")[0].rstrip(".") + "."
    return ""


# --- HTTP API -----------------------------------------------------------------------------------


def openapi_document() -> dict[str, Any]:
    """The OpenAPI document the Gateway serves (``/openapi.json``), built from the route tables of
    an application that is created but never started (no database, no sockets)."""
    from leasehold.gateway.api.openapi import build_openapi
    from leasehold.gateway.app import create_app
    from leasehold.gateway.keys import ROUTES
    from leasehold.gateway.settings import GatewaySettings

    document: dict[str, Any] = build_openapi(create_app(GatewaySettings())[ROUTES])
    return document


def _ref_name(ref: str) -> str:
    return ref.rsplit("/", 1)[-1]


def schema_anchor(name: str) -> str:
    return "schema-" + name.lower()


def _type(schema: dict[str, Any]) -> str:
    """A short type for a JSON schema: ``string (uuid)``, ``array of [Task](#schema-task)``, …"""
    if "$ref" in schema:
        name = _ref_name(schema["$ref"])
        return f"[{name}](#{schema_anchor(name)})"
    if "anyOf" in schema or "oneOf" in schema:
        options = [s for s in schema.get("anyOf", schema.get("oneOf", [])) if s.get("type") != "null"]
        nullable = len(options) < len(schema.get("anyOf", schema.get("oneOf", [])))
        text = " or ".join(_type(s) for s in options) or "null"
        return f"{text} or null" if nullable else text
    if "enum" in schema:
        return "one of " + ", ".join(f"`{v}`" for v in schema["enum"])
    if "const" in schema:
        return f"`{schema['const']}`"
    kind = schema.get("type", "any")
    if isinstance(kind, list):
        kind = " or ".join(kind)
    if kind == "array":
        return f"array of {_type(schema.get('items', {}))}"
    if kind == "object" and "additionalProperties" in schema and isinstance(schema["additionalProperties"], dict):
        return f"object of {_type(schema['additionalProperties'])}"
    fmt = schema.get("format")
    return f"{kind} ({fmt})" if fmt else str(kind)


_LIMITS = (("minimum", "≥ {}"), ("exclusiveMinimum", "> {}"), ("maximum", "≤ {}"), ("exclusiveMaximum", "< {}"),
           ("minLength", "length ≥ {}"), ("maxLength", "length ≤ {}"), ("minItems", "≥ {} items"),
           ("maxItems", "≤ {} items"), ("pattern", "matches `{}`"))


def _limits(schema: dict[str, Any]) -> str:
    found = []
    for option in [schema, *schema.get("anyOf", [])]:
        found += [form.format(option[key]) for key, form in _LIMITS if key in option]
    if "default" in schema:
        found.append(f"default `{json.dumps(schema['default'])}`")
    return ", ".join(found)


def _fields_table(schema: dict[str, Any]) -> list[str]:
    properties: dict[str, Any] = schema.get("properties", {})
    if not properties:
        return [f"Type: {_type(schema)}.", ""]
    required = set(schema.get("required", []))
    rows = ["| field | type | required | notes |", "|---|---|---|---|"]
    for name, prop in properties.items():
        notes = "; ".join(x for x in (_cell(prop.get("description", "")), _limits(prop)) if x)
        rows.append(f"| `{name}` | {_type(prop)} | {'yes' if name in required else ''} | {notes} |")
    extra = " Unknown fields are refused (422)." if schema.get("additionalProperties") is False else ""
    return [*rows, "", extra.strip(), ""] if extra else [*rows, ""]


def _media_schema(content: dict[str, Any]) -> tuple[str, dict[str, Any]] | None:
    for media, body in content.items():
        if "schema" in body:
            return media, body["schema"]
    return None


def operation_anchor(method: str, path: str) -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", f"{method} {path}".lower()).strip("-")
    return "op-" + slug


def http_api_page(document: dict[str, Any] | None = None) -> str:
    doc = document if document is not None else openapi_document()
    info = doc.get("info", {})
    out = ["# HTTP API", "", _note("the OpenAPI document the Gateway serves"),
           f"{info.get('title', '')}, OpenAPI {doc.get('openapi', '')}. {info.get('description', '')}", "",
           "The same document, as the Gateway serves it at `/openapi.json` on both ports: "
           "[openapi.json](../openapi.json). The [worker protocol](../concepts/worker-protocol.md) and the "
           "operating guides explain how the endpoints are used together.", ""]
    by_tag: dict[str, list[tuple[str, str, dict[str, Any]]]] = {}
    for path, operations in doc.get("paths", {}).items():
        for method, op in operations.items():
            tag = (op.get("tags") or ["other"])[0]
            by_tag.setdefault(tag, []).append((method.upper(), path, op))
    titles = {"worker": "Worker API (worker port, mTLS)", "operator": "Operator API (operator port, API keys)",
              "service": "Service endpoints (health, metrics, this document)"}
    out += ["| endpoint | what it does |", "|---|---|"]
    for tag in by_tag:
        for method, path, op in by_tag[tag]:
            out.append(f"| [`{method} {_cell(path)}`](#{operation_anchor(method, path)}) | {_cell(op.get('summary', ''))} |")
    out.append("")
    for tag, ops in by_tag.items():
        out += [f"## {titles.get(tag, tag)}", ""]
        for method, path, op in ops:
            out += _operation(method, path, op)
    out += ["## Schemas", ""]
    for name, schema in doc.get("components", {}).get("schemas", {}).items():
        out += [f"### {name} {{ #{schema_anchor(name)} }}", ""]
        if schema.get("description"):
            out += [_cell(schema["description"]), ""]
        out += _fields_table(schema)
    return "\n".join(out)


def _operation(method: str, path: str, op: dict[str, Any]) -> list[str]:
    out = [f"### `{method} {path}` {{ #{operation_anchor(method, path)} }}", "", _cell(op.get("summary", "")), ""]
    if op.get("description"):
        out += [op["description"], ""]
    security = [name for requirement in op.get("security", []) for name in requirement]
    if security:
        out += [f"Authentication: {', '.join(security)}.", ""]
    params = op.get("parameters", [])
    if params:
        out += ["| parameter | in | type | required | notes |", "|---|---|---|---|---|"]
        for p in params:
            schema = p.get("schema", {})
            notes = "; ".join(x for x in (_cell(p.get("description", "")), _limits(schema)) if x)
            out.append(f"| `{p['name']}` | {p['in']} | {_type(schema)} | {'yes' if p.get('required') else ''} "
                       f"| {notes} |")
        out.append("")
    body = op.get("requestBody")
    if body:
        found = _media_schema(body.get("content", {}))
        if found:
            out += [f"Request body ({found[0]}{', required' if body.get('required') else ', optional'}): "
                    f"{_type(found[1])}.", ""]
    out += ["| status | meaning | body |", "|---|---|---|"]
    for status, answer in op.get("responses", {}).items():
        found = _media_schema(answer.get("content", {}))
        out.append(f"| {status} | {_cell(answer.get('description', ''))} | "
                   f"{f'{_type(found[1])} ({found[0]})' if found else ''} |")
    out.append("")
    return out


# --- settings -----------------------------------------------------------------------------------


def _flags_by_dest(parser: argparse.ArgumentParser) -> dict[str, list[str]]:
    return {a.dest: list(a.option_strings) for a in parser._actions if a.option_strings}


def _subparser(*names: str) -> argparse.ArgumentParser:
    from leasehold.cli.main import build_parser

    parser = build_parser(commands=(names[0],))
    for name in names:
        action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = action.choices[name]
    return parser


def _default(field: Any) -> str:
    from pydantic_core import PydanticUndefined

    if field.default_factory is not None:
        return _code(json.dumps(field.default_factory()))
    if field.default is PydanticUndefined:
        return "required"
    if field.default is None:
        return "not set"
    value = field.default
    return _code(str(value).lower() if isinstance(value, bool) else value)


def _annotation(field: Any) -> str:
    text = str(field.annotation) if not isinstance(field.annotation, type) else field.annotation.__name__
    return _code(text.replace("typing.", "").replace("pathlib.", "").replace("NoneType", "None"))


def _env_names(name: str, field: Any, prefix: str) -> list[str]:
    alias = field.validation_alias
    choices = getattr(alias, "choices", None)
    if choices:
        return [str(c) for c in choices if str(c).isupper()]
    return [f"{prefix}{name.upper()}"]


def settings_page() -> str:
    from leasehold.gateway.settings import GatewaySettings
    from leasehold.worker.settings import ENV_PREFIX, WorkerSettings

    gateway_flags = _flags_by_dest(_subparser("gateway", "serve"))
    worker_flags = _flags_by_dest(_subparser("worker", "run"))
    gateway_prefix = GatewaySettings.model_config.get("env_prefix", "")
    out = ["# Settings", "", _note("the pydantic models `GatewaySettings` and `WorkerSettings`"),
           "Each setting comes from a flag, else its environment variable, else its default; the worker "
           "agent also reads a TOML file (`--config`), below the environment. A boolean flag comes as a pair "
           "(`--listen` / `--no-listen`); in the environment it is `true` or `false`.", "",
           "## Gateway (`leasehold gateway serve`)", "", _cell(inspect.getdoc(GatewaySettings) or ""), "",
           "| setting: environment, flag | type, default | meaning |", "|---|---|---|"]
    for name, field in GatewaySettings.model_fields.items():
        env = ", ".join(f"`{e}`" for e in _env_names(name, field, gateway_prefix))
        flags = " ".join(f"`{f}`" for f in gateway_flags.get(name, [])) or "no flag (a secret)"
        out.append(f"| **`{name}`**<br>{env}<br>{flags} | {_annotation(field)}<br>{_default(field)} | "
                   f"{_cell(field.description or '')} |")
    out += ["", "The commands other than `gateway serve` that need a database read `--database-url`, else "
            "`LEASEHOLD_DATABASE_URL`, else `DATABASE_URL` (see [Deploy](../guides/deploy/index.md#the-database-setting)).",
            "", "## Worker agent (`leasehold worker run`)", "", _cell(inspect.getdoc(WorkerSettings) or ""), "",
            "In the environment, lists are JSON: `LEASEHOLD_WORKER_CAPABILITIES='[\"tcp-connect\"]'`. A TOML file "
            "holds the same names at top level.", "",
            "| setting (TOML key): environment, flag | type, default | meaning |", "|---|---|---|"]
    for name, field in WorkerSettings.model_fields.items():
        flags = " ".join(f"`{f}`" for f in worker_flags.get(name, []))
        out.append(f"| **`{name}`**<br>`{ENV_PREFIX}{name.upper()}`<br>{flags} | {_annotation(field)}<br>"
                   f"{_default(field)} | {_cell(field.description or '')} |")
    out.append("")
    return "\n".join(out)


# --- metrics ------------------------------------------------------------------------------------

#: The prometheus_client constructors whose calls declare a metric family.
_METRIC_KINDS = {"Counter": "counter", "Gauge": "gauge", "Histogram": "histogram", "Summary": "summary"}


def _declared_families(package: Path) -> Iterator[tuple[str, str, str, tuple[str, ...], str]]:
    """``(name, kind, help, labels, module)`` of every metric constructor call in ``package``'s
    source whose name is a literal, or an f-string inside a loop over a literal (each value):
    the families the Gateway registers only once it runs (pool, LISTEN, connection guard…)."""
    for path in sorted(package.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        loops = [node for node in ast.walk(tree) if isinstance(node, ast.For)]
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _METRIC_KINDS
                    and len(node.args) >= 2):
                continue
            labels: tuple[str, ...] = ()
            if len(node.args) >= 3 and isinstance(node.args[2], ast.List | ast.Tuple):
                labels = tuple(e.value for e in node.args[2].elts if isinstance(e, ast.Constant))
            module = str(path.relative_to(ROOT))
            for bindings in _loop_bindings(node, loops):
                try:
                    name, help_text = (_evaluate(arg, bindings) for arg in node.args[:2])
                except (ValueError, NameError, TypeError, AttributeError):
                    continue
                yield name, _METRIC_KINDS[node.func.id], help_text, labels, module


def _loop_bindings(call: ast.Call, loops: list[ast.For]) -> list[dict[str, Any]]:
    enclosing = [loop for loop in loops if any(child is call for child in ast.walk(loop))]
    if not enclosing:
        return [{}]
    loop = enclosing[-1]
    try:
        values = ast.literal_eval(loop.iter)
    except ValueError:
        return [{}]
    out = []
    for value in values:
        if isinstance(loop.target, ast.Tuple):
            names = [t.id for t in loop.target.elts if isinstance(t, ast.Name)]
            out.append(dict(zip(names, value, strict=False)))
        elif isinstance(loop.target, ast.Name):
            out.append({loop.target.id: value})
    return out


def _evaluate(node: ast.expr, bindings: dict[str, Any]) -> str:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        code = compile(ast.fix_missing_locations(ast.Expression(node)), "<metric name>", "eval")
        # The f-string is our own source text, evaluated with the loop values and no builtins.
        return str(eval(code, {"__builtins__": {}}, dict(bindings)))
    raise ValueError("not a literal")


def gateway_families() -> dict[str, tuple[str, str, tuple[str, ...], str]]:
    """``{name: (kind, help, labels, where)}`` of every family a Gateway process may serve."""
    from prometheus_client import CollectorRegistry

    from leasehold.gateway.background.hints import Hints
    from leasehold.gateway.metrics import Metrics

    families: dict[str, tuple[str, str, tuple[str, ...], str]] = {}
    for name, kind, help_text, labels, module in _declared_families(ROOT / "gateway"):
        families[name] = (kind, help_text, labels, module)
    metrics = Metrics()
    hints_registry = CollectorRegistry()
    Hints("redis://unused", lambda _topic: None, registry=hints_registry)
    for registry in (metrics.registry, metrics.by_organization, hints_registry):
        for family in registry.collect():
            name = family.name + ("_total" if family.type == "counter" else "")
            labels = families.get(name, ("", "", (), ""))[2]
            where = families.get(name, ("", "", (), "gateway/metrics.py"))[3]
            families[name] = (family.type, family.documentation, labels, where)
    return dict(sorted(families.items()))


def worker_families() -> dict[str, tuple[str, str]]:
    """``{name: (kind, help)}`` of the worker agent's ``/metrics``, parsed from what it renders."""
    from prometheus_client.parser import text_string_to_metric_families

    from leasehold.worker.health import render_metrics
    from leasehold.worker.status import Status

    text = render_metrics(Status(1))
    out = {}
    for family in text_string_to_metric_families(text):
        out[family.name + ("_total" if family.type == "counter" else "")] = (family.type, family.documentation)
    return out


def metrics_page() -> str:
    from leasehold.gateway.metrics import ORGANIZATION_PREFIX

    out = ["# Metrics", "", _note("the Prometheus registries of the Gateway and the worker agent"),
           "## Gateway (`/metrics` on the operator port)", "",
           "Prometheus text, per process (with `--processes`, counters and histograms summed over every "
           f"process). The families named `{ORGANIZATION_PREFIX}*` name organisations and are served only to a "
           "request with an administrator key. [Operate: metrics](../guides/operate/metrics.md) says what to "
           "watch.", "", "| metric | type | labels | what | defined in |", "|---|---|---|---|---|"]
    for name, (kind, help_text, labels, where) in gateway_families().items():
        out.append(f"| `{name}` | {kind} | {', '.join(f'`{x}`' for x in labels)} | {_cell(help_text)} | `{where}` |")
    out += ["", "## Worker agent (`/metrics` on `--health-port`)", "",
            "| metric | type | what |", "|---|---|---|"]
    for name, (kind, help_text) in worker_families().items():
        out.append(f"| `{name}` | {kind} | {_cell(help_text)} |")
    out.append("")
    return "\n".join(out)


# --- events -------------------------------------------------------------------------------------


def event_classes() -> list[tuple[str, type]]:
    """``(stream, class)`` of every event in :mod:`leasehold.domain.events`, in source order; the
    stream is the section comment (``# --- task stream ---``) the class follows."""
    from leasehold.domain import events

    source = Path(inspect.getfile(events)).read_text()
    section, sections = "", {}
    for line in source.splitlines():
        heading = re.match(r"# --- (.+?) -+$", line)
        if heading:
            section = heading.group(1)
        declared = re.match(r"class (\w+)\(", line)
        if declared:
            sections[declared.group(1)] = section
    base = events.DomainEvent
    found = [(sections.get(cls.__name__, ""), cls) for cls in vars(events).values()
             if isinstance(cls, type) and issubclass(cls, base) and cls is not base]
    order = list(sections)
    return sorted(found, key=lambda item: order.index(item[1].__name__) if item[1].__name__ in order else 0)


def _type_name(annotation: Any) -> str:
    text = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", str(annotation))
    return str(text).replace("typing.", "").replace("datetime.", "").replace("uuid.", "")


def events_page() -> str:
    from leasehold.domain import events

    base = events.DomainEvent
    base_fields = set(base.model_fields)
    out = ["# Events", "", _note("the classes of `leasehold.domain.events`"),
           textwrap.dedent(inspect.getdoc(events) or ""), "",
           "Every event has the fields of `DomainEvent`: " + ", ".join(f"`{n}`" for n in base.model_fields)
           + ". The tables below list each event's own fields. [The event log](../concepts/event-log.md) "
           "says how events are stored and chained.", ""]
    classes = event_classes()
    streams: dict[str, list[type]] = {}
    for stream, cls in classes:
        streams.setdefault(stream or "other", []).append(cls)
    for stream, members in streams.items():
        out += [f"## {stream[0].upper()}{stream[1:]}", ""]
        for cls in members:
            out += [f"### {cls.__name__}", ""]
            doc = inspect.getdoc(cls)
            if doc and doc != inspect.getdoc(base):
                out += [doc, ""]
            version = getattr(cls, "class_version", 1)
            upcasters = sorted(n for n in vars(cls) if n.startswith("upcast_"))
            if version != 1 or upcasters:
                out += [f"`class_version` {version}; upcasters: {', '.join(f'`{u}`' for u in upcasters) or 'none'}.",
                        ""]
            own = {n: f for n, f in cls.model_fields.items() if n not in base_fields}
            if not own:
                out += ["No fields of its own.", ""]
                continue
            out += ["| field | type | default |", "|---|---|---|"]
            for name, field in own.items():
                out.append(f"| `{name}` | {_code(_type_name(field.annotation))} | "
                           f"{'' if field.is_required() else _default(field)} |")
            out.append("")
    values = [obj for name, obj in vars(events).items() if name in ("ProfileStep", "FairShareCandidate", "FairShareGrant")]
    if values:
        out += ["## Values inside events", ""]
        for obj in values:
            out += [f"### {obj.__name__}", "", inspect.getdoc(obj) or "", "",
                    "| field | type |", "|---|---|"]
            for name, annotation in inspect.get_annotations(obj).items():
                out.append(f"| `{name}` | {_code(_type_name(annotation))} |")
            out.append("")
    return "\n".join(out)


#: Site path -> the function writing that page.
PAGES: dict[str, Callable[[], str]] = {
    "reference/cli.md": cli_page,
    "reference/http-api.md": http_api_page,
    "reference/settings.md": settings_page,
    "reference/metrics.md": metrics_page,
    "reference/events.md": events_page,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="directory to write the pages to (as reference/*.md)")
    args = parser.parse_args(argv)
    for path, page in PAGES.items():
        target = args.out / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(page())
        print(f"wrote {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
