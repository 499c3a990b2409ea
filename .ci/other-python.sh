#!/usr/bin/env bash
# A second CPython runs part of the suite: 3.12, whose interpreter refuses new threads at
# exit (where a rank that never called destroy_process_group leaves the job) and whose C API
# the extension must build against. An editable install in its own venv builds the native
# core for it beside the main one (another file name); then the exit paths, the native
# core's checks, eager rooted calls, the MPI buffer collectives, the launcher, the flight
# recorder's caller read from the interpreter's frames and the channels' locks taken in C
# (both version-specific in the core), and a cut link between hosts (its ranks leave at
# exit, where 3.12 starts no thread: helper_thread's standby thread runs those steps).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=""
for c in python3.12 "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.12*/bin/python3.12; do
    if "$c" -c "import sys; assert sys.version_info[:2] == (3, 12)" 2>/dev/null; then
        PY="$c"
        break
    fi
done
if [ -z "$PY" ]; then
    echo "other-python: no python3.12 on this machine: skipped"
    exit 0
fi
VENV="$(mktemp -d)/venv"
trap 'rm -rf "$(dirname "$VENV")"' EXIT
"$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q -e '.[test]'
"$VENV/bin/python" -c "import collcomm.native as n, sys; print('other-python:', sys.version.split()[0], 'native core:', n.core is not None); sys.exit(n.core is None)"
"$VENV/bin/python" -m pytest -q -p no:cacheprovider tests/test_launcher_exit.py tests/test_recorder.py \
    tests/test_eager_rooted.py tests/test_native.py tests/test_fastpath.py tests/test_mpi_cco_buf.py \
    tests/test_faults.py tests/test_mpi_launch.py tests/test_fastpath_record.py tests/test_p2p_native.py \
    tests/test_multihost.py::test_cut_link_every_rank_raises_and_launchers_name_the_cause
