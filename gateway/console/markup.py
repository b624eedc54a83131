"""Small HTML building blocks: every value goes in escaped unless it is already :class:`Html`."""

from __future__ import annotations

import html
from collections.abc import Iterable
from datetime import UTC, datetime

from aiohttp import web


class Html(str):
    """Markup that is safe as it is (built here, with every value escaped)."""

    __slots__ = ()


def fmt(template: str, *values: object) -> Html:
    """``template`` (trusted markup with ``{}`` slots) with each value escaped, unless already Html."""
    return Html(template.format(*(v if isinstance(v, Html) else html.escape(_text(v)) for v in values)))


def join(parts: Iterable[Html]) -> Html:
    return Html("".join(parts))


def _text(value: object) -> str:
    if value is None:
        return "—"
    if isinstance(value, datetime):
        return utc(value, "%Y-%m-%d %H:%M:%S UTC")
    return str(value)


def utc(moment: datetime, pattern: str) -> str:
    """``moment`` in UTC, formatted (a time without a zone as it is)."""
    return (moment.astimezone(UTC) if moment.utcoffset() is not None else moment).strftime(pattern)


def table(caption: str, headers: Iterable[str], rows: Iterable[Iterable[object]]) -> Html:
    """A table with a caption and column headers; cells are escaped unless Html."""
    head = join(fmt('<th scope="col">{}</th>', h) for h in headers)
    body = join(fmt("<tr>{}</tr>", join(fmt("<td>{}</td>", cell) for cell in row)) for row in rows)
    return fmt("<table><caption>{}</caption><thead><tr>{}</tr></thead><tbody>{}</tbody></table>", caption, head, body)


CSS = Html("""
body{font-family:system-ui,sans-serif;margin:0;color:#1b1b1b;background:#fafafa;line-height:1.4}
header,main{padding:0 1rem;max-width:72rem;margin:auto}
header{display:flex;flex-wrap:wrap;gap:.5rem 1.5rem;align-items:center;border-bottom:1px solid #ccc}
header p{margin:.5rem 0}
nav ul{display:flex;flex-wrap:wrap;gap:.25rem 1rem;list-style:none;padding:0;margin:.25rem 0}
nav a,ul.actions a{display:inline-block;padding:.35rem 0}
a{color:#0550ae}
a:focus-visible,button:focus-visible,input:focus-visible,select:focus-visible{outline:3px solid #0969da;
outline-offset:2px}
.skip{position:absolute;left:-999px}
.skip:focus{left:1rem;top:.5rem;background:#fff;padding:.25rem .5rem;z-index:1}
table{border-collapse:collapse;width:100%;display:block;overflow-x:auto;margin:1rem 0}
caption{text-align:left;font-weight:600;padding:.25rem 0}
th,td{border:1px solid #ccc;padding:.25rem .5rem;text-align:left;white-space:nowrap}
label{display:block;margin:.5rem 0 .25rem}
label.inline{display:inline;margin-left:.25rem}
input,select,button{font-size:1rem;padding:.3rem;max-width:100%}
button{min-height:2.25rem;cursor:pointer}
ul.actions{display:flex;flex-wrap:wrap;gap:.5rem 1.5rem;list-style:none;padding:0}
/* a drawing wider than the screen scrolls, and opens at its right end: the newest time */
.drawing{overflow-x:auto;margin:.5rem 0;direction:rtl}.drawing>*{direction:ltr}
.drawing svg{display:block;box-sizing:border-box;min-width:40rem;height:auto;background:#fff;border:1px solid #e1e4e8}
.legend{font-size:.9rem;color:#424a53}
.error{color:#a00}
code{overflow-wrap:anywhere}
ol.timeline li{margin:.25rem 0;overflow-wrap:anywhere}
@media (max-width:40rem){body{font-size:15px}th,td{padding:.2rem .3rem}header,main{padding:0 .6rem}
input[size]{width:100%}}
""")


def page(title: str, body: Html, *, nav: Html | None = None, status: int = 200) -> web.Response:
    """A whole page: header (with the navigation, when signed in) and main."""
    text = fmt('<!doctype html><html lang="en"><head><meta charset="utf-8">'
               '<meta name="viewport" content="width=device-width, initial-scale=1">'
               "<title>{} · leasehold console</title><style>{}</style></head>"
               "<body><a class=\"skip\" href=\"#content\">Skip to the content</a>"
               "<header><p><strong>leasehold console</strong></p>{}</header>"
               '<main><h1 id="content" tabindex="-1">{}</h1>{}</main></body></html>',
               title, CSS, nav or Html(""), title, body)
    return web.Response(text=text, status=status, content_type="text/html", charset="utf-8",
                        headers={"Cache-Control": "no-store", "X-Frame-Options": "DENY",
                                 "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; "
                                                            "form-action 'self'; frame-ancestors 'none'"})
