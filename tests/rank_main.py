"""Entry point of one rank started by tests.harness.run_ranks (``python -m tests.rank_main DIR``)."""
from __future__ import annotations

import faulthandler
import os
import pickle
import signal
import sys
import time
import traceback

from tests.harness import Outcome


def main(tmp: str) -> int:
    import collcomm.core.runtime as collcomm
    from tests import rank_pytest

    rank_pytest.install()     # the test's module imports without pytest's cost (see there)

    faulthandler.register(signal.SIGUSR1, all_threads=True)  # the harness asks on a hang

    with open(os.path.join(tmp, "job.pkl"), "rb") as f:
        fn, args, init = pickle.load(f)
    rank = int(os.environ["RANK"])
    start = time.monotonic()
    try:
        if init:
            collcomm.init_process_group()
            open(os.path.join(tmp, f"joined-{rank}"), "w").close()   # the harness's kill timers start
        value = fn(*args)
        outcome = Outcome(rank, True, value=value, elapsed=time.monotonic() - start)
    except BaseException as exc:  # noqa: BLE001 - reported to the test
        outcome = Outcome(rank, False, error_type=type(exc).__name__, error=str(exc),
                          traceback=traceback.format_exc(), elapsed=time.monotonic() - start)
    path = os.path.join(tmp, f"result-{rank}.pkl")
    with open(path + ".tmp", "wb") as f:
        pickle.dump(outcome, f)
    os.replace(path + ".tmp", path)
    if outcome.ok and init:
        collcomm.destroy_process_group()
    sys.stdout.flush()
    os._exit(0 if outcome.ok else 1)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
