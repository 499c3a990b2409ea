"""A small animated GIF89a writer: pure Python and numpy, no Pillow.

A GIF is a header, a logical screen descriptor, one global colour table (the palette,
padded to a power of two, at most 256 colours), an optional NETSCAPE2.0 application
extension that makes the animation loop, then per frame a Graphic Control Extension
(the frame's delay in hundredths of a second), an image descriptor and the frame's
indexed pixels compressed with LZW, and a trailer byte.

LZW as GIF does it: codes are written least significant bit first, starting at
``min_code_size + 1`` bits; code ``2**min_code_size`` is *clear* (reset the table), the
next one *end of information*. Every code after the first one following a clear adds a
table entry on the decoder's side, one step behind the encoder; the width grows by one bit
when the decoder's next free code reaches ``2**width`` (at most 12 bits), so the encoder
widens after it has added entry ``2**width``. When the table is full (4096 entries) the
encoder emits a clear code and starts over. The compressed bytes go out in sub-blocks of
at most 255 bytes.

Every frame covers the whole screen; all frames share the global palette.
"""
from __future__ import annotations

import struct
from collections.abc import Sequence

import numpy as np

MAX_CODES = 4096


def lzw_encode(pixels: bytes, min_code_size: int) -> bytes:
    """The GIF LZW code stream of ``pixels`` (palette indices < ``2**min_code_size``),
    beginning with a clear code and ending with end-of-information, packed LSB first."""
    clear = 1 << min_code_size
    eoi = clear + 1
    out = bytearray()
    acc = 0          # bits not yet written, least significant first
    nbits = 0

    def emit(code: int, width: int) -> None:
        nonlocal acc, nbits
        acc |= code << nbits
        nbits += width
        while nbits >= 8:
            out.append(acc & 0xFF)
            acc >>= 8
            nbits -= 8

    width = min_code_size + 1
    table: dict[int, int] = {}
    next_code = eoi + 1
    emit(clear, width)
    if pixels:
        w = pixels[0]
        for c in pixels[1:]:
            key = (w << 8) | c
            code = table.get(key)
            if code is not None:
                w = code
                continue
            emit(w, width)
            table[key] = next_code
            if next_code == 1 << width and width < 12:
                width += 1
            next_code += 1
            if next_code == MAX_CODES:
                emit(clear, width)
                table.clear()
                width = min_code_size + 1
                next_code = eoi + 1
            w = c
        emit(w, width)
        # the decoder adds an entry for that last code before it reads the next one
        if next_code > eoi + 1 and next_code == 1 << width and width < 12:
            width += 1
    emit(eoi, width)
    if nbits:
        out.append(acc & 0xFF)
    return bytes(out)


def _sub_blocks(data: bytes) -> bytes:
    parts = [bytes([len(data[i:i + 255])]) + data[i:i + 255] for i in range(0, len(data), 255)]
    return b"".join(parts) + b"\x00"


def encode(frames: Sequence[np.ndarray], palette: np.ndarray | Sequence[Sequence[int]],
           delays_cs: int | Sequence[int] = 100, loop: int | None = 0) -> bytes:
    """An animated GIF of ``frames`` (2-D arrays of palette indices, all the same shape).

    ``palette``: up to 256 RGB triples (0..255). ``delays_cs``: each frame's delay in
    hundredths of a second (one number for all). ``loop``: how many times the animation
    repeats (0 = forever); ``None`` writes no NETSCAPE2.0 extension (play once).
    """
    pal = np.asarray(palette, dtype=np.int64).reshape(-1, 3)
    if not 1 <= len(pal) <= 256:
        raise ValueError(f"gif: the palette has {len(pal)} colours; expecting 1 to 256")
    if pal.min() < 0 or pal.max() > 255:
        raise ValueError("gif: palette components must be in 0..255")
    if not frames:
        raise ValueError("gif: expecting at least one frame, got 0")
    shape = np.shape(frames[0])
    if len(shape) != 2 or not (1 <= shape[0] <= 65535 and 1 <= shape[1] <= 65535):
        raise ValueError(f"gif: frames must be 2-D, 1..65535 pixels a side; got shape {shape}")
    height, width = shape
    delays = [int(delays_cs)] * len(frames) if isinstance(delays_cs, (int, np.integer)) else list(delays_cs)
    if len(delays) != len(frames):
        raise ValueError(f"gif: expecting {len(frames)} delays, got {len(delays)}")
    bits = max(1, int(len(pal) - 1).bit_length())           # table size 2**bits >= colours
    table = np.zeros((1 << bits, 3), dtype=np.uint8)
    table[:len(pal)] = pal
    min_code_size = max(2, bits)
    out = [b"GIF89a", struct.pack("<HHBBB", width, height, 0x80 | 0x70 | (bits - 1), 0, 0),
           table.tobytes()]
    if loop is not None:
        out.append(b"\x21\xff\x0bNETSCAPE2.0" + struct.pack("<BBHB", 3, 1, loop, 0))
    for i, (frame, delay) in enumerate(zip(frames, delays)):
        f = np.asarray(frame)
        if f.shape != shape:
            raise ValueError(f"gif: frame {i} has shape {f.shape}, frame 0 {shape}")
        if f.size and (f.min() < 0 or f.max() >= len(pal)):
            raise ValueError(f"gif: frame {i} uses colour {int(f.max())}; the palette has {len(pal)}")
        if not 0 <= delay <= 65535:
            raise ValueError(f"gif: frame {i} delay {delay} is not in 0..65535 hundredths")
        # GCE: disposal 1 (leave in place), no transparency
        out.append(struct.pack("<BBBBHBB", 0x21, 0xF9, 4, 0x04, delay, 0, 0))
        out.append(struct.pack("<BHHHHB", 0x2C, 0, 0, width, height, 0))
        data = lzw_encode(np.ascontiguousarray(f, dtype=np.uint8).tobytes(), min_code_size)
        out.append(bytes([min_code_size]) + _sub_blocks(data))
    out.append(b"\x3b")
    return b"".join(out)


def write(path: str, frames: Sequence[np.ndarray], palette: np.ndarray | Sequence[Sequence[int]],
          delays_cs: int | Sequence[int] = 100, loop: int | None = 0) -> None:
    """:func:`encode` into the file ``path``."""
    data = encode(frames, palette, delays_cs, loop)
    with open(path, "wb") as f:
        f.write(data)
