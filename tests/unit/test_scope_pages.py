"""A scope cut into pages (domain.scopes), pure: the pages are cut greedily, put back together they
are the whole scope byte for byte, a page that changed is noticed, and a scope that grows by
appending keeps its earlier pages."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime
from typing import Any
from uuid import uuid4

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from leasehold.domain.events import TaskCreated
from leasehold.domain.limits import TooDeep
from leasehold.domain.scopes import (
    PAGE_BYTES,
    PagedScope,
    ScopeAssembler,
    ScopeMismatch,
    ScopeRef,
    canonical,
    page_scope,
    whole_scope,
)
from leasehold.domain.task import CreateTask, decide
from leasehold.persistence.codec import MAPPER, decode_event, topic_of


def services(count: int, first: int = 1) -> list[dict[str, str]]:
    return [{"kind": "service", "value": f"127.0.0.1:{port}/tcp"} for port in range(first, first + count)]


def greedy(assets: list[Any], page_bytes: int) -> list[bytes]:
    """The rule, written the slow and obvious way: each page takes assets while it fits."""
    pages: list[list[bytes]] = []
    size = 0
    for part in (canonical(a) for a in assets):
        grown = size + len(part) + 1
        if pages and grown <= page_bytes:
            pages[-1].append(part)
            size = grown
        else:
            pages.append([part])
            size = 2 + len(part)
    return [b"[" + b",".join(page) + b"]" for page in pages]


def assembled(paged: PagedScope) -> bytes:
    assembler = ScopeAssembler(paged.inline)
    chunks = [assembler.start(), *(assembler.add(orjson.loads(p.body)) for p in paged.stored), assembler.finish()]
    assembler.check(paged.ref)
    assert (assembler.sha256, assembler.size) == (paged.ref.sha256, paged.ref.size)
    return b"".join(chunks)


def pages_of(paged: PagedScope) -> list[bytes]:
    return [canonical(paged.inline["assets"]), *(p.body for p in paged.stored)]


keys = st.text(min_size=0, max_size=8)
scalars = st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text(max_size=12)
assets = st.lists(st.dictionaries(keys, scalars, max_size=3) | scalars, max_size=60)


@given(assets=assets, page_bytes=st.sampled_from([2, 20, 64, 300, 4096]),
       head=st.dictionaries(keys.filter(lambda k: k != "assets"), scalars, max_size=4))
def test_pages_are_cut_greedily_and_join_back_to_the_whole_scope_byte_for_byte(
        assets: list[Any], page_bytes: int, head: dict[str, Any]) -> None:
    scope = {**head, "assets": assets}
    paged = page_scope(scope, page_bytes=page_bytes)
    assert pages_of(paged) == (greedy(assets, page_bytes) or [b"[]"])
    assert paged.ref == ScopeRef(hashlib.sha256(canonical(scope)).hexdigest(), len(canonical(scope)), len(assets),
                                 max(1, len(greedy(assets, page_bytes))))
    assert assembled(paged) == canonical(scope)
    assert whole_scope(paged.inline, [orjson.loads(p.body) for p in paged.stored]) == scope


def test_a_large_scope_travels_inline_only_with_its_first_page() -> None:
    scope = {"targets": ["127.0.0.1"], "ports": [1, 65535], "assets": services(100_000)}
    paged = page_scope(scope)
    assert paged.ref.assets == 100_000 and paged.ref.pages == len(paged.stored) + 1 > 50
    assert len(canonical(paged.inline)) <= PAGE_BYTES + 100
    assert paged.inline["targets"] == ["127.0.0.1"] and paged.inline["ports"] == [1, 65535]
    assert all(len(p.body) <= PAGE_BYTES for p in paged.stored)
    assert assembled(paged) == canonical(scope)


def test_a_scope_without_an_asset_list_is_one_inline_part() -> None:
    paged = page_scope({"targets": ["a"], "assets": "not a list"})
    assert paged.stored == () and paged.ref.assets is None and paged.ref.pages == 0
    assert assembled(paged) == canonical({"targets": ["a"], "assets": "not a list"})


def test_one_asset_larger_than_a_page_is_a_page_of_its_own() -> None:
    huge = {"kind": "blob", "value": "x" * (2 * PAGE_BYTES)}
    paged = page_scope({"assets": [*services(3), huge, *services(3, 10)]})
    assert [len(orjson.loads(p)) for p in pages_of(paged)] == [3, 1, 3]


def test_a_scope_grown_by_appending_keeps_its_earlier_pages() -> None:
    before = page_scope({"targets": ["h"], "assets": services(20_000)})
    after = page_scope({"targets": ["h"], "assets": services(30_000)})
    assert before.page_hashes[:-1] == after.page_hashes[: len(before.page_hashes) - 1]
    assert before.inline == after.inline


def test_a_changed_page_hashes_differently_and_a_missing_one_is_noticed() -> None:
    paged = page_scope({"assets": services(5_000)})
    tampered = orjson.loads(paged.stored[1].body)
    tampered[0]["value"] = "10.0.0.1:22/tcp"
    assembler = ScopeAssembler(paged.inline)
    assembler.start()
    for n, page in enumerate(paged.stored):
        assembler.add(tampered if n == 1 else orjson.loads(page.body))
    assembler.finish()
    assembler.check(paged.ref)  # as many assets...
    assert assembler.sha256 != paged.ref.sha256  # ...but not the same scope
    short = ScopeAssembler(paged.inline)
    short.start()
    short.finish()
    with pytest.raises(ScopeMismatch, match="assets where its reference says"):
        short.check(paged.ref)


def test_keys_sort_as_the_canonical_encoding_sorts_them() -> None:
    scope = {"\U0001f600": 1, "z": [1], "B": {"y": 1, "x": 2}, "asset": 0, "assets2": 1, "\uffff": 2, "": None,
             "assets": services(3)}
    paged = page_scope(scope, page_bytes=80)
    assert len(paged.stored) == 2
    assert assembled(paged) == canonical(scope)


def test_a_task_whose_inline_scope_nests_too_deep_is_refused_and_one_that_cannot_be_encoded_too() -> None:
    deep: dict[str, Any] = {}
    for _ in range(40):
        deep = {"a": deep}
    ids = {name: uuid4() for name in ("task_id", "scan_id", "scan_job_id", "organization_id")}
    with pytest.raises(TooDeep):
        decide(None, CreateTask(**ids, task_type="probe", scope={"targets": ["h"], "x": deep, "assets": []}),
               now=datetime(2030, 1, 1, tzinfo=UTC), actor="test")
    for _ in range(300):
        deep = {"a": deep}
    with pytest.raises(TooDeep):
        page_scope({"x": deep})


def test_the_reference_round_trips_through_its_row_form() -> None:
    ref = page_scope({"assets": services(10)}, omitted=7).ref
    assert ref.omitted == 7
    assert ScopeRef.from_json(orjson.loads(orjson.dumps(ref.to_json()))) == ref
    assert ScopeRef.from_json(None) is None


def test_a_task_whose_scope_is_whole_inline_is_stored_as_before_scopes_were_paged() -> None:
    """The scope reference is sparse: a scope that fits its row records none of it, so the event's
    stored bytes are what they were before scopes were paged (and older code still reads them)."""
    ids = {name: uuid4() for name in ("task_id", "scan_id", "scan_job_id", "organization_id")}
    at = datetime(2030, 1, 1, tzinfo=UTC)
    [small] = decide(None, CreateTask(**ids, task_type="probe", scope={"targets": ["h"], "assets": services(3)}),
                     now=at, actor="test")
    stored = orjson.loads(MAPPER.to_stored_event(small).state)
    assert not [key for key in stored if key.startswith("scope_") or key == "class_version"]
    assert decode_event(ids["task_id"], 1, topic_of(TaskCreated), orjson.dumps(stored)) == small
    paged = page_scope({"targets": ["h"], "assets": services(5_000)})
    [large] = decide(None, CreateTask(**ids, task_type="probe", scope=paged), now=at, actor="test")
    stored = orjson.loads(MAPPER.to_stored_event(large).state)
    assert stored["scope_pages"] == list(paged.page_hashes) and stored["scope_sha256"] == paged.ref.sha256
    assert decode_event(ids["task_id"], 1, topic_of(TaskCreated), orjson.dumps(stored)) == large
