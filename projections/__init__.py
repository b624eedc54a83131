"""Projections: read models and database plumbing for leasehold."""
