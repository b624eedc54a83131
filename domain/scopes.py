"""A task's scope, kept whole on the server and handed out in pages.

A profile step's scope holds every asset the earlier steps found, so a scan that finds 100,000
services hands its next step a scope of megabytes. The task's row, the event that creates it and
every answer about the task carry only the scope's **inline part** — the scope with just the
first page of its ``assets`` — and a :class:`ScopeRef`: the sha256 and size of the whole scope's
canonical JSON, how many assets it has and in how many pages. The other pages are stored once
each, by the sha256 of their bytes (``scope_pages``); the event lists those hashes in order, so
the log commits to the whole scope, and a stored page edited later no longer matches its hash.

Canonical JSON is orjson's compact encoding with sorted keys, as for result payloads. A page's
bytes are the canonical JSON array of its assets. Pages are cut greedily in order: a page takes
assets while its bytes stay within :data:`PAGE_BYTES` (and at least one). A scope that grows by
appending, as a scan's does from step to step, therefore keeps its earlier full pages, which are
stored only once.

Both sides use this module: the Gateway pages a scope when it creates the task
(:func:`page_scope`), the agent puts it back together page by page (:class:`ScopeAssembler`) and
checks the whole against its sha256 before the plugin reads it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import orjson

from leasehold.domain.limits import TooDeep, check_field

#: The largest a page of assets may be (its canonical JSON array), unless one asset alone is larger.
PAGE_BYTES = 64 * 1024
#: The scope key whose list is paged.
ASSETS = "assets"


def canonical(value: Any) -> bytes:
    """The canonical JSON bytes of ``value`` (what scope hashes are taken over)."""
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)


@dataclass(frozen=True, slots=True)
class ScopeRef:
    """What a task says about its whole scope."""

    sha256: str  # hex, of the whole scope's canonical JSON
    size: int  # bytes of that JSON
    assets: int | None  # how many assets it holds (None: it has no asset list)
    pages: int  # pages of assets, the inline first one included (0: no asset list)
    omitted: int = 0  # found assets left out of it (over domain.scan.MAX_SCOPE_ASSETS)

    def to_json(self) -> dict[str, Any]:
        return {"sha256": self.sha256, "bytes": self.size, "assets": self.assets, "pages": self.pages,
                "omitted": self.omitted}

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> ScopeRef | None:
        """From :meth:`to_json`'s form (``worker_tasks.scope_ref``); None for None (a task whose
        scope is whole in its row: a small one, or one created before scopes were paged)."""
        if data is None:
            return None
        return cls(sha256=data["sha256"], size=data["bytes"], assets=data["assets"], pages=data["pages"],
                   omitted=data.get("omitted", 0))


@dataclass(frozen=True, slots=True)
class StoredPage:
    """A page of assets after the first: stored by the sha256 of ``body`` (canonical JSON array)."""

    sha256: str
    body: bytes


@dataclass(frozen=True, slots=True)
class PagedScope:
    """A scope cut for storage: the inline part, the pages stored apart, and the reference."""

    inline: dict[str, Any]
    stored: tuple[StoredPage, ...]
    ref: ScopeRef

    @property
    def page_hashes(self) -> tuple[str, ...]:
        return tuple(p.sha256 for p in self.stored)


def page_scope(scope: Mapping[str, Any], *, omitted: int = 0, page_bytes: int = PAGE_BYTES) -> PagedScope:
    """Cut ``scope`` into its inline part and stored pages (``omitted``: found assets left out of
    it, recorded with it). Its size has no limit here (the limits on what clients send apply where
    they send it); a scope that cannot be encoded is refused (TooDeep). How deep the inline part,
    which every answer about the task carries, may nest is checked where the task is created
    (:func:`domain.task.decide`)."""
    # Depth first: a scope nesting deeper than its limit is refused naming the limit (the
    # encoder's own recursion limit would refuse it too, without saying which limit it broke).
    check_field("scope", scope, max_bytes=None)
    try:
        whole = canonical(scope)
    except orjson.JSONEncodeError as exc:
        raise TooDeep(f"scope cannot be encoded: {exc}", field="scope") from exc
    ref = ScopeRef(hashlib.sha256(whole).hexdigest(), len(whole), None, 0, omitted)
    assets = scope.get(ASSETS)
    if not isinstance(assets, list):
        return PagedScope(dict(scope), (), ref)
    bodies: list[bytes] = []
    first, start, guess = 0, 0, 256
    while start < len(assets):
        body, count = _next_page(assets, start, page_bytes, guess)
        if start == 0:
            first = count
        else:
            bodies.append(body)
        start, guess = start + count, count
    inline = {key: (assets[:first] if key == ASSETS else value) for key, value in scope.items()}
    stored = tuple(StoredPage(hashlib.sha256(body).hexdigest(), body) for body in bodies)
    return PagedScope(inline, stored, replace(ref, assets=len(assets), pages=1 + len(stored)))


def _next_page(assets: Sequence[Any], start: int, page_bytes: int, guess: int) -> tuple[bytes, int]:
    """The page that starts at ``assets[start]``: its bytes and how many assets it takes (as many
    as fit in ``page_bytes``, at least one). Each try encodes a candidate page and guesses the
    next count from its bytes per asset, so pages of similar assets take two or three tries."""
    remaining = len(assets) - start
    fits, fits_body, too_many = 0, b"", remaining + 1
    count = max(1, min(guess, remaining))
    while True:
        body = canonical(assets[start:start + count])
        if len(body) <= page_bytes or count == 1:  # one asset always makes a page
            fits, fits_body = count, body
        else:
            too_many = count
        if too_many - fits <= 1:
            return fits_body, fits
        estimate = count * page_bytes // len(body)
        count = min(max(estimate, fits + 1), too_many - 1)


def whole_scope(inline: Mapping[str, Any], pages: Iterable[Sequence[Any]]) -> dict[str, Any]:
    """The whole scope from its inline part and the assets of its stored pages, in order."""
    scope = dict(inline)
    if isinstance(scope.get(ASSETS), list):
        assets = list(scope[ASSETS])
        for page in pages:
            assets.extend(page)
        scope[ASSETS] = assets
    return scope


class ScopeMismatch(ValueError):
    """The scope put back together is not the one the task's reference names."""


class ScopeAssembler:
    """The canonical JSON of a whole scope, chunk by chunk: :meth:`start` (the inline part up to
    the end of its first page of assets), :meth:`add` for each further page in order,
    :meth:`finish`. Memory holds one page; :meth:`check` compares the result with the reference.

    The chunks concatenated are exactly :func:`canonical` of :func:`whole_scope`: keys in sorted
    order, the asset list spliced together from its pages.
    """

    def __init__(self, inline: Mapping[str, Any]) -> None:
        self._inline = inline
        self._digest = hashlib.sha256()
        self.size = 0
        self.assets = 0
        self._paged = isinstance(inline.get(ASSETS), list)
        self._state = "new"

    def _out(self, chunk: bytes) -> bytes:
        self._digest.update(chunk)
        self.size += len(chunk)
        return chunk

    def start(self) -> bytes:
        """The scope's bytes up to the end of its first page of assets (the whole scope when it
        has no asset list)."""
        assert self._state == "new", "start() comes first, once"
        self._state = "started"
        if not self._paged:
            self._state = "finished"
            return self._out(canonical(self._inline))
        before = [key for key in sorted(self._inline) if key < ASSETS]
        head = b"".join(orjson.dumps(key) + b":" + canonical(self._inline[key]) + b"," for key in before)
        return self._out(b"{" + head + b'"assets":[' + self._items(self._inline[ASSETS]))

    def add(self, assets: Sequence[Any]) -> bytes:
        """The bytes of one more page of assets."""
        assert self._state == "started" and self._paged, "add() goes between start() and finish()"
        return self._out(self._items(assets))

    def finish(self) -> bytes:
        """The rest of the scope (nothing when :meth:`start` gave it whole)."""
        if self._state == "finished":
            return b""
        assert self._state == "started", "finish() comes after start()"
        self._state = "finished"
        after = [key for key in sorted(self._inline) if key > ASSETS]
        tail = b"".join(b"," + orjson.dumps(key) + b":" + canonical(self._inline[key]) for key in after)
        return self._out(b"]" + tail + b"}")

    def _items(self, assets: Sequence[Any]) -> bytes:
        if not assets:
            return b""
        body = canonical(list(assets))[1:-1]
        chunk = body if self.assets == 0 else b"," + body
        self.assets += len(assets)
        return chunk

    @property
    def sha256(self) -> str:
        return self._digest.hexdigest()

    def check(self, ref: ScopeRef) -> None:
        """Raise :class:`ScopeMismatch` unless every asset of the scope ``ref`` names was assembled.

        The count, not the sha256: the inline part reaches a worker through the task's row, a
        ``jsonb`` column, which may write a number differently (``1e16`` comes back as
        ``10000000000000000``), so only the Gateway, which holds the exact bytes, compares hashes
        (it checks every page it serves against its sha256)."""
        if self._state != "finished":
            raise ScopeMismatch("the scope was not assembled to its end")
        if self._paged and ref.assets is not None and self.assets != ref.assets:
            raise ScopeMismatch(f"the scope has {self.assets} assets where its reference says {ref.assets}")
