"""The service layer: one transaction per command, usable without HTTP.

Every command follows the same steps: lock the rows it touches, decide with pure domain code,
append the events (with their hash chain) and apply their projections, commit. Errors are
:mod:`domain.errors`; psycopg errors are translated in :mod:`persistence.transaction`.

One module per concept: ``lifecycle`` (worker tasks), ``scans`` (scan orchestration),
``registry`` (organisations, workers, assignments, API keys), ``schedules``, ``profiles``,
``legacy`` (legacy-executed scans), ``ingestion`` (result records), ``wakeups`` (NOTIFY topics).
The Gateway and the command line build them once, in :mod:`gateway.services`.
"""
