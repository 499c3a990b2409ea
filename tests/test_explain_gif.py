"""collcomm explain --out F.gif: the GIF89a writer (collcomm/tools/gif.py) checked by a small
independent decoder written here, and the explain frames drawn into it (explain_raster.py)."""
from __future__ import annotations

import base64
import json
import re
import shutil
import struct
import subprocess

import numpy as np
import pytest

from collcomm.tools import gif


# ------------------------------------------------------------- an independent decoder
def _lzw_decode(data: bytes, min_code_size: int, npixels: int) -> tuple[list[int], int]:
    """Pixels of one image's code stream, strictly: the stream must end with the
    end-of-information code right after ``npixels`` pixels. Also returns clears seen."""
    clear, eoi = 1 << min_code_size, (1 << min_code_size) + 1
    pos, size, out, clears = 0, min_code_size + 1, [], 0
    dictionary: list[bytes] = []
    prev: bytes | None = None
    total_bits = len(data) * 8
    value = int.from_bytes(data, "little")
    while True:
        assert pos + size <= total_bits, "code stream ended without end-of-information"
        code = (value >> pos) & ((1 << size) - 1)
        pos += size
        if code == clear:
            clears += 1
            dictionary = [bytes([i]) for i in range(clear)] + [b"", b""]
            size, prev = min_code_size + 1, None
            continue
        if code == eoi:
            break
        assert dictionary, "the stream does not start with a clear code"
        if prev is None:
            entry = dictionary[code]
        else:
            if code < len(dictionary):
                entry = dictionary[code]
                new = prev + entry[:1]
            else:
                assert code == len(dictionary), f"code {code} beyond the table ({len(dictionary)})"
                entry = new = prev + prev[:1]
            if len(dictionary) < 4096:
                dictionary.append(new)
                if len(dictionary) == 1 << size and size < 12:
                    size += 1
        out.extend(entry)
        prev = entry
    assert len(out) == npixels, (len(out), npixels)
    assert total_bits - pos < 8 and value >> pos == 0, "data after end-of-information"
    return out, clears


def decode_gif(blob: bytes) -> dict:
    """{'size', 'palette', 'loop', 'frames' (arrays), 'delays', 'clears'} of a GIF89a."""
    assert blob[:6] == b"GIF89a"
    w, h, packed, _bg, _aspect = struct.unpack_from("<HHBBB", blob, 6)
    assert packed & 0x80, "no global colour table"
    ncol = 2 << (packed & 7)
    palette = np.frombuffer(blob, np.uint8, ncol * 3, 13).reshape(-1, 3)
    i = 13 + ncol * 3
    res = {"size": (w, h), "palette": palette, "loop": None, "frames": [], "delays": [], "clears": []}
    delay = None
    while True:
        tag = blob[i]
        if tag == 0x3B:
            assert i == len(blob) - 1, "bytes after the trailer"
            return res
        if tag == 0x21:
            label, i = blob[i + 1], i + 2
            chunks = []
            while blob[i]:
                chunks.append(blob[i + 1:i + 1 + blob[i]])
                i += 1 + blob[i]
            i += 1
            if label == 0xFF:
                assert chunks[0] == b"NETSCAPE2.0" and chunks[1][0] == 1
                res["loop"] = struct.unpack("<H", chunks[1][1:3])[0]
            elif label == 0xF9:
                assert len(chunks) == 1 and len(chunks[0]) == 4
                delay = struct.unpack("<H", chunks[0][1:3])[0]
            continue
        assert tag == 0x2C, f"unexpected block {tag:#x} at {i}"
        x, y, fw, fh, fpacked = struct.unpack_from("<HHHHB", blob, i + 1)
        assert (x, y, fw, fh) == (0, 0, w, h) and not fpacked & 0x80
        mcs, i = blob[i + 10], i + 11
        data = bytearray()
        while blob[i]:
            assert blob[i] <= 255
            data += blob[i + 1:i + 1 + blob[i]]
            i += 1 + blob[i]
        i += 1
        pixels, clears = _lzw_decode(bytes(data), mcs, w * h)
        res["frames"].append(np.array(pixels, dtype=np.uint8).reshape(h, w))
        res["delays"].append(delay)
        res["clears"].append(clears)
        delay = None


# ------------------------------------------------------------------------ the writer
def _roundtrip(frames, palette, delays, loop=0):
    blob = gif.encode(frames, palette, delays, loop)
    got = decode_gif(blob)
    assert len(got["frames"]) == len(frames)
    for want, have in zip(frames, got["frames"]):
        assert np.array_equal(np.asarray(want, dtype=np.uint8), have)
    assert got["delays"] == (list(delays) if not isinstance(delays, int) else [delays] * len(frames))
    assert got["loop"] == loop
    assert got["size"] == (frames[0].shape[1], frames[0].shape[0])
    pal = np.asarray(palette, dtype=np.uint8)
    assert np.array_equal(got["palette"][:len(pal)], pal)
    return got


def test_noise_with_256_colours_fills_the_table_and_emits_clear_codes():
    rng = np.random.default_rng(1)
    palette = rng.integers(0, 256, (256, 3))
    frames = [rng.integers(0, 256, (200, 300)).astype(np.uint8) for _ in range(2)]
    frames.append(np.zeros((200, 300), np.uint8))                     # long runs
    frames.append((np.arange(300)[None, :] * np.ones((200, 1), int) % 256).astype(np.uint8))
    got = _roundtrip(frames, palette, [7, 150, 0, 65535], loop=3)
    assert min(got["clears"][:2]) >= 10                                # table full, reset
    assert got["clears"][2] == 1                                       # only the leading one


@pytest.mark.parametrize("ncolours", [1, 2, 3, 4, 5, 16, 17, 128, 255])
def test_small_palettes_and_every_code_width_boundary(ncolours):
    rng = np.random.default_rng(ncolours)
    palette = [(i, 255 - i, (7 * i) % 256) for i in range(ncolours)]
    # lengths around each growth of the code width hit the end-of-information edge case
    for h, w in [(1, 1), (1, 2), (1, 3), (2, 2)] + [(1, n) for n in range(4, 90)] + [(37, 53), (64, 129)]:
        frame = rng.integers(0, ncolours, (h, w)).astype(np.uint8)
        skew = np.minimum(rng.geometric(0.4, (h, w)) - 1, ncolours - 1).astype(np.uint8)
        _roundtrip([frame, skew], palette, [1, 2], loop=0)


def test_no_loop_extension_and_bad_input():
    frame = np.zeros((3, 4), np.uint8)
    assert decode_gif(gif.encode([frame], [(0, 0, 0)], 5, loop=None))["loop"] is None
    with pytest.raises(ValueError, match="palette has 2"):
        gif.encode([np.full((2, 2), 2, np.uint8)], [(0, 0, 0), (9, 9, 9)])
    with pytest.raises(ValueError, match="frame 1 has shape"):
        gif.encode([frame, np.zeros((4, 3), np.uint8)], [(0, 0, 0)])
    with pytest.raises(ValueError, match="257 colours"):
        gif.encode([frame], [(0, 0, 0)] * 257)
    with pytest.raises(ValueError, match="expecting 1 delays, got 2"):
        gif.encode([frame], [(0, 0, 0)], [1, 2])
