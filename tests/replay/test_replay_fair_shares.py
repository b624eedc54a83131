"""``leasehold replay verify-fair-shares``: ``org_service`` (the acquire's fair-share state, kept
under each organisation's row lock, not a projection) held against what the lease events recorded,
through the command line an auditor uses."""

from __future__ import annotations

from replay_support import cli_json, random_workload, tamper

from support.core import World


async def test_an_empty_database_has_nothing_to_verify(database_url: str) -> None:
    code, report = await cli_json("replay", "verify-fair-shares", "--database-url", database_url)
    assert (code, report["ok"], report["empty"], report["differences"]) == (1, False, True, [])


async def test_the_fair_share_state_of_a_busy_log_agrees_and_a_drift_is_named(world: World,
                                                                              database_url: str) -> None:
    await random_workload(world, seed=7, rounds=6, settle=True)
    code, report = await cli_json("replay", "verify-fair-shares", "--database-url", database_url)
    assert (code, report["ok"], report["differences"]) == (0, True, [])
    assert report["organizations"] >= 1
    tamper(database_url, "UPDATE org_service SET served = served + 1"
                         " WHERE organization_id = (SELECT organization_id FROM org_service"
                         " ORDER BY organization_id LIMIT 1)")
    code, report = await cli_json("replay", "verify-fair-shares", "--database-url", database_url)
    assert (code, report["ok"]) == (1, False)
    (difference,) = report["differences"]
    assert "org_service holds" in difference
