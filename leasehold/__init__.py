"""leasehold: a durable, event-sourced task lifecycle for remote scanner workers.

Everything installs under this one name. In the repository each part keeps its own top-level
folder (``domain/``, ``gateway/``, ``worker/``, …, the layout is the dependency rule); the
entries of this folder are links to them, so ``leasehold.domain`` is ``domain/`` whether the
code runs from a checkout, an editable install or a wheel (which holds real copies).
"""
