"""Options of ``collcomm bench``: size parsing, the op / dtype / redop tables, the parser.

Sizes follow nccl-tests: ``8``, ``64K``, ``1M``, ``2G`` (powers of 1024; a trailing ``B``
or ``iB`` is accepted, e.g. ``64KiB``). The sweep is ``b, b·f, b·f², ... ≤ e``.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import re
from dataclasses import dataclass, field
from typing import Any

from .placement import check_bytes, parse_offset

OPS = ["all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "gather", "scatter",
       "all_to_all", "barrier", "sendrecv"]
ROOTED = {"broadcast", "reduce", "gather", "scatter"}
REDUCING = {"all_reduce", "reduce", "reduce_scatter"}
#: size is the total over ranks (n × per-rank chunk), as in nccl-tests
TOTAL_SIZED = {"all_gather", "reduce_scatter", "all_to_all", "gather", "scatter"}
REDOPS = ["sum", "prod", "max", "min", "avg"]
DTYPES = {  # numpy name -> nccl-tests type name
    "float32": "float", "float64": "double", "float16": "half", "int8": "int8",
    "uint8": "uint8", "int32": "int32", "int64": "int64",
}
_DTYPE_ALIASES = {"float": "float32", "double": "float64", "half": "float16", "int": "int32",
                  "f32": "float32", "f64": "float64", "f16": "float16"}
LIBS = ["collcomm", "mpi", "gloo"]

_UNITS = {"": 1, "K": 1024, "M": 1024 ** 2, "G": 1024 ** 3}
_SIZE_RE = re.compile(r"^\s*(\d+)\s*([KMG]?)(I?B)?\s*$", re.IGNORECASE)


def parse_size(text: str | int) -> int:
    """``"8"`` -> 8, ``"64K"`` -> 65536, ``"1M"`` -> 1048576, ``"2GiB"`` -> 2**31."""
    if isinstance(text, int):
        if text < 0:
            raise ValueError(f"size must be >= 0, got {text}")
        return text
    m = _SIZE_RE.match(str(text))
    if not m:
        raise ValueError(f"invalid size {text!r}: use a number with an optional K, M or G "
                         f"suffix (e.g. 8, 64K, 1M)")
    return int(m.group(1)) * _UNITS[m.group(2).upper()]


def format_size(nbytes: int) -> str:
    """65536 -> ``"64K"``; non-multiples stay plain bytes."""
    for unit in ("G", "M", "K"):
        if nbytes and nbytes % _UNITS[unit] == 0:
            return f"{nbytes // _UNITS[unit]}{unit}"
    return str(nbytes)


def size_sweep(begin: int, end: int, factor: float) -> list[int]:
    """``begin, begin·factor, ...`` up to ``end`` inclusive (nccl-tests ``-b -e -f``)."""
    if begin < 0 or end < begin:
        raise ValueError(f"need 0 <= -b <= -e, got -b {begin} -e {end}")
    if begin == end:
        return [begin]
    if factor <= 1:
        raise ValueError(f"-f must be > 1, got {factor}")
    if begin == 0:
        begin = 1
    sizes, s = [], float(begin)
    while int(s) <= end:
        if not sizes or int(s) != sizes[-1]:
            sizes.append(int(s))
        s *= factor
    return sizes


def normalize_dtype(name: str) -> str:
    name = name.strip().lower()
    name = _DTYPE_ALIASES.get(name, name)
    if name not in DTYPES:
        raise ValueError(f"unsupported dtype {name!r}; valid: {', '.join(DTYPES)}")
    return name


def parse_ops(text: str) -> list[str]:
    if text == "all":
        return list(OPS)
    ops = [o.strip().lower().replace("-", "_") for o in text.split(",") if o.strip()]
    aliases = {"allreduce": "all_reduce", "allgather": "all_gather", "alltoall": "all_to_all",
               "reducescatter": "reduce_scatter", "bcast": "broadcast"}
    ops = [aliases.get(o, o) for o in ops]
    bad = [o for o in ops if o not in OPS]
    if bad or not ops:
        raise ValueError(f"unknown op {', '.join(bad) or text!r}; valid: {', '.join(OPS)}, all")
    return ops


def parse_compare(text: str | None) -> list[str]:
    if not text:
        return []
    libs = [x.strip().lower() for x in text.split(",") if x.strip()]
    libs = ["mpi" if x in ("mpi4py", "openmpi", "ompi") else x for x in libs]
    libs = ["gloo" if x in ("torch", "torch-gloo") else x for x in libs]
    bad = [x for x in libs if x not in ("mpi", "gloo")]
    if bad:
        raise ValueError(f"--compare: unknown peer {', '.join(bad)}; valid: mpi, gloo")
    return list(dict.fromkeys(libs))


#: ``--api`` front ends, measured as extra libraries next to the functional API ("collcomm")
API_LIBS = {"mpi": "cc-mpi", "torch": "cc-torch"}


def parse_api(text: str | None) -> list[str]:
    """``--api mpi,torch`` → the extra libraries ["cc-mpi", "cc-torch"] ("functional" is
    the default "collcomm" column and adds nothing)."""
    if not text:
        return []
    names = [x.strip().lower() for x in text.split(",") if x.strip()]
    bad = [x for x in names if x not in API_LIBS and x not in ("functional", "collcomm")]
    if bad:
        raise ValueError(f"--api: unknown front end {', '.join(bad)}; valid: functional, mpi, torch")
    return list(dict.fromkeys(API_LIBS[x] for x in names if x in API_LIBS))


def collcomm_env(opts: "Options") -> dict[str, str]:
    """Environment for the collcomm ranks: ``--algo A`` sets ``COLLCOMM_ALGO_<OP>=A`` for
    every benchmarked op (``--algo all_reduce=ring,broadcast=tree`` per op);
    ``--transport`` sets ``COLLCOMM_TRANSPORT``."""
    env = {}
    if opts.algo:
        if "=" in opts.algo:
            for part in opts.algo.split(","):
                op, _, name = part.partition("=")
                env[f"COLLCOMM_ALGO_{op.strip().upper()}"] = name.strip()
        else:
            env.update({f"COLLCOMM_ALGO_{op.upper()}": opts.algo for op in opts.ops})
    if opts.transport:
        env["COLLCOMM_TRANSPORT"] = opts.transport
    return env


def count_for(op: str, nbytes: int, itemsize: int, n: int) -> tuple[int, int]:
    """(total elements reported as ``count``, elements per rank chunk) for a nominal size.

    As in nccl-tests, the size of all_gather / reduce_scatter / all_to_all / gather /
    scatter is the total buffer (n chunks), so the count is rounded down to a multiple
    of n. Barrier moves nothing: (0, 0).
    """
    if op == "barrier":
        return 0, 0
    count = nbytes // itemsize
    if op in TOTAL_SIZED:
        per = count // n
        return per * n, per
    return count, count


@dataclass
class Options:
    """Everything a sweep needs; JSON-serialisable so it travels to the ranks."""

    nproc: int = 2
    ops: list[str] = field(default_factory=lambda: ["all_reduce"])
    sizes: list[int] = field(default_factory=lambda: size_sweep(8, 64 * 1024 ** 2, 2))
    dtype: str = "float32"
    redop: str = "sum"
    root: int = 0
    iters: int = 200
    warmup: int = 5
    min_iters: int = 5
    time_per_size: float = 0.2
    modes: list[str] = field(default_factory=lambda: ["oop", "ip"])
    check: bool = False
    algo: str | None = None
    transport: str | None = None
    alloc: str = "numpy"
    offset: int | None = 0            # buffers' bytes past a page (None: np.empty's own)
    skew: int = 0                     # ... plus this for each rank number
    latency: bool = False
    json_path: str | None = None
    plot_path: str | None = None
    compare: list[str] = field(default_factory=list)
    rounds: int = 2
    interleave: str = "size"          # "size": per-size turns (turns.py); "sweep": whole sweeps
    progress_path: str | None = None
    turns_path: str | None = None     # set by the parent for the ranks of --interleave size
    turns_parent: int | None = None   # the parent's pid (a rank waiting for a turn checks it)
    turn_libs: list[str] = field(default_factory=list)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Options:
        data: dict[str, Any] = json.loads(text)
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


HELP_EPILOG = """\
what is measured
  For every op and size: --warmup untimed calls, then I timed iterations of
      barrier(); t0 = perf_counter(); op(); t1 = perf_counter()
  on every rank (the barrier is not timed). Rank 0 picks I -- enough iterations for about
  --time seconds per size, at least min(5, --iters) and at most --iters -- from its warmup
  times and broadcasts it, so all ranks run the same count. time(us) is the MAX over ranks
  of each rank's MEDIAN (t1 - t0): the slowest rank's typical call, as nccl-tests reports it.
  --latency prints OSU columns instead: Avg/Min/Max over ranks of each rank's MEAN.
  Buffers are allocated and touched once per size, before the warmup, never in the loop,
  every library's at the same place in a page (--offset, --skew; placement.py says why).

bandwidth (nccl-tests conventions)
  size   bytes of the whole buffer: for all_gather, reduce_scatter, all_to_all, gather and
         scatter the total over ranks (n x per-rank chunk; count rounded to a multiple of
         n); for all_reduce, broadcast, reduce and sendrecv one rank's buffer.
  algbw  = size / time  (GB/s, 1 GB = 1e9 bytes)
  busbw  = algbw x factor, factor:
           all_reduce                                                   2(n-1)/n
           all_gather, reduce_scatter, all_to_all, gather, scatter      (n-1)/n
           broadcast, reduce, sendrecv                                  1
           barrier                                                      0 (moves no data)
  out-of-place / in-place: both columns by default (--inplace: in-place only, --outplace:
  out-of-place only). Ops whose torch-style API is in place anyway (all_reduce, broadcast,
  reduce, barrier) run the same call in both; sendrecv has no in-place form (N/A).
  #wrong: with --check, after timing, inputs are refilled with a rank-dependent pattern,
  the op runs once more and every rank counts wrong output elements; the sum over ranks.

--compare mpi,gloo
  Runs the same sweep, measured the same way, with mpi4py on Open MPI (mpiexec from the
  'bench' extra) and torch.distributed Gloo (CPU tensors, 'torch' extra), one job per
  library. --interleave size (default): every job stays up and the libraries take turns
  at every size, --rounds times (default 2), the order rotating (collcomm mpi gloo, mpi
  gloo collcomm, ...), the idle jobs asleep; so each library meets the machine in the
  same state at each size, even on a machine whose speed drifts (a VM's CPUs being
  moved). --interleave sweep: whole sweeps alternate instead, one job per library and
  round. time per size = the median over rounds; ratio = the median over rounds of
  (peer time / collcomm time) in that round (> 1: collcomm is faster). Out-of-place only
  unless --inplace.

--api mpi,torch
  Also measures collcomm through its other front ends, with the very code that measures the
  peers: "cc-mpi" is the mpi4py sweep with `from collcomm import MPI` in place of mpi4py,
  "cc-torch" the torch.distributed sweep with backend "collcomm" in place of "gloo", both
  launched by collcomm run. Their columns next to "collcomm" (the functional API) show what
  each front end adds per call; next to --compare mpi,gloo, what a one-line switch gains.

--calibrate
  Fits the alpha-beta cost model: for each transport (shm, tcp) a 2-rank ping-pong over
  8 B .. 4 MiB, one-way time = alpha + beta * bytes (least squares); gamma = seconds per
  byte of np.add(a, b, out=a) on 32 MiB float32 (one operand's bytes). --save PATH (default
  $COLLCOMM_COST_MODEL or ~/.cache/collcomm/cost_model.json) writes
  {"shm": {"alpha", "beta"}, "tcp": {...}, "gamma", "measured"}.
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("-n", "--nproc", type=int, default=2, metavar="N",
                   help="ranks to launch (default 2; ignored inside a launched job)")
    p.add_argument("--op", default="all_reduce",
                   help=f"{'|'.join(OPS)}|all, or a comma list (default all_reduce)")
    p.add_argument("-b", "--minbytes", default="8", help="smallest size (default 8)")
    p.add_argument("-e", "--maxbytes", default="64M", help="largest size (default 64M)")
    p.add_argument("-f", "--stepfactor", type=float, default=2.0,
                   help="multiply the size by this each step (default 2)")
    p.add_argument("-d", "--dtype", default="float32", help=f"{'|'.join(DTYPES)} (default float32)")
    p.add_argument("-o", "--redop", default="sum", help=f"{'|'.join(REDOPS)} (default sum)")
    p.add_argument("-r", "--root", type=int, default=0, help="root of rooted ops (default 0)")
    p.add_argument("--iters", type=int, default=200,
                   help="most timed iterations per size (default 200)")
    p.add_argument("--warmup", type=int, default=5, help="untimed calls per size (default 5; at least 1 is run)")
    p.add_argument("--time", dest="time_per_size", type=float, default=0.2,
                   help="target seconds of timed iterations per size (default 0.2)")
    place = p.add_mutually_exclusive_group()
    place.add_argument("--inplace", action="store_true", help="in-place only")
    place.add_argument("--outplace", action="store_true", help="out-of-place only")
    p.add_argument("--algo", default=None, metavar="A",
                   help="collcomm algorithm: sets COLLCOMM_ALGO_<OP>=A for every op "
                        "benchmarked; or per op: all_reduce=ring,broadcast=tree")
    p.add_argument("--transport", choices=["shm", "tcp", "auto"], default=None,
                   help="collcomm transport (sets COLLCOMM_TRANSPORT for the ranks)")
    p.add_argument("--alloc", choices=["numpy", "shared"], default="numpy",
                   help="collcomm buffers: plain numpy arrays, or collcomm.empty (shared memory)")
    p.add_argument("--offset", default="0", metavar="B",
                   help="every library's buffers start B bytes past a 4 KiB page (a multiple "
                        "of 16; default 0), or 'any': where np.empty puts them")
    p.add_argument("--skew", default="0", metavar="S",
                   help="rank r's buffers start r x S bytes further (a multiple of 16; default 0)")
    p.add_argument("-c", "--check", action="store_true", help="validate results (#wrong)")
    p.add_argument("--latency", action="store_true",
                   help="print OSU-style latency tables instead of nccl-tests tables")
    p.add_argument("--json", dest="json_path", metavar="F", help="write all rows as JSON to F")
    p.add_argument("--plot", dest="plot_path", metavar="F.png",
                   help="draw busbw vs size, one line per library (needs matplotlib)")
    p.add_argument("--compare", default=None, metavar="mpi,gloo",
                   help="also run mpi4py/Open MPI and/or torch Gloo, interleaved")
    p.add_argument("--api", default=None, metavar="mpi,torch",
                   help="also time collcomm through collcomm.MPI and/or the torch backend")
    p.add_argument("--rounds", type=int, default=None,
                   help="rounds with --compare (default 2; 1 otherwise)")
    p.add_argument("--interleave", choices=["size", "sweep"], default="size",
                   help="with --compare/--api: libraries take turns at every size (default), "
                        "or whole sweeps alternate")
    p.add_argument("--calibrate", action="store_true",
                   help="measure the alpha-beta-gamma cost model instead of a sweep")
    p.add_argument("--save", nargs="?", const="", default=None, metavar="PATH",
                   help="with --calibrate: write the model (default path: see below)")


def options_from_args(args: argparse.Namespace) -> Options:
    begin, end = parse_size(args.minbytes), parse_size(args.maxbytes)
    modes = ["ip"] if args.inplace else ["oop"] if args.outplace else ["oop", "ip"]
    compare = parse_api(getattr(args, "api", None)) + parse_compare(args.compare)
    if compare and not (args.inplace or args.outplace):
        modes = ["oop"]
    redop = args.redop.strip().lower()
    if redop == "product":
        redop = "prod"
    if redop not in REDOPS:
        raise ValueError(f"unknown redop {args.redop!r}; valid: {', '.join(REDOPS)}")
    if args.nproc < 1:
        raise ValueError(f"-n must be >= 1, got {args.nproc}")
    if args.iters < 1 or args.warmup < 0:
        raise ValueError("--iters must be >= 1 and --warmup >= 0")
    offset = parse_offset(str(args.offset))
    skew = check_bytes(args.skew, "--skew")
    if offset is None and skew:
        raise ValueError("--skew moves buffers from --offset; it has no meaning with --offset any")
    rounds = args.rounds if args.rounds is not None else (2 if compare else 1)
    if rounds < 1:
        raise ValueError("--rounds must be >= 1")
    return Options(
        nproc=args.nproc, ops=parse_ops(args.op), sizes=size_sweep(begin, end, args.stepfactor),
        dtype=normalize_dtype(args.dtype), redop=redop, root=args.root, iters=args.iters,
        warmup=args.warmup, min_iters=min(5, args.iters), time_per_size=args.time_per_size,
        modes=modes, check=args.check, algo=args.algo, transport=args.transport,
        alloc=args.alloc, offset=offset, skew=skew, latency=args.latency, json_path=args.json_path,
        plot_path=args.plot_path, compare=compare, rounds=rounds,
        interleave=getattr(args, "interleave", "size"))
