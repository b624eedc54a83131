"""Slow clients in a process of their own (so that their TLS work does not slow down the Gateway
under test): ``python -m support.slow_clients --port P --count N --ca CA [--cert C --key K]``.

Opens ``N`` connections to 127.0.0.1:P, a third each of: ``idle`` (TLS handshake, then nothing),
``drip`` (TLS, then a request header a byte every 0.2 s, never finished) and ``raw`` (TCP only,
no TLS handshake); waits until the server has closed every one (or ``--give-up`` seconds), and
prints one JSON line per connection: its kind and how long it lived from the TCP accept on.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import socket
import ssl
import sys
import time

KINDS = ("idle", "drip", "raw")


async def one(kind: str, port: int, ctx: ssl.SSLContext, out: list[dict[str, object]]) -> None:
    sock = socket.socket()
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
    opened = time.monotonic()
    writer = None
    try:
        if kind == "raw":
            reader, writer = await asyncio.open_connection(sock=sock)
        else:
            reader, writer = await asyncio.open_connection(sock=sock, ssl=ctx, server_hostname="localhost")
        if kind == "drip":
            writer.write(b"POST /v1/tasks/acquire HTTP/1.1\r\nHost: localhost\r\n")

            async def drip() -> None:
                while True:
                    await asyncio.sleep(0.2)  # what a dripping client does: a byte now and then
                    writer.write(b"X")  # a header line that never ends
                    await writer.drain()

            dripping = asyncio.create_task(drip())
            try:
                await reader.read()
            finally:
                dripping.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await dripping
        else:
            await reader.read()
    except (OSError, ssl.SSLError, asyncio.IncompleteReadError):
        pass
    finally:
        out.append({"kind": kind, "lived": time.monotonic() - opened})
        if writer is not None:
            writer.close()


async def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--count", type=int, required=True)
    p.add_argument("--ca", required=True)
    p.add_argument("--cert")
    p.add_argument("--key")
    p.add_argument("--give-up", type=float, default=60)
    args = p.parse_args(argv)
    ctx = ssl.create_default_context(cafile=args.ca)
    if args.cert:
        ctx.load_cert_chain(args.cert, args.key)
    out: list[dict[str, object]] = []
    tasks = [asyncio.create_task(one(KINDS[i % 3], args.port, ctx, out)) for i in range(args.count)]
    done, pending = await asyncio.wait(tasks, timeout=args.give_up)
    for task in pending:
        task.cancel()
    for line in out:
        print(json.dumps(line))
    print(json.dumps({"still_open": len(pending)}))
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1:])))
