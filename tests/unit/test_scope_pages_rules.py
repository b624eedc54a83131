"""The rules of paged scopes pinned one by one (domain.scopes, and where domain.task uses
them): how a page's end is searched for and what it reports, what is refused and
how it is named, the order an assembler's calls must follow, what a task's event records of its
scope's reference, and who may read a task's stored pages."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID, uuid4

import pytest

import leasehold.domain.scopes as scopes
from leasehold.domain.errors import DeadlineExceeded, LeaseholdError, LeaseLost, TaskWasCancelled
from leasehold.domain.events import TaskCreated
from leasehold.domain.limits import MAX_FIELD_BYTES, MAX_FIELD_DEPTH, TooDeep
from leasehold.domain.scopes import (
    PAGE_BYTES,
    PagedScope,
    ScopeAssembler,
    ScopeMismatch,
    ScopeRef,
    _next_page,
    canonical,
    page_scope,
)
from leasehold.domain.task import CreateTask, decide, read_refusal, scope_ref_of
from support.refusals import refused
from support.task_states import running

AT = datetime(2030, 1, 1, tzinfo=UTC)


def services(count: int, first: int = 1) -> list[dict[str, str]]:
    return [{"kind": "service", "value": f"127.0.0.1:{port}/tcp"} for port in range(first, first + count)]


def create(scope: dict[str, Any] | PagedScope, **options: Any) -> TaskCreated:
    ids = {name: uuid4() for name in ("task_id", "scan_id", "scan_job_id", "organization_id")}
    [created] = decide(None, CreateTask(**ids, task_type="probe", scope=scope, **options), now=AT, actor="test")
    assert isinstance(created, TaskCreated)
    return created


def nested(levels: int) -> dict[str, Any]:
    value: dict[str, Any] = {}
    for _ in range(levels - 1):
        value = {"a": value}
    return value


@pytest.fixture
def tries(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """How many assets each candidate page the search encodes holds, in order."""
    counts: list[int] = []
    encode = scopes.canonical

    def counting(value: Any) -> bytes:
        if isinstance(value, list):
            counts.append(len(value))
        return encode(value)

    monkeypatch.setattr(scopes, "canonical", counting)
    yield counts


# --- cutting pages -------------------------------------------------------------------------------


def test_a_page_reports_how_many_assets_it_takes_never_more_than_remain() -> None:
    assets = services(5)
    assert _next_page(assets, 0, PAGE_BYTES, 256) == (canonical(assets), 5)
    assert _next_page(assets, 0, PAGE_BYTES, 1) == (canonical(assets), 5)
    assert _next_page(assets, 3, PAGE_BYTES, 256) == (canonical(assets[3:]), 2)
    assert _next_page(assets, 4, PAGE_BYTES, 256) == (canonical(assets[4:]), 1)
    assert _next_page(assets[:1], 0, PAGE_BYTES, 256) == (canonical(assets[:1]), 1)


def test_a_page_exactly_as_large_as_the_limit_still_fits() -> None:
    assets = services(3)
    exact = len(canonical(assets[:2]))
    assert _next_page(assets, 0, exact, 256) == (canonical(assets[:2]), 2)
    assert _next_page(assets, 0, exact - 1, 256) == (canonical(assets[:1]), 1)
    paged = page_scope({"assets": assets}, page_bytes=exact)
    assert paged.inline["assets"] == assets[:2] and [p.body for p in paged.stored] == [canonical(assets[2:])]


def test_the_search_starts_at_256_assets_then_at_the_previous_page_and_guesses_from_bytes_per_asset(
        tries: list[int]) -> None:
    page_scope({"assets": services(257)})
    assert tries == [256, 257]
    tries.clear()
    page_scope({"assets": services(10)}, page_bytes=200)
    assert tries == [10, 4, 5, 4, 5, 2]
    tries.clear()
    paged = page_scope({"assets": services(5_000)})
    assert tries == [256, 1406, 1388, 1389, 1388, 1365, 1366, 1365, 1366, 882]
    assert paged.ref.pages == 4


def test_pages_of_similar_assets_are_found_in_a_few_tries(tries: list[int]) -> None:
    paged = page_scope({"assets": services(100_000, first=10_000)})
    assert len(tries) <= 3 * paged.ref.pages


def test_an_empty_asset_list_is_one_empty_inline_page() -> None:
    paged = page_scope({"targets": ["h"], "assets": []})
    assert paged.inline == {"targets": ["h"], "assets": []} and paged.stored == ()
    assert (paged.ref.assets, paged.ref.pages) == (0, 1)


# --- refusals, named -----------------------------------------------------------------------------


def test_a_scope_nesting_past_the_field_limit_is_refused_though_the_encoder_could_take_it() -> None:
    scope = {"x": nested(MAX_FIELD_DEPTH + 5)}
    canonical(scope)  # the encoder itself goes deeper
    with pytest.raises(TooDeep, match=f"^scope nests deeper than {MAX_FIELD_DEPTH} levels$") as caught:
        page_scope(scope)
    assert caught.value.details == {"field": "scope", "max_depth": MAX_FIELD_DEPTH}


def test_a_scope_that_cannot_be_encoded_is_refused_naming_the_scope() -> None:
    with pytest.raises(TooDeep, match="^scope cannot be encoded: ") as caught:
        page_scope({"assets": [{"port": 2**64}]})
    assert caught.value.details == {"field": "scope"}


def test_a_scope_of_several_pages_must_come_paged_by_the_caller() -> None:
    with refused(ValueError, "a scope of more than one page is paged (and its pages stored) by the caller"):
        create({"assets": services(5_000)})


def test_a_task_whose_paged_inline_part_nests_too_deep_is_refused_naming_the_scope() -> None:
    fine = page_scope({"targets": ["h"]})
    deep = replace(fine, inline={"targets": ["h"], "x": nested(MAX_FIELD_DEPTH + 1)})
    with pytest.raises(TooDeep, match="^scope nests deeper") as caught:
        create(deep)
    assert caught.value.details == {"field": "scope", "max_depth": MAX_FIELD_DEPTH}


def test_a_task_s_parameters_have_no_size_limit_at_creation() -> None:
    parameters = {"blob": "x" * (MAX_FIELD_BYTES + 1)}
    assert create({"targets": ["h"]}, parameters=parameters).parameters == parameters


# --- the assembler's order -----------------------------------------------------------------------


def test_an_assembler_starts_once_and_first() -> None:
    assembler = ScopeAssembler({"assets": services(2)})
    assembler.start()
    with refused(AssertionError, "start() comes first, once"):
        assembler.start()


def test_an_assembler_adds_pages_only_between_start_and_finish() -> None:
    before = ScopeAssembler({"assets": services(2)})
    with refused(AssertionError, "add() goes between start() and finish()"):
        before.add(services(1, 3))
    after = ScopeAssembler({"assets": services(2)})
    after.start()
    after.finish()
    with refused(AssertionError, "add() goes between start() and finish()"):
        after.add(services(1, 3))
    whole = ScopeAssembler({"targets": ["h"]})
    whole.start()
    with refused(AssertionError, "add() goes between start() and finish()"):
        whole.add(services(1))


def test_an_assembler_finishes_after_it_started() -> None:
    with refused(AssertionError, "finish() comes after start()"):
        ScopeAssembler({"assets": services(2)}).finish()


def test_a_scope_not_assembled_to_its_end_is_a_mismatch() -> None:
    paged = page_scope({"assets": services(2)})
    assembler = ScopeAssembler(paged.inline)
    assembler.start()
    with refused(ScopeMismatch, "the scope was not assembled to its end"):
        assembler.check(paged.ref)


# --- the reference a task records ----------------------------------------------------------------


def test_a_reference_written_before_omitted_assets_were_counted_omits_none() -> None:
    ref = ScopeRef.from_json({"sha256": "ab" * 32, "bytes": 10, "assets": 3, "pages": 2})
    assert ref == ScopeRef("ab" * 32, 10, 3, 2, 0)


def test_a_task_event_records_the_whole_scope_s_reference_and_gives_it_back() -> None:
    paged = page_scope({"targets": ["h"], "assets": services(5_000)}, omitted=4)
    created = create(paged)
    assert scope_ref_of(created) == paged.ref == ScopeRef(paged.ref.sha256, paged.ref.size, 5_000, 4, 4)
    assert created.scope == paged.inline


def test_a_scope_with_assets_left_out_but_no_asset_list_has_no_pages() -> None:
    paged = page_scope({"targets": ["h"]}, omitted=2)
    created = create(paged)
    assert (created.scope_assets, created.scope_pages, created.scope_assets_omitted) == (None, (), 2)
    assert scope_ref_of(created) == paged.ref == ScopeRef(paged.ref.sha256, paged.ref.size, None, 0, 2)


def test_a_whole_inline_scope_has_no_reference_and_neither_has_half_a_one() -> None:
    created = create({"targets": ["h"], "assets": services(3)})
    assert scope_ref_of(created) is None
    assert scope_ref_of(created.model_copy(update={"scope_sha256": "ab" * 32, "scope_assets": 3})) is None
    assert scope_ref_of(created.model_copy(update={"scope_bytes": 10, "scope_assets": 3})) is None
    whole = created.model_copy(update={"scope_sha256": "ab" * 32, "scope_bytes": 10, "scope_assets": 3})
    assert scope_ref_of(whole) == ScopeRef("ab" * 32, 10, 3, 1, 0)


# --- who may read the stored pages ---------------------------------------------------------------


def refusal_details(error: LeaseholdError | None) -> tuple[type[LeaseholdError], str, dict[str, object]] | None:
    return None if error is None else (type(error), error.message, error.details)


def test_the_worker_holding_the_live_lease_may_read_its_task_s_pages() -> None:
    story = running()
    assert read_refusal(story.task, story.attempt, story.token, now=story.now) is None
    assert read_refusal(story.task, story.attempt, story.token, now=story.now + timedelta(seconds=59)) is None


def test_a_read_with_another_token_is_refused_as_a_lost_lease() -> None:
    story = running()
    error = read_refusal(story.task, story.attempt, "cd" * 32, now=story.now)
    assert refusal_details(error) == (LeaseLost, "the lease token does not match this attempt",
                                      {"reason": "bad_token", "attempt_id": str(story.attempt.id)})


def test_a_read_for_a_superseded_attempt_is_refused() -> None:
    story = running()
    old = replace(story.attempt, id=UUID(int=7))
    error = read_refusal(story.task, old, story.token, now=story.now)
    assert refusal_details(error) == (LeaseLost, "this attempt was superseded by a newer one",
                                      {"reason": "superseded", "attempt_id": str(UUID(int=7))})


def test_a_read_after_the_lease_expired_or_the_task_was_cancelled_is_refused() -> None:
    story = running()
    error = read_refusal(story.task, story.attempt, story.token, now=story.now + timedelta(seconds=60))
    assert refusal_details(error) == (LeaseLost, "the lease of this attempt has expired",
                                      {"reason": "lease_expired", "attempt_id": str(story.attempt.id)})
    cancelled = replace(story.task, state="cancelling")
    error = read_refusal(cancelled, story.attempt, story.token, now=story.now)
    assert refusal_details(error) == (TaskWasCancelled, "the task has been cancelled",
                                      {"reason": "cancelled", "attempt_id": str(story.attempt.id)})


def test_a_read_past_the_execution_deadline_is_refused() -> None:
    story = running()
    attempt = replace(story.attempt, deadline_at=story.now)
    task = replace(story.task, current_attempt=attempt)
    error = read_refusal(task, attempt, story.token, now=story.now)
    assert refusal_details(error) == (DeadlineExceeded, "the task's execution deadline has passed",
                                      {"reason": "deadline_passed", "attempt_id": str(attempt.id)})
