"""HTTP probe: GET the web services in scope and record what answers.

It probes the URL targets as given, and every ``service`` asset in ``scope.assets``: HTTPS
first, then plain HTTP if the TLS handshake fails. Certificates are not verified (scanned hosts
often have self-signed ones; ``tls_inspect`` reports on them). Redirects are followed by hand,
at most ``max_redirects`` (default 5), and **only while they stay in scope**: a redirect to a
host or port outside the scope is recorded, never requested.

Parameters (all optional): ``timeout`` (seconds per request, default 10), ``concurrency``
(default 10), ``max_redirects`` (default 5), ``max_body_bytes`` (default 262144),
``user_agent``, ``schemes`` (for services; default ``["https", "http"]``).

Emits one ``url`` asset per probed start URL, with attributes ``status``, ``title``,
``server``, ``redirects`` (the chain of ``{url, status, location}``), ``final_url``,
``content_type`` and ``scheme``.
"""

from __future__ import annotations

import asyncio
import html
import re
import ssl
import sys
import time
from typing import Any
from urllib.parse import urljoin, urlsplit

import aiohttp

from leasehold.worker.plugins.common import (
    Emitter,
    PluginInput,
    PluginInputError,
    Scope,
    asset_record,
    format_host_port,
    log,
    param_float,
    param_int,
    raw_record,
    run_plugin,
)

__all__ = ["extract_title", "probe_url", "scan"]

PLUGIN = "http_probe"
DEFAULT_USER_AGENT = "leasehold-http-probe/0.1"
_TITLE_RE = re.compile(rb"<title[^>]*>(.*?)</title\s*>", re.IGNORECASE | re.DOTALL)
_CHARSET_RE = re.compile(rb"""<meta[^>]+charset=["']?([A-Za-z0-9_.:-]+)""", re.IGNORECASE)
_MAX_TITLE = 512


class _OutOfScopeError(Exception):
    """A redirect pointed outside the scope."""


def extract_title(body: bytes, charset: str | None = None) -> str | None:
    """Return the text of the first ``<title>`` in ``body`` (unescaped, whitespace collapsed)."""
    match = _TITLE_RE.search(body)
    if match is None:
        return None
    encoding = charset
    if encoding is None:
        meta = _CHARSET_RE.search(body)
        encoding = meta.group(1).decode("ascii") if meta else "utf-8"
    try:
        text = match.group(1).decode(encoding, errors="replace")
    except LookupError:
        text = match.group(1).decode("utf-8", errors="replace")
    title = " ".join(html.unescape(text).split())
    return title[:_MAX_TITLE]


def _insecure_ssl_context() -> ssl.SSLContext:
    # A scanner must see servers with self-signed or expired certificates: no verification.
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


async def _read_limited(response: aiohttp.ClientResponse, limit: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while size < limit:
        chunk = await response.content.read(min(65536, limit - size))
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def _in_scope(scope: Scope, url: str) -> bool:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return False
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        return False
    return scope.allows(parts.hostname, port)


async def probe_url(
    session: aiohttp.ClientSession,
    scope: Scope,
    url: str,
    *,
    max_redirects: int,
    max_body_bytes: int,
) -> dict[str, Any]:
    """GET ``url``, following in-scope redirects; return the attributes of its ``url`` asset.

    Raises ``aiohttp.ClientError``/``TimeoutError``/``OSError`` when the first request fails.
    """
    started = time.monotonic()
    chain: list[dict[str, Any]] = []
    current = url
    blocked: str | None = None
    while True:
        if not _in_scope(scope, current):  # checked before *every* request, the first included
            raise _OutOfScopeError(current)
        async with session.get(current, allow_redirects=False) as response:
            status = response.status
            location = response.headers.get("Location")
            if status in (301, 302, 303, 307, 308) and location is not None:
                next_url = urljoin(current, location)
                chain.append({"url": current, "status": status, "location": next_url})
                if len(chain) > max_redirects:
                    blocked = "too many redirects"
                elif not _in_scope(scope, next_url):
                    blocked = "redirect leaves the scope"
                else:
                    current = next_url
                    continue
            body = await _read_limited(response, max_body_bytes)
            content_type = response.headers.get("Content-Type")
            charset = response.charset
            server = response.headers.get("Server")
            headers = {k.lower(): v for k, v in response.headers.items() if k.lower() in _KEPT_HEADERS}
        break
    attributes: dict[str, Any] = {
        "url": url,
        "scheme": urlsplit(url).scheme,
        "status": status,
        "title": extract_title(body, charset),
        "server": server,
        "content_type": content_type,
        "content_length": len(body),
        "redirects": chain,
        "final_url": current,
        "headers": headers,
        "elapsed_ms": round((time.monotonic() - started) * 1000, 2),
    }
    if blocked is not None:
        attributes["redirect_not_followed"] = {"reason": blocked, "location": chain[-1]["location"]}
    return attributes


_KEPT_HEADERS = frozenset(
    {"server", "x-powered-by", "strict-transport-security", "content-security-policy", "x-frame-options",
     "www-authenticate"}
)  # fmt: skip


def _start_urls(request: PluginInput, schemes: list[str]) -> list[list[str]]:
    """Groups of alternative URLs: the first that answers wins (HTTPS before HTTP).

    A service that a URL target already covers (same host and port) is not probed again.
    """
    scope = request.scope
    groups: list[list[str]] = []
    seen: set[str] = set()
    covered: set[tuple[str, int]] = set()
    for target in scope.targets:
        if target.kind == "url" and target.url is not None and target.url not in seen:
            seen.add(target.url)
            groups.append([target.url])
            if target.port is not None:
                covered.add((target.host, target.port))
    for service in scope.services():
        if (service.host, service.port) in covered:
            continue
        authority = format_host_port(service.host, service.port)
        urls = [f"{scheme}://{authority}/" for scheme in schemes]
        groups.append(urls)
    return groups


async def scan(request: PluginInput, out: Emitter) -> None:
    """Probe every URL target and web-ish service in scope."""
    parameters = request.parameters
    timeout = param_float(parameters, "timeout", 10.0, maximum=300.0)
    concurrency = param_int(parameters, "concurrency", 10, maximum=256)
    max_redirects = param_int(parameters, "max_redirects", 5, minimum=0, maximum=20)
    max_body = param_int(parameters, "max_body_bytes", 262_144, maximum=16 * 1024 * 1024)
    user_agent = parameters.get("user_agent", DEFAULT_USER_AGENT)
    schemes = parameters.get("schemes", ["https", "http"])
    if not isinstance(user_agent, str):
        raise PluginInputError("parameter user_agent must be a string")
    if not isinstance(schemes, list) or not schemes or not set(schemes) <= {"http", "https"}:
        raise PluginInputError('parameter schemes must be a non-empty list of "http"/"https"')

    groups = _start_urls(request, schemes)
    log("probing", urls=sum(len(g) for g in groups), services=len(groups))
    semaphore = asyncio.Semaphore(concurrency)
    connector = aiohttp.TCPConnector(ssl=_insecure_ssl_context(), limit=concurrency, force_close=True)
    client_timeout = aiohttp.ClientTimeout(total=timeout, sock_connect=timeout)
    async with aiohttp.ClientSession(
        connector=connector,
        timeout=client_timeout,
        headers={"User-Agent": user_agent},
        trust_env=False,  # never go through a proxy from the environment: only the target is contacted
        auto_decompress=True,
    ) as session:

        async def probe_group(urls: list[str]) -> None:
            async with semaphore:
                errors: list[dict[str, str]] = []
                for url in urls:
                    try:
                        attributes = await probe_url(
                            session, request.scope, url, max_redirects=max_redirects, max_body_bytes=max_body
                        )
                    except _OutOfScopeError:
                        log("not in scope, skipped", url=url)
                        return
                    except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as exc:
                        errors.append({"url": url, "error": f"{type(exc).__name__}: {exc}"})
                        continue
                    out.emit(asset_record("url", url, attributes))
                    return
                log("no HTTP answer", urls=urls)
                out.emit(raw_record(plugin=PLUGIN, event="no_http_answer", errors=errors))

        await asyncio.gather(*(probe_group(g) for g in groups))


if __name__ == "__main__":
    sys.exit(run_plugin(PLUGIN, scan))
