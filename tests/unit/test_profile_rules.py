"""Stored profiles and execution modes (domain/profiles.py): the flags' precedence, profile names,
and the stored profile's commands."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from uuid import UUID

import pytest

from leasehold.domain import profiles
from leasehold.domain.errors import InvalidRequest
from leasehold.domain.events import (
    OrganizationGatewayExecutionSet,
    ProfileDeleted,
    ProfileGatewayExecutionSet,
    ProfileReplaced,
    ProfileStep,
)
from leasehold.domain.profiles import StoredProfileState, execution_mode
from support.refusals import refused

NOW = datetime(2030, 1, 1, tzinfo=UTC)
PID, ORG = UUID(int=1), UUID(int=2)
STEPS = (ProfileStep(task_type="probe"),)
PROFILE = StoredProfileState(id=PID, version=3, organization_id=ORG, name="default", steps=STEPS,
                             gateway_execution=True)


def test_precedence_table() -> None:
    """Gateway iff the organisation's flag is on and the stored profile (if any) does not say off."""
    assert [execution_mode(org, profile) for org in (True, False) for profile in (None, True, False)] == [
        "gateway", "gateway", "legacy", "legacy", "legacy", "legacy"]


@pytest.mark.parametrize("name", ["a", "default profile", "x" * 100, "é-ü"])
def test_a_profile_name_has_visible_ends_and_at_most_a_hundred_characters(name: str) -> None:
    assert profiles.check_name(name) == name


@pytest.mark.parametrize("name", ["", " a", "a ", "x" * 101, "\ta", "a\n"])
def test_a_profile_name_out_of_bounds_is_refused(name: str) -> None:
    with refused(InvalidRequest, "a profile name has 1..100 characters and no white space at either end"):
        profiles.check_name(name)


def test_store_records_a_profile_checked_and_gateway_executed_by_default() -> None:
    event = profiles.store(PID, None, name="global", steps=list(STEPS), now=NOW, actor="admin")
    assert (event.originator_id, event.originator_version, event.organization_id, event.name) == (
        PID, 1, None, "global")
    assert (event.steps, event.gateway_execution, event.timestamp, event.actor) == (STEPS, True, NOW, "admin")
    own = profiles.store(PID, ORG, name="p", steps=STEPS, gateway_execution=False, now=NOW, actor="op")
    assert (own.organization_id, own.gateway_execution) == (ORG, False)
    with pytest.raises(InvalidRequest, match="profile name"):
        profiles.store(PID, ORG, name=" p", steps=STEPS, now=NOW, actor="op")
    with pytest.raises(InvalidRequest, match="steps"):
        profiles.store(PID, ORG, name="p", steps=(), now=NOW, actor="op")


def test_replacing_the_steps_records_new_ones_and_the_same_ones_again_is_a_no_op() -> None:
    new = [ProfileStep(task_type="dns"), ProfileStep(task_type="probe")]
    (event,) = profiles.replace(PROFILE, new, now=NOW, actor="op")
    assert isinstance(event, ProfileReplaced)
    assert (event.originator_version, event.steps) == (4, tuple(new))
    assert profiles.replace(PROFILE, list(STEPS), now=NOW, actor="op") == []
    with pytest.raises(InvalidRequest):
        profiles.replace(PROFILE, [], now=NOW, actor="op")


def test_a_profiles_flag_changes_only_when_it_differs() -> None:
    assert profiles.set_gateway_execution(PROFILE, True, now=NOW, actor="op") == []
    (event,) = profiles.set_gateway_execution(PROFILE, False, now=NOW, actor="op")
    assert isinstance(event, ProfileGatewayExecutionSet)
    assert (event.originator_version, event.enabled) == (4, False)
    (back,) = profiles.set_gateway_execution(replace(PROFILE, gateway_execution=False), True, now=NOW, actor="op")
    assert isinstance(back, ProfileGatewayExecutionSet) and back.enabled is True


def test_delete_is_the_next_event_of_the_profile() -> None:
    (event,) = profiles.delete(PROFILE, now=NOW, actor="op")
    assert isinstance(event, ProfileDeleted) and (event.originator_version, event.actor) == (4, "op")


def test_an_organisations_flag_changes_only_when_it_differs() -> None:
    assert profiles.set_organization_gateway_execution(ORG, 5, True, True, now=NOW, actor="admin") == []
    (event,) = profiles.set_organization_gateway_execution(ORG, 5, True, False, now=NOW, actor="admin")
    assert isinstance(event, OrganizationGatewayExecutionSet)
    assert (event.originator_id, event.originator_version, event.enabled) == (ORG, 6, False)


def test_the_legacy_executed_refusal_is_a_conflict_of_its_own() -> None:
    error = profiles.LegacyExecuted()
    assert (error.status, error.code) == (409, "legacy-executed")
    assert error.message == "The flags make this scan legacy-executed, and it was asked for Gateway execution."
