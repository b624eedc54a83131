"""Alembic migrations for leasehold: ``env.py``, the revision template and ``versions/``.

Use :mod:`migrations.runner` (or ``leasehold migrate``) rather than the ``alembic`` CLI; the
``alembic.ini`` at the repository root exists for ad-hoc ``alembic -x url=... history`` use.
"""
