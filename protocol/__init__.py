"""What the Gateway and the worker agent share: the log line format and the resolution of a
scope's target names (and nothing that needs the server's dependencies).

Both sides import it; it imports only :mod:`leasehold.domain` of ours, so the agent still installs
and runs without the server (``make lint`` checks both directions).
"""
