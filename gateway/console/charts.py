"""Inline SVG drawn on the server (no script): a task's attempts on a time axis, and the
throughput chart of the overview. Each comes with the markup of a table holding the same data,
for screen readers and for whoever cannot see the drawing."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from leasehold.gateway.api.operator_models import Attempt, Event
from leasehold.gateway.console.markup import Html, fmt, join, table, utc

WIDTH = 800
LABEL = 175  # the attempts' labels, left of the axis
RIGHT = 44
TOP = 34  # the tick labels above the rows
ROW = 40

#: Colours of an attempt's bar by its status (the rest: grey).
OUTCOME_COLOURS = {"succeeded": "#1a7f37", "completed": "#1a7f37", "running": "#0969da", "leased": "#0969da",
                   "expired": "#bc4c00", "failed": "#cf222e", "timeout": "#cf222e", "revoked": "#8250df",
                   "cancelled": "#57606a"}


def scrolling(drawing: Html, name: str) -> Html:
    """A drawing kept legible on a narrow screen: at least 40rem wide, scrolled sideways (and
    focusable, so the keyboard can scroll it too)."""
    return fmt('<div class="drawing" role="region" aria-label="{}" tabindex="0">{}</div>', name, drawing)


def _clock(moment: datetime) -> str:
    return utc(moment, "%H:%M:%S.%f")[:-3]


@dataclass
class AttemptMarks:
    """What happened to one attempt, in time: the marks drawn on its row."""

    attempt: Attempt
    renewals: list[datetime] = field(default_factory=list)
    batches: list[datetime] = field(default_factory=list)

    @property
    def live(self) -> bool:
        return self.attempt.status in ("leased", "running")

    @property
    def lease_expiry(self) -> datetime | None:
        """When the lease ran out (an expired attempt) or will (a live one); None once it ended otherwise."""
        return self.attempt.lease_expires_at if self.live or self.attempt.status == "expired" else None

    @property
    def end(self) -> datetime:
        """The right end of its bar: when it ended, else (still live) when its lease runs out."""
        return self.attempt.finished_at or self.attempt.lease_expires_at


def attempt_marks(attempts: Sequence[Attempt], events: Sequence[Event]) -> list[AttemptMarks]:
    """Each attempt with its renewals and result batches, found in the task's events."""
    marks = {str(a.id): AttemptMarks(a) for a in attempts}
    for event in events:
        found = marks.get(str(event.payload.get("attempt_id")))
        if found is None:
            continue
        if event.type == "LeaseRenewed":
            found.renewals.append(event.occurred_at)
        elif event.type == "ResultBatchAccepted":
            found.batches.append(event.occurred_at)
    return list(marks.values())


def _span(rows: Sequence[AttemptMarks]) -> tuple[datetime, datetime]:
    start = min(m.attempt.leased_at for m in rows)
    end = max([m.end for m in rows] + [t for m in rows for t in (*m.renewals, *m.batches)])
    # A deadline not far past the rest is drawn where it falls; a farther one only as an arrow.
    reach = end + max(end - start, timedelta(seconds=1)) / 4
    end = max([end] + [m.attempt.deadline_at for m in rows if m.attempt.deadline_at <= reach])
    return start, end if end > start else start + timedelta(seconds=1)


def attempts_axis(rows: Sequence[AttemptMarks]) -> Html:
    """``<svg id="attempts-axis">``: one ``<g class="attempt">`` per attempt on a shared time axis."""
    if not rows:
        return Html('<svg id="attempts-axis" role="img" aria-label="No attempt yet: the task was never leased" '
                    'viewBox="0 0 800 40" width="100%" xmlns="http://www.w3.org/2000/svg">'
                    '<text x="8" y="24" font-size="14">No attempt yet.</text></svg>')
    start, end = _span(rows)
    scale = (WIDTH - LABEL - RIGHT) / (end - start).total_seconds()

    def x(moment: datetime) -> float:
        return round(LABEL + min(max((moment - start).total_seconds(), 0.0), (end - start).total_seconds()) * scale,
                     1)

    height = TOP + ROW * len(rows) + 8
    pattern = "%H:%M:%S.%f" if (end - start) < timedelta(seconds=20) else "%H:%M:%S"
    ticks = join(fmt('<line x1="{}" y1="{}" x2="{}" y2="{}" stroke="#d0d7de"/>'
                     '<text x="{}" y="20" font-size="11" text-anchor="middle">{}</text>',
                     px, TOP - 6, px, height - 4, px, utc(at, pattern)[:11])
                 for at in (start + (end - start) * i / 4 for i in range(5)) for px in (x(at),))
    groups = []
    for n, m in enumerate(rows):
        a = m.attempt
        y = TOP + ROW * n + ROW // 2
        colour = OUTCOME_COLOURS.get(a.status, "#57606a")
        parts = [
            fmt('<text x="4" y="{}" font-size="13">Attempt {} · {}</text>', y + 4, a.attempt_number, a.status),
            fmt('<line class="bar" x1="{}" y1="{}" x2="{}" y2="{}" stroke="{}" stroke-width="6"'
                ' stroke-dasharray="{}"/>', x(a.leased_at), y, x(m.end), y, colour, "6 3" if m.live else "none"),
            fmt('<circle class="mark grant" cx="{}" cy="{}" r="6" fill="{}"><title>Lease granted at {}</title>'
                "</circle>", x(a.leased_at), y, colour, _clock(a.leased_at)),
        ]
        parts += [fmt('<line class="mark renewal" x1="{}" y1="{}" x2="{}" y2="{}" stroke="#1b1b1b" stroke-width="2">'
                      "<title>Lease renewed at {}</title></line>", x(t), y - 9, x(t), y + 9, _clock(t))
                  for t in m.renewals]
        parts += [fmt('<rect class="mark batch" x="{}" y="{}" width="7" height="7" fill="#1b1b1b">'
                      "<title>Result batch accepted at {}</title></rect>", x(t) - 3.5, y - 16, _clock(t))
                  for t in m.batches]
        if m.lease_expiry is not None:
            verb = "Lease expired" if a.status == "expired" else "Lease expires"
            ex = x(m.lease_expiry)
            parts.append(fmt('<path class="mark lease-expiry" d="M{} {}l8 8m0 -8l-8 8" stroke="#bc4c00" '
                             'stroke-width="2.5"><title>{} at {}</title></path>', ex - 4, y + 6, verb,
                             _clock(m.lease_expiry)))
        if a.deadline_at <= end:
            dx = x(a.deadline_at)
            parts.append(fmt('<line class="mark deadline" x1="{}" y1="{}" x2="{}" y2="{}" stroke="#cf222e" '
                             'stroke-width="2" stroke-dasharray="3 2"><title>Deadline at {}</title></line>',
                             dx, y - 14, dx, y + 14, _clock(a.deadline_at)))
        else:
            dx = WIDTH - RIGHT
            parts.append(fmt('<path class="mark deadline" d="M{} {}l10 6l-10 6z" fill="#cf222e"><title>Deadline at '
                             "{}, past the right edge</title></path>", dx, y - 6, utc(a.deadline_at,
                                                                                      "%Y-%m-%d %H:%M:%S")))
        if a.finished_at is not None:
            fx = x(a.finished_at)
            parts.append(fmt('<path class="mark end" d="M{} {}l7 7l-7 7l-7 -7z" fill="{}" stroke="#1b1b1b">'
                             "<title>Ended ({}) at {}</title></path>", fx, y - 7, colour, a.status,
                             _clock(a.finished_at)))
        groups.append(fmt('<g class="attempt" data-attempt="{}" data-outcome="{}">{}</g>', a.attempt_number,
                          a.status, join(parts)))
    label = (f"Attempts on a time axis from {utc(start, '%H:%M:%S')} to {utc(end, '%H:%M:%S')} UTC: "
             + "; ".join(f"attempt {m.attempt.attempt_number} {m.attempt.status}" for m in rows))
    return scrolling(fmt('<svg id="attempts-axis" role="img" aria-label="{}" viewBox="0 0 {} {}" width="100%" '
                         'xmlns="http://www.w3.org/2000/svg">{}{}</svg>', label, WIDTH, height, ticks, join(groups)),
                     "The attempts on a time axis")


LEGEND = Html('<p class="legend">Circle: lease granted · bar: the attempt (dashed while live) · tick: lease '
              "renewed · square: result batch · cross: lease expiry · red dashes: deadline (a triangle when it "
              "lies past the right edge) · diamond: the end. Times in UTC.</p>")


def attempts_table(rows: Sequence[AttemptMarks]) -> Html:
    """The same data as :func:`attempts_axis`, as a table."""
    def times(moments: list[datetime]) -> str:
        shown = ", ".join(_clock(t) for t in moments[:20])
        return f"{len(moments)}" + (f": {shown}" if moments else "") + (" …" if len(moments) > 20 else "")
    return table("Time axis: what happened to each attempt", ["Attempt", "Outcome", "Lease granted", "Renewals",
                                                              "Lease expiry", "Deadline", "Result batches", "Ended"],
                 [[m.attempt.attempt_number, m.attempt.status, m.attempt.leased_at, times(m.renewals),
                   m.lease_expiry, m.attempt.deadline_at, times(m.batches), m.attempt.finished_at] for m in rows])


# --- the overview's throughput -------------------------------------------------------------------

BUCKETS = 12
BUCKET = timedelta(minutes=5)
CHART_HEIGHT = 220
PLOT_TOP, PLOT_BOTTOM, PLOT_LEFT = 16, 184, 48


def throughput_chart(since: datetime, completed: Sequence[int], failed: Sequence[int]) -> Html:
    """``<svg id="throughput-chart">``: completed and failed attempts per 5-minute bucket from ``since``."""
    peak = max([1, *completed, *failed])
    slot = (WIDTH - PLOT_LEFT - RIGHT) / BUCKETS
    bar = slot * 0.38

    def height(value: int) -> float:
        return round((PLOT_BOTTOM - PLOT_TOP) * value / peak, 1)

    groups = []
    for i, (done, bad) in enumerate(zip(completed, failed, strict=True)):
        left = PLOT_LEFT + slot * i + slot * 0.1
        start = since + BUCKET * i
        label = f"{utc(start, '%H:%M')}–{utc(start + BUCKET, '%H:%M')}: {done} completed, {bad} failed"
        groups.append(fmt(
            '<g class="bucket" data-start="{}" data-completed="{}" data-failed="{}"><title>{}</title>'
            '<rect class="completed" x="{}" y="{}" width="{}" height="{}" fill="#1a7f37"/>'
            '<rect class="failed" x="{}" y="{}" width="{}" height="{}" fill="#cf222e"/>{}</g>',
            start.isoformat(), done, bad, label,
            round(left, 1), PLOT_BOTTOM - height(done), round(bar, 1), height(done),
            round(left + bar, 1), PLOT_BOTTOM - height(bad), round(bar, 1), height(bad),
            fmt('<text x="{}" y="{}" font-size="11" text-anchor="middle">{}</text>', round(left + bar, 1),
                PLOT_BOTTOM + 16, utc(start, "%H:%M")) if i % 3 == 0 else Html("")))
    axes = fmt('<line x1="{}" y1="{}" x2="{}" y2="{}" stroke="#57606a"/>'
               '<text x="{}" y="{}" font-size="11" text-anchor="end">{}</text>'
               '<text x="{}" y="{}" font-size="11" text-anchor="end">0</text>',
               PLOT_LEFT, PLOT_BOTTOM, WIDTH - RIGHT, PLOT_BOTTOM, PLOT_LEFT - 6, PLOT_TOP + 10, peak,
               PLOT_LEFT - 6, PLOT_BOTTOM)
    end = since + BUCKET * BUCKETS
    label = (f"Completed and failed attempts per 5 minutes from {utc(since, '%H:%M')} to {utc(end, '%H:%M')} UTC: "
             f"{sum(completed)} completed, {sum(failed)} failed")
    return scrolling(fmt('<svg id="throughput-chart" role="img" aria-label="{}" viewBox="0 0 {} {}" width="100%" '
                         'xmlns="http://www.w3.org/2000/svg">{}{}</svg>', label, WIDTH, CHART_HEIGHT, axes,
                         join(groups)), "Throughput over the last hour")


def throughput_table(since: datetime, completed: Sequence[int], failed: Sequence[int]) -> Html:
    """The same data as :func:`throughput_chart`, as a table."""
    return table("Per 5 minutes over the last hour (UTC)", ["From", "Completed", "Failed"],
                 [[utc(since + BUCKET * i, "%H:%M"), done, bad]
                  for i, (done, bad) in enumerate(zip(completed, failed, strict=True))])
