"""The replay tools on a log with execution modes, stored profiles, legacy progress and a legacy
scan handed over to the Gateway: ``replay rebuild`` into a fresh schema equals the live tables
(``stored_profiles`` and the new ``scans``/``organizations`` columns included), ``replay verify``
finds nothing, and a scan's timeline tells the new events."""

from __future__ import annotations

import orjson
import psycopg
from replay_support import cli, cli_json

from leasehold.domain.events import ProfileStep
from leasehold.domain.legacy import parse_message
from support.core import World

STEPS = (ProfileStep(task_type="probe", lease_seconds=45), ProfileStep(task_type="probe", stop_on_failure=False))


async def test_rebuild_and_verify_cover_modes_and_stored_profiles(world: World, database_url: str) -> None:
    profiles = world.services.profiles
    legacy = world.services.legacy
    shared = await profiles.create(None, name="baseline", steps=STEPS)
    own = await profiles.create(world.org, name="weekly", steps=STEPS, gateway_execution=False)
    await profiles.replace(shared, STEPS[:1])
    await world.scans.create_scan(world.org, {"targets": ["a"]}, profile_name="baseline")
    recorded = await world.scans.create_scan(world.org, {"targets": ["b"]}, profile_name="weekly")
    await profiles.set_gateway_execution(own, True)
    await profiles.delete(own)
    await world.registry.set_gateway_execution(world.org, False)
    reported = await world.scans.create_scan(world.org, {"targets": ["c"]}, profile=STEPS)
    await legacy.record_status(reported, "running")
    await legacy.record_status(reported, "failed")
    await world.registry.set_gateway_execution(world.org, True)
    message = parse_message(orjson.dumps({"scan_id": str(recorded), "organization_id": str(world.org),
                                          "targets": ["b"], "steps": ["probe"]}))
    converted = await legacy.convert(message)
    assert converted.outcome == "converted" and converted.handed_over == recorded

    url = ("--database-url", database_url)
    code, report = await cli_json("replay", "rebuild", "--schema", "modes_copy", *url)
    assert code == 0, report
    assert report["rows"]["stored_profiles"] == 2
    code, verified = await cli_json("replay", "verify", "--schema", "modes_copy", *url)
    assert (code, verified["differences"]) == (0, [])
    code, verified = await cli_json("replay", "verify", *url)
    assert (code, verified["differences"]) == (0, [])
    with psycopg.connect(database_url) as conn:
        for table in ("organizations", "stored_profiles", "scans", "scan_jobs"):
            for a, b in (("public", "modes_copy"), ("modes_copy", "public")):
                extra = conn.execute(f"SELECT count(*) FROM (SELECT * FROM {a}.{table}"  # noqa: S608
                                     f" EXCEPT SELECT * FROM {b}.{table}) d").fetchone()
                assert extra == (0,), (table, a, b)

    code, out, err = await cli("replay", "timeline", "--scan", str(recorded), *url)
    assert code == 0, err
    for fact in ("legacy scan", "ScanOriginRecorded", "ScanHandedOver"):
        assert fact in out, (fact, out)

    async def scan_story(scan_id: object) -> list[tuple[str, str | None, str | None, str]]:
        code, timeline = await cli_json("replay", "timeline", "--scan", str(scan_id), *url)
        assert code == 0, timeline
        return [(e["event"], e["state_before"], e["state_after"], e["summary"])
                for e in timeline["events"] if e["stream"] == "scan"]

    handed = [e for e in await scan_story(recorded) if e[0] == "ScanHandedOver"]
    assert handed == [("ScanHandedOver", "pending", "cancelled",
                       f"handed over to Gateway scan {str(converted.scan_id)[:8]}; 2 legacy jobs cancelled")]
    reports = [e[1:] for e in await scan_story(reported) if e[0] == "LegacyScanStatusRecorded"]
    assert reports == [("pending", "running", "legacy side reports: running"),
                       ("running", "failed", "legacy side reports: failed")]
