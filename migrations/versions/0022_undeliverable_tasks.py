"""Tasks stored before the input limits: ``undeliverable_tasks`` lists the unfinished ones whose
stored scope or parameters break them, for the Gateway to end on the record.

The Gateway encodes a lease's answer after the acquire commits. A value stored before the input
limits (``domain.limits``) may nest deeper than the encoder goes, or hold an integer no JSON
answer carries, so its lease answer might never be built. This one-off data migration finds every
task that is not over (``completed``, ``failed_terminal``, ``cancelled``) whose stored ``scope`` or
``parameters``

* nests deeper than 32 levels (a container at level 32 of the value, the value itself being
  level 0: ``domain.limits.MAX_FIELD_DEPTH``, frozen here as it was when this ran), or
* holds a number past a double's range (``jsonb`` keeps any; such a number reads as an integer
  past 64 bits, which no JSON answer carries; a smaller one reads as a double and is answered),

and lists it. A migration cannot append events properly (the event codec and the hash chain are
the persistence layer's, above this one), so the listed tasks are ended by the Gateway's own
command path: at startup, before it serves, each listed task gets ``RequestCancel`` with the
reason ``"undeliverable: …"`` (``gateway.commands.lifecycle.undeliverable``), its events
appended and projected, its scan settled, and its row deleted from this table in that same
transaction. A task that ended meanwhile is only taken off the list.

Revision ID: 0022
Revises: 0021
"""

from __future__ import annotations

from alembic import op

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None

#: The listing itself (the tests run it on rows they write past the limits).
LIST = r"""
-- too deep: a container at level 32 (the value is level 0) nests 33 deep, past the limit of 32;
-- too large: a number past a double's range.
INSERT INTO undeliverable_tasks (task_id)
SELECT id
FROM worker_tasks,
     LATERAL (VALUES ('strict $.**{32} ? (@.type() == "object" || @.type() == "array")'::jsonpath,
                      'strict $.** ? (@.type() == "number"'
                      ' && (@ > 1.7976931348623157e308 || @ < -1.7976931348623157e308))'::jsonpath)) AS p (too_deep, too_large)
WHERE state NOT IN ('completed', 'failed_terminal', 'cancelled')
  AND (jsonb_path_exists(scope, too_deep) OR jsonb_path_exists(parameters, too_deep)
       OR jsonb_path_exists(scope, too_large) OR jsonb_path_exists(parameters, too_large))
ON CONFLICT (task_id) DO NOTHING;
"""

UPGRADE = r"""
CREATE TABLE undeliverable_tasks (
    task_id    uuid PRIMARY KEY REFERENCES worker_tasks (id),
    listed_at  timestamptz NOT NULL DEFAULT now()
);
GRANT SELECT, DELETE ON undeliverable_tasks TO leasehold_app;
""" + LIST

DOWNGRADE = r"""
REVOKE ALL ON undeliverable_tasks FROM leasehold_app;
DROP TABLE undeliverable_tasks;
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
