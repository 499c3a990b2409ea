"""Fault reports: what a rank that dies of an uncaught exception leaves for the launcher.

Under ``collcomm run`` (``COLLCOMM_REPORT`` names a directory), a rank that dies of an
uncaught exception leaves ``rank-<r>.json`` there: one JSON object with "rank", "pid",
"t" (time.monotonic(), comparable between processes of one machine), "type" (the
exception's class), "message", "peers" (the ranks its collcomm error names: ``.peer``,
else the other ranks its message mentions), "reaction" (true when the error is about
another rank: PeerLostError, CommTimeoutError, ClosedError, MismatchError) and
"traceback" (trimmed, see :func:`trimmed_traceback`). In a job of several nodes the rank
also puts it in the launcher's store under FAULT_KEY. The launchers read these to name
the root cause of a failed job; the rank's own stderr gets the exception's last line only,
the trimmed traceback is printed once, in the launcher's summary.
"""
from __future__ import annotations

import json
import os
import re
import sys
import time
import traceback
from typing import Any

from ..errors import ClosedError, CollcommError, CommTimeoutError, MismatchError, PeerLostError
from ..helper_thread import run_with_patience
from ..rendezvous.auth import job_token

REPORT_ENV = "COLLCOMM_REPORT"
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_REACTIONS = (PeerLostError, CommTimeoutError, ClosedError, MismatchError)


def debug_enabled() -> bool:
    return os.environ.get("COLLCOMM_DEBUG", "") not in ("", "0")


def _next_in_chain(exc: BaseException) -> BaseException | None:
    if exc.__cause__ is not None:
        return exc.__cause__
    return None if exc.__suppress_context__ else exc.__context__


def _collcomm_error(exc: BaseException) -> CollcommError | None:
    """The outermost collcomm error in ``exc``'s chain (``exc`` itself, or what it came from)."""
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        if isinstance(e, CollcommError):
            return e
        seen.add(id(e))
        e = _next_in_chain(e)
    return None


def _format_frames(tb: Any) -> list[str]:
    """User frames as Python prints them; runs of collcomm's own frames folded into one line."""
    out: list[str] = []
    inside = 0
    for frame in traceback.extract_tb(tb):
        if frame.filename.startswith("<frozen "):
            continue
        if frame.filename.startswith(_PACKAGE_DIR):
            inside += 1
            continue
        if inside:
            out.append(f"  [{inside} frame(s) inside collcomm]\n")
            inside = 0
        out.extend(traceback.StackSummary.from_list([frame]).format())
    if inside:
        out.append(f"  [{inside} frame(s) inside collcomm]\n")
    return out


def trimmed_traceback(exc: BaseException) -> str:
    """The traceback a user can act on: their own frames (collcomm's folded into one line)
    and collcomm's message, without the internal errors that message was raised from.
    With ``COLLCOMM_DEBUG=1`` the full traceback."""
    if debug_enabled():
        return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    chain: list[BaseException] = []
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        chain.append(e)
        if isinstance(e, CollcommError):
            break  # what collcomm raised it from is internal
        e = _next_in_chain(e)
    parts: list[str] = []
    for inner, outer in zip(reversed(chain), list(reversed(chain))[1:] + [None]):
        if inner.__traceback__ is not None:
            parts.append("Traceback (most recent call last):\n")
            parts.extend(_format_frames(inner.__traceback__))
        parts.extend(traceback.format_exception_only(type(inner), inner))
        if outer is not None:
            parts.append("\nThe above exception was the direct cause of the following exception:\n\n"
                         if outer.__cause__ is inner else
                         "\nDuring handling of the above exception, another exception occurred:\n\n")
    return "".join(parts)


def fault_report(exc: BaseException, rank: int) -> dict[str, Any]:
    """What :func:`install_fault_report` writes for ``exc`` raised on ``rank``."""
    err = _collcomm_error(exc)
    peers: list[int] = []
    if err is not None:
        peer = getattr(err, "peer", None)
        if isinstance(peer, int) and peer != rank:
            peers = [peer]
        else:
            named = sorted({int(m) for m in re.findall(r"\brank (\d+)\b", str(err))} - {rank})
            peers = named
    return {"rank": rank, "pid": os.getpid(), "t": time.monotonic(),
            "type": type(exc).__name__, "message": str(err if err is not None else exc)[:4000],
            "peers": peers, "reaction": isinstance(err, _REACTIONS),
            "traceback": trimmed_traceback(exc)}


#: Store key of a rank's fault report, for the launchers of the other nodes.
FAULT_KEY = "collcomm/faults/{rank}"


def _publish_report(report: dict[str, Any], wait: float = 0.5) -> None:
    """In a job of several nodes, also put the report in the launcher's store, so the
    launchers of other nodes can follow what this rank named. A fresh, short-lived
    connection on a helper thread, waited for ``wait`` seconds at most: an unreachable store
    (the very fault being reported, maybe) delays this rank's exit by no more."""
    where = os.environ.get("COLLCOMM_STORE", "")
    local = os.environ.get("LOCAL_WORLD_SIZE", "")
    world = os.environ.get("WORLD_SIZE", "")
    if not where or not (local.isdigit() and world.isdigit()) or int(world) <= int(local):
        return

    def send() -> None:
        from ..rendezvous.tcp_client import TCPStore

        try:
            host, _, port = where.rpartition(":")
            store = TCPStore(host.strip("[]"), int(port), timeout=wait, token=job_token(os.environ))
            try:
                store.set(FAULT_KEY.format(rank=report["rank"]), json.dumps(report).encode())
            finally:
                store.close()
        except Exception:  # noqa: BLE001 - best effort
            pass

    run_with_patience(send, "collcomm-fault-report", wait)


def install_fault_report(rank: int) -> None:
    """Under ``collcomm run``, report an uncaught exception to the launcher (see above)."""
    directory = os.environ.get(REPORT_ENV)
    if not directory or getattr(sys.excepthook, "_collcomm_rank", None) == rank:
        return
    previous = sys.excepthook
    if getattr(previous, "_collcomm_rank", None) is not None:
        previous = previous._collcomm_previous  # type: ignore[attr-defined]

    def hook(etype: type[BaseException], exc: BaseException, tb: Any) -> None:
        try:
            report = fault_report(exc, rank)
            path = os.path.join(directory, f"rank-{rank}.json")
            with open(path + ".tmp", "w") as fh:
                json.dump(report, fh)
            os.replace(path + ".tmp", path)
            _publish_report(report)
        except Exception:  # noqa: BLE001 - reporting must never hide the error itself
            previous(etype, exc, tb)
            return
        if previous is not sys.__excepthook__ or debug_enabled():
            previous(etype, exc, tb)
        else:
            sys.stderr.write("".join(traceback.format_exception_only(etype, exc)))
            sys.stderr.flush()

    hook._collcomm_rank = rank  # type: ignore[attr-defined]
    hook._collcomm_previous = previous  # type: ignore[attr-defined]
    sys.excepthook = hook
