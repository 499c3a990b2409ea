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

from collcomm.tools import explain, explain_raster, explain_render, gif


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


# ------------------------------------------------------------ collcomm explain --out F.gif
@pytest.fixture(scope="module")
def ring_gif(tmp_path_factory):
    """``collcomm explain all_reduce --algo ring -n 5 --out ring.gif`` through the command's
    own entry point, keeping the explanation it drew (one job of 5 ranks for the module)."""
    out = tmp_path_factory.mktemp("gif") / "ring.gif"
    seen = []
    real_run = explain.run

    def run(*args, **kwargs):
        seen.append(real_run(*args, **kwargs))
        return seen[-1]

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(explain, "run", run)
        rc = explain.main(["all_reduce", "--algo", "ring", "-n", "5", "--repeats", "1", "--out", str(out)])
    assert rc == 0 and len(seen) == 1
    return out, seen[0]


@pytest.mark.timeout(240)
def test_explain_out_gif_has_the_frames_the_svg_and_html_show(ring_gif):
    path, ex = ring_gif
    got = decode_gif(path.read_bytes())
    n = ex["n"]
    svg_panels = len(re.findall(r'font-weight="bold">(?:initial state|step \d+ of \d+)<',
                                explain_render.svg(ex)))
    html_frames = len(json.loads(re.search(r'<script id="data" type="application/json">(.*?)</script>',
                                           explain_render.html(ex), re.S).group(1))["frames"])
    assert len(got["frames"]) == len(ex["frames"]) == svg_panels == html_frames == 2 * (n - 1) + 1
    assert got["loop"] == 0 and got["delays"][-1] > got["delays"][0] > 0
    drawn = explain_raster.frames(ex)
    lay = explain_raster.layout(ex)
    assert got["size"] == (lay.width, lay.height)
    for f, have, want in zip(ex["frames"], got["frames"], drawn):
        assert np.array_equal(have, want)
        # the title line: "all_reduce / ring on 5 ranks: step F of 8"
        title = np.full((20, lay.width), explain_raster.WHITE, np.uint8)
        explain_raster.text(title, 8, 8, f"all_reduce / ring on 5 ranks: {explain_render.frame_title(ex, f)}")
        assert np.array_equal(have[:20], title)
        # every cell: its fill is what its label means, its border red iff it changed
        for row in f["rows"]:
            for i, lab in enumerate(row["labels"]):
                x, y, w, h = lay.cell(row["rank"], i)
                assert have[y + 2, x + w // 2] == explain_raster.FILL[explain_render.cell_kind(lab, n)]
                red = have[y, x] == explain_raster.CHANGED
                assert red == (i in row.get("changed", [])), (f["frame"], row)
    first, last = got["frames"][0], got["frames"][-1]
    for r in range(n):
        for i in range(n):
            x, y, w, h = lay.cell(r, i)
            assert first[y + 2, x + w // 2] == explain_raster.SOME             # only its own rank
            assert last[y + 2, x + w // 2] == explain_raster.ALL               # every rank's sum


def test_explain_out_with_an_unknown_suffix_is_refused_before_running(monkeypatch, capsys):
    def run(*args, **kwargs):
        raise AssertionError("explain ran although --out cannot be written")

    monkeypatch.setattr(explain, "run", run)
    assert explain.main(["all_reduce", "--algo", "ring", "-n", "2", "--out", "x.png"]) == 2
    err = capsys.readouterr().err
    assert "unknown suffix '.png'" in err and ".html, .gif or .svg" in err


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.timeout(240)
@pytest.mark.skipif(_chromium() is None, reason="Debian's chromium is not installed "
                    "(apt-get install -y chromium)")
def test_chromium_decodes_the_gifs(ring_gif, tmp_path):
    """A real decoder: chromium loads the explain GIF and a 256-colour noise GIF (whose code
    stream has clear codes) through <img>; sizes and every noise pixel must match."""
    path, _ex = ring_gif
    rng = np.random.default_rng(7)
    palette = rng.integers(0, 256, (256, 3)).astype(np.uint8)
    noise = rng.integers(0, 256, (200, 300)).astype(np.uint8)
    noise_gif = gif.encode([noise], palette, 10)
    assert decode_gif(noise_gif)["clears"][0] >= 10

    def data_url(blob: bytes) -> str:
        return "data:image/gif;base64," + base64.b64encode(blob).decode()

    page = tmp_path / "gifs.html"
    page.write_text(f"""<!DOCTYPE html><html><body>
<img id="ex" src="{data_url(path.read_bytes())}"><img id="noise" src="{data_url(noise_gif)}">
<pre id="out"></pre><script>
window.addEventListener("load", function () {{
  const ex = document.getElementById("ex"), nz = document.getElementById("noise");
  const c = document.createElement("canvas"); c.width = nz.naturalWidth; c.height = nz.naturalHeight;
  const g = c.getContext("2d"); g.drawImage(nz, 0, 0);
  const px = g.getImageData(0, 0, c.width, c.height).data;
  let hex = "";
  for (let i = 0; i < px.length; i += 4)
    for (let k = 0; k < 3; k++) hex += (px[i + k] + 256).toString(16).slice(1);
  document.getElementById("out").textContent = JSON.stringify({{
    ex: [ex.naturalWidth, ex.naturalHeight], noise: [nz.naturalWidth, nz.naturalHeight], rgb: hex}});
}});
</script></body></html>""")
    browser = [_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
               f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom", f"file://{page}"]
    run = subprocess.run(browser, capture_output=True, text=True, timeout=120)
    m = re.search(r'<pre id="out">(.*?)</pre>', run.stdout, re.S)
    assert m and m.group(1), run.stdout[-2000:] + run.stderr[-2000:]
    res = json.loads(m.group(1))
    assert res["ex"] == list(decode_gif(path.read_bytes())["size"])
    assert res["noise"] == [300, 200]
    rgb = np.frombuffer(bytes.fromhex(res["rgb"]), np.uint8).reshape(200, 300, 3).astype(int)
    assert np.array_equal(rgb, palette[noise])
