"""The in-memory interpreter of row changes (projections/memory.py), which replay rebuilds use:
it must do exactly what the live SQL does with the same Insert / Upsert / Update values."""

from __future__ import annotations

import pytest

from leasehold.projections.memory import MemoryTables, ProjectionError
from leasehold.projections.rows import PRIMARY_KEYS, TABLE_ORDER, Insert, Update, Upsert


def test_every_projected_table_starts_empty() -> None:
    assert MemoryTables().tables == {table: {} for table in PRIMARY_KEYS}
    assert TABLE_ORDER == tuple(PRIMARY_KEYS)


def test_an_insert_stores_a_copy_of_the_row_under_its_primary_key() -> None:
    tables = MemoryTables()
    row = {"id": 1, "name": "acme"}
    tables.apply([Insert("organizations", row)])
    row["name"] = "changed afterwards"
    assert tables.tables["organizations"] == {(1,): {"id": 1, "name": "acme"}}


def test_a_second_insert_of_the_same_key_is_a_broken_log() -> None:
    tables = MemoryTables()
    tables.apply([Insert("organizations", {"id": 1, "name": "a"})])
    with pytest.raises(ProjectionError, match=r"duplicate organizations row \(1,\)"):
        tables.apply([Insert("organizations", {"id": 1, "name": "b"})])
    assert tables.tables["organizations"][(1,)]["name"] == "a"


def test_an_upsert_inserts_then_overwrites_only_its_non_key_columns() -> None:
    tables = MemoryTables()
    key = ("organization_id", "worker_id")
    tables.apply([Upsert("organization_workers", key, {"organization_id": 1, "worker_id": 2, "enabled": True})])
    stored = tables.tables["organization_workers"][(1, 2)]
    stored["created_at"] = "kept"  # a column the upsert does not name
    tables.apply([Upsert("organization_workers", key, {"organization_id": 1, "worker_id": 2, "enabled": False})])
    assert tables.tables["organization_workers"] == {
        (1, 2): {"organization_id": 1, "worker_id": 2, "enabled": False, "created_at": "kept"}}


def test_an_upsert_keeps_its_own_row_apart_from_the_callers() -> None:
    tables = MemoryTables()
    row = {"organization_id": 1, "worker_id": 2, "enabled": True}
    tables.apply([Upsert("organization_workers", ("organization_id", "worker_id"), row)])
    row["enabled"] = False
    assert tables.tables["organization_workers"][(1, 2)]["enabled"] is True


def test_an_update_sets_its_values_on_the_keyed_row_only() -> None:
    tables = MemoryTables()
    tables.apply([Insert("scans", {"id": 1, "status": "pending", "version": 1}),
                  Insert("scans", {"id": 2, "status": "pending", "version": 1}),
                  Update("scans", {"id": 1}, {"status": "running", "version": 2})])
    assert tables.tables["scans"] == {(1,): {"id": 1, "status": "running", "version": 2},
                                      (2,): {"id": 2, "status": "pending", "version": 1}}


def test_an_update_of_a_missing_row_changes_nothing_like_sql() -> None:
    tables = MemoryTables()
    tables.apply([Update("scans", {"id": 1}, {"status": "running"})])
    assert tables.tables["scans"] == {}


def test_a_guarded_update_applies_only_while_the_guard_holds() -> None:
    tables = MemoryTables()
    guard = (("status", ("pending", "queued")),)
    tables.apply([Insert("scans", {"id": 1, "status": "queued"}),
                  Update("scans", {"id": 1}, {"status": "running"}, guard=guard),
                  Update("scans", {"id": 1}, {"status": "other"}, guard=guard)])
    assert tables.tables["scans"][(1,)]["status"] == "running"


def test_a_guard_on_null_matches_a_null_column() -> None:
    tables = MemoryTables()
    guard = (("cancel_requested_at", (None,)),)
    tables.apply([Insert("worker_tasks", {"id": 1, "cancel_requested_at": None}),
                  Update("worker_tasks", {"id": 1}, {"cancel_requested_at": 5}, guard=guard),
                  Update("worker_tasks", {"id": 1}, {"cancel_requested_at": 6}, guard=guard)])
    assert tables.tables["worker_tasks"][(1,)]["cancel_requested_at"] == 5


def test_every_guard_of_an_update_must_hold() -> None:
    tables = MemoryTables()
    tables.apply([Insert("scans", {"id": 1, "status": "pending", "mode": "legacy"}),
                  Update("scans", {"id": 1}, {"status": "running"},
                         guard=(("status", ("pending",)), ("mode", ("gateway",))))])
    assert tables.tables["scans"][(1,)]["status"] == "pending"


def test_a_composite_key_identifies_the_row() -> None:
    tables = MemoryTables()
    key = ("organization_id", "worker_id")
    tables.apply([Upsert("organization_workers", key, {"organization_id": 1, "worker_id": 2, "enabled": True}),
                  Upsert("organization_workers", key, {"organization_id": 1, "worker_id": 3, "enabled": True}),
                  Update("organization_workers", {"organization_id": 1, "worker_id": 3}, {"enabled": False})])
    assert {k: r["enabled"] for k, r in tables.tables["organization_workers"].items()} == {
        (1, 2): True, (1, 3): False}


def test_a_change_to_an_unknown_table_is_refused() -> None:
    with pytest.raises(KeyError):
        MemoryTables().apply([Insert("no_such_table", {"id": 1})])
