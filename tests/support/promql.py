"""The metric names and label names a PromQL expression uses, read simply (not a full parser):
enough to check that a dashboard or an alert rule queries only series a Gateway serves.

Metric names are the identifiers left once strings, label matchers (``{…}``), ranges
(``[…]``), numbers, durations, Grafana variables, functions (an identifier before ``(``) and
keywords are taken out. Label names are those on the left of a matcher inside ``{…}``, and those
listed by ``by``, ``without``, ``on``, ``ignoring``, ``group_left`` and ``group_right``. Grafana's
``label_values(metric, label)`` counts its metric and its label.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

#: Words that are never metric names (aggregations and operators; functions are found by their "(").
KEYWORDS = frozenset({
    "by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless", "offset",
    "inf", "nan", "sum", "min", "max", "avg", "count", "stddev", "stdvar", "topk", "bottomk", "quantile",
    "count_values", "group", "atan2", "start", "end",
})
_IDENT = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_GRAFANA_VARIABLE = re.compile(r"\$\{[^}]*\}|\$[A-Za-z_][A-Za-z0-9_]*")
_MATCHER_LABEL = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\s*(?:=~|!~|!=|=)")
_GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\(([^()]*)\)")
_LABEL_VALUES = re.compile(r"^\s*label_values\s*\((.*),\s*([A-Za-z_][A-Za-z0-9_]*)\s*\)\s*$", re.S)
_NUMBER_OR_DURATION = re.compile(r"(?<![A-Za-z0-9_:])\d[0-9.eE+]*(?:ms|[smhdwy])?(?:\d+(?:ms|[smhdwy]))*")


@dataclass
class Uses:
    """What one expression reads: metric names, and label names (those inside a selector's braces
    by the metric they follow; the grouping ones apply to the whole expression)."""

    metrics: set[str] = field(default_factory=set)
    #: ``{metric: labels matched on that metric's selector}``
    selector_labels: dict[str, set[str]] = field(default_factory=dict)
    #: labels named by ``by (…)``, ``on (…)`` and the like, for any metric of the expression
    grouping_labels: set[str] = field(default_factory=set)


def uses(expression: str) -> Uses:
    """The metric and label names ``expression`` (PromQL, maybe with Grafana variables) reads."""
    found = Uses()
    values = _LABEL_VALUES.match(expression)
    if values:  # Grafana's template query: label_values(selector, label)
        inner = uses(values.group(1))
        inner.grouping_labels.add(values.group(2))
        return inner
    # Strings go first (a regex in a matcher may hold anything), keeping their place as "".
    text = _STRING.sub('""', expression)
    text = _GRAFANA_VARIABLE.sub("1", text)
    # Selectors: the braces after a metric name (or a bare {…} selector, whose metric is unknown).
    def selector(match: re.Match[str]) -> str:
        name = match.group(1) or ""
        labels = set(_MATCHER_LABEL.findall(match.group(2)))
        if name:
            found.selector_labels.setdefault(name, set()).update(labels)
        else:
            found.grouping_labels.update(labels)
        return name + " "
    text = re.sub(r"([A-Za-z_:][A-Za-z0-9_:]*)?\s*\{([^{}]*)\}", selector, text)
    text = re.sub(r"\[[^\]]*\]", " ", text)  # ranges and subqueries: [5m], [1h:1m]
    for _, labels in _GROUPING.findall(text):
        found.grouping_labels.update(label.strip() for label in labels.split(",") if label.strip())
    text = _GROUPING.sub(" ", text)
    text = re.sub(r"\b(group_left|group_right)\b", " ", text)
    text = _NUMBER_OR_DURATION.sub(" ", text)
    for match in _IDENT.finditer(text):
        word = match.group(0)
        rest = text[match.end():].lstrip()
        if rest.startswith("(") or word.lower() in KEYWORDS:
            continue  # a function call, an aggregation, an operator
        found.metrics.add(word)
    found.metrics.update(found.selector_labels)
    return found
