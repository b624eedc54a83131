"""The pure core of leasehold: events, task and scan state machines, decisions.

Nothing here does I/O, reads a clock or draws random ids: time, ids and randomness are
passed in by the caller, so every decision can be replayed and tested exactly.
"""
