"""The `leasehold` command and the development environment it manages (embedded PostgreSQL,
development CA, demo). Nothing imports it."""
