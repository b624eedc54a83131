"""Scanner plugins run by the worker as `python -m leasehold.worker.plugins.<name>` subprocesses.

Each plugin reads one JSON document on stdin and writes JSON-lines records on stdout; see
:mod:`worker.plugins.common` for the protocol.
"""
