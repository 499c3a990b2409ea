"""``MPI.Pickle`` and ``MPI.pickle``: how the lower-case (object) methods serialize.

As in mpi4py, ``MPI.pickle`` is the instance every object call of ``collcomm.MPI`` uses
(``bcast``, ``send``, ``isend``, ``allgather`` …), and ``MPI.pickle.__init__(dill.dumps,
dill.loads)`` (or cloudpickle's) swaps the serializer for the whole process. With the
standard library's functions the objects' large buffers (``THRESHOLD`` bytes and up) travel
out of band, each as its own message (core/pickled.py); with other functions each object is
one in-band pickle, ``dumps(obj, protocol)`` (``dumps(obj)`` when no protocol is given) and
``loads(data)``. Every rank must use the same functions, as with mpi4py.
"""
from __future__ import annotations

import pickle as _stdlib
from typing import Any, Callable, Sequence

import numpy as np

from ..core.pickled import OUT_OF_BAND_MIN, Serializer, out_of_band


class Pickle(Serializer):
    """mpi4py's ``MPI.Pickle(dumps=None, loads=None, protocol=None, threshold=None)``."""

    def __init__(self, dumps: Callable[..., bytes] | None = None,
                 loads: Callable[..., Any] | None = None, protocol: int | None = None,
                 threshold: int | None = None) -> None:
        dumps = _stdlib.dumps if dumps is None else dumps
        loads = _stdlib.loads if loads is None else loads
        if protocol is None and dumps is _stdlib.dumps:
            protocol = _stdlib.HIGHEST_PROTOCOL
        # one tuple, swapped at once: a thread pickling meanwhile sees the old functions or
        # the new ones, never a mix (mpi4py's __init__ is atomic too)
        self._state = (dumps, loads, protocol, dumps is _stdlib.dumps and loads is _stdlib.loads)
        self._oob_min = OUT_OF_BAND_MIN if threshold is None else int(threshold)
        self._native()

    def _native(self) -> None:
        """The core's Serializer.native from the state: what dumps/loads below call for an
        object pickled in band (swapped as one tuple, as the state is); None in a subclass
        with methods of its own (the C code would not call them)."""
        dumps, loads, protocol, standard = self._state
        own = type(self).dumps is not Pickle.dumps or type(self).loads is not Pickle.loads
        self.native = None if own else (dumps, loads, protocol, standard and (protocol or 0) >= 5,
                                        self._oob_min)

    @property
    def oob_min(self) -> int:  # type: ignore[override]
        return self._oob_min

    @oob_min.setter
    def oob_min(self, value: int) -> None:
        self._oob_min = int(value)
        self._native()

    @property
    def PROTOCOL(self) -> int | None:  # noqa: N802 - mpi4py's name
        return self._state[2]

    @PROTOCOL.setter
    def PROTOCOL(self, protocol: int | None) -> None:  # noqa: N802
        dumps, loads, _, standard = self._state
        self._state = (dumps, loads, None if protocol is None else int(protocol), standard)
        self._native()

    @property
    def THRESHOLD(self) -> int:  # noqa: N802 - mpi4py's name
        return self.oob_min

    @THRESHOLD.setter
    def THRESHOLD(self, threshold: int) -> None:  # noqa: N802
        self.oob_min = int(threshold)

    # -- the core's Serializer -------------------------------------------------------------
    def dumps(self, obj: Any, buffer_callback: Callable[..., Any] | None = None) -> bytes:  # type: ignore[override]
        """``obj`` as bytes; with ``buffer_callback`` (standard pickle, protocol 5 and up)
        the buffers it declines travel out of band."""
        dumps, _, protocol, standard = self._state
        if buffer_callback is not None and standard and (protocol or 0) >= 5:
            return _stdlib.dumps(obj, protocol, buffer_callback=buffer_callback)
        return dumps(obj) if protocol is None else dumps(obj, protocol)

    def loads(self, data: Any, buffers: Sequence[Any] = ()) -> Any:  # type: ignore[override]
        if buffers:
            return _stdlib.loads(data, buffers=buffers)
        if type(data) is np.ndarray:     # (a received pickle: the loads gets a plain buffer)
            data = memoryview(data)
        return self._state[1](data)

    # -- mpi4py's out-of-band pair ---------------------------------------------------------
    def dumps_oob(self, obj: Any) -> tuple[bytes, list[Any]]:
        """``(pickle, buffers)``: the buffers of ``THRESHOLD`` bytes and up out of band."""
        bufs: list[Any] = []
        return self.dumps(obj, out_of_band(self.oob_min, bufs)), bufs

    def loads_oob(self, data: Any, buffers: Sequence[Any]) -> Any:
        return self.loads(data, buffers)


#: the instance every object method of collcomm.MPI uses
pickle = Pickle()
