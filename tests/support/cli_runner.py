"""Running the ``leasehold`` CLI in-process from tests."""

from __future__ import annotations

import asyncio
import contextlib
import io

from leasehold.cli.main import main


def run_cli(*argv: str) -> tuple[int, str, str]:
    """``leasehold <argv>`` in-process (from a thread when an event loop runs): (exit code, stdout, stderr)."""
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        try:
            code = main(list(argv))
        except SystemExit as exc:  # argparse's usage errors
            code = int(exc.code or 0)
    return code, stdout.getvalue(), stderr.getvalue()


async def cli(*argv: str) -> tuple[int, str, str]:
    """:func:`run_cli` from async code (the CLI runs its own event loop, so in a thread)."""
    return await asyncio.to_thread(run_cli, *argv)
