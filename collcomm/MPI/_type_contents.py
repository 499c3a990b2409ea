"""What a datatype was made of (``combiner``, ``decode``, ``Get_envelope``,
``Get_contents``) and MPI_Pack (``Pack``, ``Unpack``, ``Pack_size``, the ``external32``
forms): the part of :class:`._types.Datatype` that reads its recipe or packs with it.

``Get_contents`` lists integers, addresses and datatypes in MPI's order for each
combiner (Open MPI's, which mpi4py reports); large counts are never used.
"""
from __future__ import annotations

from typing import Any

from ._derived import COMBINERS, _Type
from ._errors import ERR_TYPE, Exception as MPIException


class TypeContents:
    """Mixed into Datatype (which gives ``_valid`` and ``_new``)."""

    __slots__ = ()

    _valid: Any
    _new: Any

    # -- what it was made of -------------------------------------------------------------------
    @property
    def combiner(self) -> int:
        return COMBINERS[self._valid("combiner").recipe[0]]

    def decode(self) -> tuple["Datatype", str, dict[str, Any]]:
        """(the type it was made from, its combiner's name, the constructor's arguments)."""
        t = self._valid("decode")
        name, params, olds = t.recipe
        if name == "NAMED":
            return self, name, {}
        if name == "STRUCT":      # (no one old type: MPI.DATATYPE_NULL, as mpi4py)
            return type(self)(), name, {**params, "datatypes": [self._new(o) for o in olds]}
        return self._new(olds[0]), name, dict(params)

    def Get_envelope(self) -> tuple[int, int, int, int, int]:  # noqa: N802
        """(integers, addresses, large counts, datatypes, combiner) of Get_contents."""
        ints, addrs, types = self._contents("Get_envelope")
        return len(ints), len(addrs), 0, len(types), self.combiner

    def Get_contents(self) -> tuple[list[int], list[int], list[int], list["Datatype"]]:  # noqa: N802
        ints, addrs, types = self._contents("Get_contents")
        return ints, addrs, [], [self._new(o) for o in types]

    def _contents(self, call: str) -> tuple[list[int], list[int], list[_Type]]:
        t = self._valid(call)
        name, p, olds = t.recipe
        if name == "NAMED":
            if call == "Get_contents":
                raise MPIException(ERR_TYPE, f"Datatype.{call}: {t.name} is predefined (combiner NAMED)")
            return [], [], []
        if name in ("CONTIGUOUS", "VECTOR"):
            ints = [p["count"]] + ([p["blocklength"], p["stride"]] if name == "VECTOR" else [])
            return ints, [], olds
        if name == "HVECTOR":
            return [p["count"], p["blocklength"]], [p["stride"]], olds
        d = p.get("displacements", [])
        if name in ("INDEXED", "HINDEXED", "STRUCT"):
            b = p["blocklengths"]
            return ([len(b)] + b + (d if name == "INDEXED" else [])), ([] if name == "INDEXED" else d), olds
        if name in ("INDEXED_BLOCK", "HINDEXED_BLOCK"):
            return ([len(d), p["blocklength"]] + (d if name == "INDEXED_BLOCK" else []),
                    d if name == "HINDEXED_BLOCK" else [], olds)
        if name == "SUBARRAY":
            return [len(p["sizes"])] + p["sizes"] + p["subsizes"] + p["starts"] + [p["order"]], [], olds
        if name == "RESIZED":
            return [], [p["lb"], p["extent"]], olds
        if name in ("F90_REAL", "F90_COMPLEX", "F90_INTEGER"):
            return ([p["p"], p["r"]] if "p" in p else [p["r"]]), [], []
        return [], [], olds         # DUP

    # -- packing (MPI_Pack) ---------------------------------------------------------------------
    def Pack_size(self, count: int, comm: Any) -> int:  # noqa: N802
        """The bytes ``count`` elements take packed."""
        return int(count) * self._valid("Pack_size").size     # (MPI's size: pairs without padding)

    def Pack(self, inbuf: Any, outbuf: Any, position: int, comm: Any) -> int:  # noqa: N802
        """Pack ``inbuf`` (a buffer spec read as this type) into ``outbuf`` at byte
        ``position``; returns the position after it."""
        from ._pack import pack
        return pack(self, inbuf, outbuf, position, "Datatype.Pack")

    def Unpack(self, inbuf: Any, position: int, outbuf: Any, comm: Any) -> int:  # noqa: N802
        """Unpack from ``inbuf`` at byte ``position`` into ``outbuf`` (as this type);
        returns the position after what it read."""
        from ._pack import unpack
        return unpack(self, inbuf, position, outbuf, "Datatype.Unpack")

    def Pack_external_size(self, datarep: str, count: int) -> int:  # noqa: N802
        from ._pack import external_check
        external_check(datarep, "Pack_external_size")
        return int(count) * self._valid("Pack_external_size").size

    def Pack_external(self, datarep: str, inbuf: Any, outbuf: Any, position: int) -> int:  # noqa: N802
        """As Pack, in ``"external32"`` (big-endian) representation."""
        from ._pack import pack
        return pack(self, inbuf, outbuf, position, "Datatype.Pack_external", datarep)

    def Unpack_external(self, datarep: str, inbuf: Any, position: int, outbuf: Any) -> int:  # noqa: N802
        from ._pack import unpack
        return unpack(self, inbuf, position, outbuf, "Datatype.Unpack_external", datarep)
