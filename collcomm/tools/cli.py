"""The ``collcomm`` command line: ``collcomm <command> ...`` (also ``python -m collcomm``).

Each command is one ``_add_<name>_command(subparsers)`` function that adds its parser and
sets ``func`` (a callable taking the parsed arguments and returning the exit code); to add
a command, write such a function and list it in ``_COMMANDS``.

    collcomm run -n 4 train.py --lr 0.1          # 4 ranks on this machine
    collcomm run -n 4 python train.py --lr 0.1   # the same
    collcomm run -n 4 -m mypkg.train             # a module instead of a script
    collcomm run -n 2 ./a.out                    # any executable
    COLLCOMM_TOKEN=<secret> collcomm run -n 8 --nnodes 2 --node-rank 0 \\
        --master-addr node0 --master-port 29500 train.py   # (and --node-rank 1 on node1)
"""
from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from ..errors import CollcommError

__all__ = ["main", "build_parser"]


def _add_run_command(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "run", help="launch N ranks of a program",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Launch N ranks of a program on this node: a Python script "
                    "(prog.py, or 'python prog.py'), a module (-m pkg.mod) or any executable "
                    "(./binary, or anything with --no-python). Rank output is prefixed with "
                    "[rank]. When a rank fails the others are stopped, the summary names the "
                    "rank that caused it, and the launcher exits with that rank's code.",
        epilog="torchrun's and mpiexec's spellings work too: --nproc_per_node, --nnodes, "
               "--node_rank, --master_addr, --master_port, -np.\n"
               "Every rank gets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, "
               "MASTER_ADDR,\nMASTER_PORT (free for the program, e.g. torch's env:// store), "
               "COLLCOMM_STORE (collcomm's store),\nCOLLCOMM_TOKEN and COLLCOMM_JOB_ID. "
               "COLLCOMM_DEBUG=1 shows full tracebacks in the summary.")
    p.add_argument("-n", "-np", "--nproc-per-node", "--nproc_per_node", dest="nproc", type=int,
                   required=True, metavar="N", help="ranks on this node")
    p.add_argument("--nnodes", type=int, default=1, help="number of nodes (default 1)")
    p.add_argument("--node-rank", "--node_rank", dest="node_rank", type=int, default=0,
                   help="this node's index (default 0)")
    p.add_argument("--master-addr", "--master_addr", dest="master_addr", default="127.0.0.1",
                   help="address of node 0, where the store runs (default 127.0.0.1)")
    p.add_argument("--master-port", "--master_port", dest="master_port", type=int, default=0,
                   help="MASTER_PORT given to the ranks (default: a free port; required with "
                        "--nnodes > 1); collcomm's store uses --store-port")
    p.add_argument("--store-port", "--store_port", dest="store_port", type=int, default=0,
                   help="port of collcomm's store on node 0 (default: --master-port + 1, or a "
                        "free port on one node)")
    p.add_argument("--no-prefix", dest="prefix", action="store_false",
                   help="pass rank output through without the [rank] prefix (still whole lines)")
    p.add_argument("--grace", type=float, default=3.0,
                   help="seconds between SIGTERM and SIGKILL when stopping ranks (default 3)")
    p.add_argument("-m", dest="module", action="store_true",
                   help="the program is a module name (like python -m)")
    p.add_argument("--no-python", "--no_python", dest="python", action="store_false",
                   help="run the program as it is, not through the Python interpreter")
    p.add_argument("--trace", metavar="DIR", default=None,
                   help="Chrome traces of every call to DIR, merged into DIR/trace.json at the end")
    p.add_argument("program", nargs=argparse.REMAINDER,
                   help="script, 'python script', module (with -m) or executable, and its "
                        "arguments; '--' may precede it")
    p.set_defaults(func=_run_command)


def _run_command(args: argparse.Namespace) -> int:
    from .launcher import LaunchConfig, launch

    program = list(args.program)
    if program and program[0] == "--":
        program = program[1:]
    if not program:
        print("collcomm run: missing the program to run", file=sys.stderr)
        return 2
    cfg = LaunchConfig(nproc=args.nproc, program=program[0], args=program[1:],
                       module=args.module, python=args.python, nnodes=args.nnodes,
                       node_rank=args.node_rank, master_addr=args.master_addr,
                       master_port=args.master_port, store_port=args.store_port,
                       prefix=args.prefix, grace=args.grace, trace=args.trace)
    return launch(cfg)


def _add_bench_command(subparsers: argparse._SubParsersAction) -> None:
    from .bench.options import HELP_EPILOG, add_arguments

    p = subparsers.add_parser(
        "bench", help="benchmark collectives (nccl-tests / OSU style; vs MPI and Gloo)",
        description="Benchmark collcomm collectives over a size sweep, in nccl-tests columns "
                    "(or OSU latency columns), optionally side by side with mpi4py/Open MPI "
                    "and torch Gloo. Launches -n ranks itself, or runs in place inside a "
                    "launched job (RANK and WORLD_SIZE set).",
        epilog=HELP_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    p.set_defaults(func=_bench_command)


def _bench_command(args: argparse.Namespace) -> int:
    if args.calibrate:
        from .bench.calibrate import calibrate, format_model

        print(format_model(calibrate(args.save)))
        return 0
    from .bench.options import options_from_args
    from .bench.runner import main as bench_main

    try:
        opts = options_from_args(args)
    except ValueError as exc:
        print(f"collcomm bench: error: {exc}", file=sys.stderr)
        return 2
    return bench_main(opts)


def _add_trace_command(subparsers: argparse._SubParsersAction) -> None:
    from .trace import add_command   # collcomm trace analyze|merge DIR

    add_command(subparsers)


def _add_explain_command(subparsers: argparse._SubParsersAction) -> None:
    from .explain import add_command   # collcomm explain OP --algo A -n N

    add_command(subparsers)


_COMMANDS: list[Callable[[argparse._SubParsersAction], None]] = [
    _add_run_command, _add_bench_command, _add_trace_command, _add_explain_command]


def build_parser() -> argparse.ArgumentParser:
    from .. import __version__

    parser = argparse.ArgumentParser(prog="collcomm", description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"collcomm {__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="command")
    for add in _COMMANDS:
        add(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` (default ``sys.argv[1:]``), run the command, return its exit code."""
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except CollcommError as exc:
        print(f"collcomm {args.command}: error: {exc}", file=sys.stderr)
        return 2
