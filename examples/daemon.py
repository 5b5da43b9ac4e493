"""A small daemon built on pylock's daemon kit.

    python examples/daemon.py --data DIR [--takeover GRACE] [--metrics-port PORT]

1. pylock.singleton_async(directory=DIR): one instance per data directory,
   taken before anything destructive.  A second start is refused naming the
   first; with --takeover GRACE the first is sent SIGTERM, awaited (no
   polling), killed after GRACE seconds if it lingers, and replaced.
2. Crash recovery, safe because we are the only instance: leftover
   DIR/*.partial files of a killed predecessor are removed.
3. pylock.claim_unix_socket(DIR/daemon.sock, or --socket): a live listener is refused, a
   dead socket file left by a killed predecessor is replaced.  Clients send
   "ping" and get "pong <pid>".
4. Metrics: pylock.metrics counts the daemon's locks; with --metrics-port,
   pylock.bind_port serves them over HTTP (/metrics, Prometheus text format
   when prometheus_client is installed, else JSON).

SIGTERM (from systemd, or from a successor's takeover) and Ctrl-C stop it
cleanly, and so does an error or a closed stdout: the socket is removed and the
singleton let go of, never left to the next instance to clean up.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
from pathlib import Path

import pylock
from pylock import metrics


def recover(data: Path) -> int:
    """Remove what an interrupted predecessor left half-written."""
    removed = 0
    for leftover in data.glob("*.partial"):
        leftover.unlink()
        removed += 1
    return removed


def metrics_text() -> tuple[bytes, str]:
    try:
        import prometheus_client
    except ImportError:
        body = {name: s.__dict__ for name, s in metrics.snapshot().items()}
        return json.dumps(body, indent=1).encode(), "application/json"
    return prometheus_client.generate_latest(), prometheus_client.CONTENT_TYPE_LATEST


async def serve_client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    async for line in reader:
        if line.strip() == b"ping":
            writer.write(f"pong {os.getpid()}\n".encode())
            await writer.drain()
    writer.close()


async def serve_metrics(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    request = await reader.readline()
    while (await reader.readline()).strip():
        pass  # the headers
    if request.split()[1:2] == [b"/metrics"]:
        body, kind = metrics_text()
        head = f"HTTP/1.0 200 OK\r\nContent-Type: {kind}\r\nContent-Length: {len(body)}\r\n\r\n"
    else:
        body, head = b"", "HTTP/1.0 404 Not Found\r\nContent-Length: 0\r\n\r\n"
    writer.write(head.encode() + body)
    await writer.drain()
    writer.close()


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    parser.add_argument("--data", type=Path, required=True, help="the data directory (made if new)")
    parser.add_argument("--takeover", type=float, metavar="GRACE", help="replace a running one")
    parser.add_argument("--metrics-port", type=int, help="serve /metrics on 127.0.0.1:PORT")
    parser.add_argument("--socket", type=Path, help="the unix socket (default: DATA/daemon.sock)")
    return parser.parse_args()


def enable_metrics() -> None:
    metrics.enable()
    try:
        import prometheus_client

        metrics.register()
        del prometheus_client
    except ImportError:
        pass


async def serve(args: argparse.Namespace, stop: asyncio.Event) -> None:
    """Serve as the one instance until stop is set; whatever ends it (stop,
    an error, a closed stdout) removes our socket and closes what we opened."""
    removed = recover(args.data)
    socket_path = args.socket or args.data / "daemon.sock"
    listener = pylock.claim_unix_socket(socket_path, mode=0o660)
    port_socket = None
    servers: list[asyncio.Server] = []
    try:
        servers.append(await asyncio.start_unix_server(serve_client, sock=listener))
        if args.metrics_port:
            port_socket = pylock.bind_port(args.metrics_port, "127.0.0.1")
            servers.append(await asyncio.start_server(serve_metrics, sock=port_socket))
        metrics_url = f" metrics=http://127.0.0.1:{args.metrics_port}/metrics"
        print(
            f"ready pid={os.getpid()} recovered={removed} socket={socket_path}"
            + (metrics_url if port_socket else ""),
            flush=True,
        )
        await stop.wait()
    finally:
        # In reverse: stop serving, remove our socket, and (in main) let go of
        # the singleton last, so a successor never sees our socket while we run.
        for server in servers:
            server.close()
        if port_socket is not None:
            port_socket.close()
        listener.close()
        socket_path.unlink(missing_ok=True)


async def main() -> int:
    args = parse_args()
    enable_metrics()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    try:
        args.data.mkdir(parents=True, exist_ok=True)
        instance = await pylock.singleton_async(
            directory=args.data, takeover=args.takeover, info={"service": "example-daemon"}
        )
    except pylock.LockHeld as exc:
        print(f"daemon: already running: {exc}", file=sys.stderr)
        return 75  # EX_TEMPFAIL
    except (pylock.LockError, OSError) as exc:
        print(f"daemon: cannot start: {exc}", file=sys.stderr)
        return 1
    try:
        await serve(args, stop)
    except BrokenPipeError:
        # Whoever read our stdout went away: nothing more can be said, and the
        # interpreter must not fail flushing it at exit either.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except (pylock.LockError, OSError) as exc:
        print(f"daemon: stopped: {exc}", file=sys.stderr)
        return 1
    finally:
        instance.close()
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
