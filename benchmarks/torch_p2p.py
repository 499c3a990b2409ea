"""Small-message point-to-point latency through ``torch.distributed`` on the collcomm backend.

    collcomm run -n 2 --no-prefix python benchmarks/torch_p2p.py [--blocks 7] [--iters 1000]
    collcomm run -n 2 --no-prefix python benchmarks/torch_p2p.py --backend gloo

Two ranks, 8-byte float32 tensors (``--bytes``). Modes, timed in interleaved blocks (the
order turning every block, so every mode sees the same machine load; on a shared machine
only ratios mean much); per mode the median [min] over blocks of the slower rank's µs:

* ``send/recv``: ``dist.send`` / ``dist.recv`` ping-pong, one-way time (half a round trip);
* ``isend/irecv+wait``: the same with ``dist.isend(...).wait()`` / ``dist.irecv(...).wait()``;
* ``batch_isend_irecv``: both ranks ``batch_isend_irecv([isend, irecv])`` and wait both
  (an exchange: the whole exchange's time);
* ``recv any source``: rank 1 sends, rank 0 ``dist.recv(t)`` without ``src``, then answers
  (one-way time).

``--backend gloo`` runs the same modes on torch's Gloo backend (the launcher's environment
gives both their rendezvous) for a side-by-side reference.
"""
from __future__ import annotations

import argparse
from typing import Any, Callable

from p2p_latency import _run      # the interleaved blocks, the same table (this folder)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--blocks", type=int, default=7)
    ap.add_argument("--iters", type=int, default=1000)
    ap.add_argument("--bytes", type=int, default=8)
    ap.add_argument("--backend", default="collcomm")
    args = ap.parse_args()

    import torch
    import torch.distributed as dist

    if args.backend == "collcomm":
        import collcomm.torch  # noqa: F401 - registers the backend
    dist.init_process_group(args.backend)
    me, n = dist.get_rank(), dist.get_world_size()
    if n != 2:
        raise SystemExit("run with -n 2")
    other = 1 - me
    s = torch.zeros(max(1, args.bytes // 4), dtype=torch.float32)
    r = torch.zeros_like(s)

    def pingpong(send: Callable[[], Any], recv: Callable[[], Any]) -> Callable[[], None]:
        def first() -> None:
            send()
            recv()

        def second() -> None:
            recv()
            send()
        return first if me == 0 else second

    def batch() -> None:
        for w in dist.batch_isend_irecv([dist.P2POp(dist.isend, s, other),
                                         dist.P2POp(dist.irecv, r, other)]):
            w.wait()

    def any_source() -> None:
        if me == 0:
            dist.recv(r)
            dist.send(s, other)
        else:
            dist.send(s, other)
            dist.recv(r, other)

    modes: dict[str, tuple[Callable[[], None], int]] = {
        "send/recv": (pingpong(lambda: dist.send(s, other), lambda: dist.recv(r, other)), 2),
        "isend/irecv+wait": (pingpong(lambda: dist.isend(s, other).wait(),
                                      lambda: dist.irecv(r, other).wait()), 2),
        "batch_isend_irecv": (batch, 1),
        "recv any source": (any_source, 2),
    }
    worst = torch.zeros(1, dtype=torch.float64)

    def maxall(mine: float) -> float:
        worst[0] = mine
        dist.all_reduce(worst, op=dist.ReduceOp.MAX)
        return float(worst[0])

    _run(modes, args, me, dist.barrier, maxall, f"torch_p2p {args.backend}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
