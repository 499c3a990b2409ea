"""An explanation (see :mod:`collcomm.tools.explain`) drawn as pixels: ``--out F.gif``.

The same frames the terminal, HTML and SVG outputs show, one GIF frame per step: a title
line (``all_reduce / ring on 5 ranks: step 3 of 8``), a row of cells per rank (one per
chunk, labelled with the ranks whose contributions it holds; grey none, blue some, green
all, a red border where the step received or reduced into it, a blue bar under the chunk a
rank sent), the step's messages as brackets on the right (sender → receiver, arrowhead at
the receiver; dotted for shared-memory slot reads), the messages as text below, and on the
last frame whether the final state is right. Rectangles are numpy slices of one indexed
image; text is a built-in 5×7 bitmap font. :mod:`collcomm.tools.gif` writes the frames.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from . import gif as _gif
from .explain_render import cell_kind, frame_title

#: white, black, grey, none, some, all, changed (red), message (blue), arena sync (orange)
PALETTE = [(255, 255, 255), (0, 0, 0), (136, 136, 136), (242, 242, 242), (207, 232, 255),
           (76, 175, 80), (211, 47, 47), (21, 101, 192), (239, 108, 0)]
WHITE, BLACK, GREY, NONE, SOME, ALL, CHANGED, MESSAGE, SYNC = range(len(PALETTE))
FILL = {"none": NONE, "some": SOME, "all": ALL}

# 5×7 glyphs: the character, then 7 rows of 5 pixels, each row one base-32 digit (MSB left)
_GLYPHS = (
    "0ehjlphe 14c4444e 2eh1248v 3u11e11u 426aiv22 5vgu11he 668guhhe 7v124888 8ehhehhe "
    "9ehhf12c a00e1fhf bggmphhu c00egghe d11djhhf e00ehvge f698s888 g00fhf1e hggmphhh "
    "i40c444e j20622ic kggikoki lc44444e m00qllhh n00mphhh o00ehhhe p00uhugg q00djf11 "
    "r00mpggg s00ege1u t88s8896 u00hhhjd v00hhha4 w00hhlla x00ha4ah y00hhf1e z00v248v "
    "_000000v .00000cc ,0000c48 :0cc0cc0 -000v000 >8421248 (2488842 )8422248 =00v0v00 "
    "/01248g0 [e88888e ]e22222e +044v440 *04lel40 ?eh12404 ·0004000 ■0vvvvv0 →042v240 "
    "—000v000 Buhhuhhu '4480000")
FONT = {g[0]: np.array([[int(c, 32) >> (4 - b) & 1 for b in range(5)] for c in g[1:]], bool)
        for g in _GLYPHS.split()}
ADVANCE, LINE = 6, 10           # pixels per character, per text line
MAX_MESSAGES = 12               # message lines listed under a frame before "+k more"
MAX_LANES = 24                  # message brackets side by side


def text(img: np.ndarray, x: int, y: int, s: str, colour: int = BLACK) -> int:
    """Draw ``s`` with its top-left corner at (x, y); returns the x after it. Unknown
    characters are drawn lower-cased, else as ``?``; pixels off the image are dropped."""
    h, w = img.shape
    for ch in s:
        glyph = FONT.get(ch) if ch in FONT else FONT.get(ch.lower(), FONT["?"])
        if ch != " ":
            ys, xs = np.nonzero(glyph)
            ys, xs = ys + y, xs + x
            keep = (ys >= 0) & (ys < h) & (xs >= 0) & (xs < w)
            img[ys[keep], xs[keep]] = colour
        x += ADVANCE
    return x


def _rect(img: np.ndarray, x: int, y: int, w: int, h: int, colour: int) -> None:
    img[max(0, y):max(0, y + h), max(0, x):max(0, x + w)] = colour


def _box(img: np.ndarray, x: int, y: int, w: int, h: int, fill: int, edge: int, thick: int = 1) -> None:
    _rect(img, x, y, w, h, edge)
    _rect(img, x + thick, y + thick, w - 2 * thick, h - 2 * thick, fill)


def message_lines(f: dict[str, Any]) -> list[tuple[str, int]]:
    """The step's messages as (text, colour), as the terminal output writes them."""
    out = []
    for a in f["arrows"]:
        if a.get("read"):
            out.append((f"r{a['to']} reads r{a['from']}'s arena slot  {a['bytes']} B", SYNC))
            continue
        what = f"chunk {a['chunk']}" if a["chunk"] is not None else "scratch"
        content = f" [{a['label']}]" if a["label"] else ""
        out.append((f"r{a['from']} → r{a['to']}  {what}{content}  {a['bytes']} B", MESSAGE))
    if len(out) > MAX_MESSAGES:
        out[MAX_MESSAGES - 1:] = [(f"+{len(out) - MAX_MESSAGES + 1} more", GREY)]
    return out


@dataclass
class Layout:
    """Where everything goes; the same for every frame of one explanation."""

    n: int
    cols: int
    left: int           # x of the first cell
    top: int            # y of rank 0's row
    cw: int             # cell pitch
    ch: int             # row pitch
    sync_x: int         # x of the "sync" marks
    arrows_x: int       # x of the first message bracket
    lanes: int          # brackets side by side
    text_y: int         # y of the first message line
    width: int
    height: int

    def cell(self, rank: int, i: int) -> tuple[int, int, int, int]:
        """(x, y, w, h) of the cell of chunk i in rank's row."""
        return self.left + i * self.cw, self.top + rank * self.ch, self.cw - 4, self.ch - 4

    def row_mid(self, rank: int) -> int:
        return self.top + rank * self.ch + (self.ch - 4) // 2


def layout(ex: dict[str, Any]) -> Layout:
    """The geometry of ``ex``'s frames."""
    frames, n = ex["frames"], ex["n"]
    cols = max([len(r["labels"]) for f in frames for r in f["rows"]] + [1])
    longest = max([len(lab) for f in frames for r in f["rows"] for lab in r["labels"]] + [3])
    cw, ch = max(30, longest * ADVANCE + 10), 20
    left = 8 + len(f"rank {n - 1}") * ADVANCE + 8
    top = 8 + LINE + 6
    sync_x = left + cols * cw + 4
    has_sync = any(r.get("sync") for f in frames for r in f["rows"])
    lanes = max([max(_lanes(f), default=0) + 1 for f in frames] + [1])
    arrows_x = sync_x + (5 * ADVANCE if has_sync else 0) + 8
    lines = max([len(message_lines(f)) for f in frames] + [0])
    text_y = top + n * ch + 6
    widest = [arrows_x + lanes * 5 + 8, 16 + _title_chars(ex) * ADVANCE, 16 + len(_final(ex)) * ADVANCE,
              16 + max([len(s) for f in frames for s, _ in message_lines(f)] + [0]) * ADVANCE,
              16 + 48 * ADVANCE]
    height = text_y + (lines + 3) * LINE + 4        # messages, a gap, the final line, legend
    return Layout(n, cols, left, top, cw, ch, sync_x, arrows_x, lanes, text_y, max(widest), height)


def _lanes(f: dict[str, Any]) -> list[int]:
    """A column for each message bracket: shortest spans innermost, brackets that share a
    row never in the same column (interval colouring, at most :data:`MAX_LANES`)."""
    spans = [tuple(sorted((a["from"], a["to"]))) for a in f["arrows"]]
    lanes = [0] * len(spans)
    taken: list[list[tuple[int, int]]] = []
    for j in sorted(range(len(spans)), key=lambda j: (spans[j][1] - spans[j][0], spans[j])):
        lo, hi = spans[j]
        lane = next((k for k, used in enumerate(taken)
                     if all(hi < a or lo > b for a, b in used)), len(taken))
        if lane == len(taken):
            taken.append([])
        taken[lane].append((lo, hi))
        lanes[j] = min(lane, MAX_LANES - 1)
    return lanes


def _title(ex: dict[str, Any], f: dict[str, Any]) -> str:
    return f"{ex['op']} / {ex['algorithm']} on {ex['n']} ranks: {frame_title(ex, f)}"


def _title_chars(ex: dict[str, Any]) -> int:
    return max([len(_title(ex, f)) for f in ex["frames"]] + [0])


def _final(ex: dict[str, Any]) -> str:
    return f"final: {ex['final_text']} — {'yes' if ex['final_ok'] else 'NO'}"


def draw(ex: dict[str, Any], f: dict[str, Any], lay: Layout) -> np.ndarray:
    """One frame as an image of palette indices."""
    img = np.full((lay.height, lay.width), WHITE, dtype=np.uint8)
    n = ex["n"]
    text(img, 8, 8, _title(ex, f))
    sent = {(a["from"], a["chunk"]) for a in f["arrows"] if not a.get("read") and a["chunk"] is not None}
    for row in f["rows"]:
        r = row["rank"]
        text(img, 8, lay.row_mid(r) - 3, f"rank {r}")
        changed = set(row.get("changed", []))
        for i, lab in enumerate(row["labels"]):
            x, y, w, h = lay.cell(r, i)
            hot = i in changed
            _box(img, x, y, w, h, FILL[cell_kind(lab, n)], CHANGED if hot else GREY, 2 if hot else 1)
            if (r, i) in sent:
                _rect(img, x + 3, y + h - 4, w - 6, 2, MESSAGE)
            text(img, x + 4, y + (h - 7) // 2, lab)
        if row.get("sync"):
            text(img, lay.sync_x, lay.row_mid(r) - 3, "sync", SYNC)
    for a, lane in zip(f["arrows"], _lanes(f)):
        ya, yb = lay.row_mid(a["from"]), lay.row_mid(a["to"])
        x0, x = lay.arrows_x - 6, lay.arrows_x + lane * 5
        colour = SYNC if a.get("read") else MESSAGE
        _rect(img, x0, ya, x - x0 + 1, 1, colour)                       # out of the sender
        lo, hi = min(ya, yb), max(ya, yb)
        if a.get("read"):
            for y in range(lo, hi + 1, 3):
                _rect(img, x, y, 1, 2, colour)
        else:
            _rect(img, x, lo, 1, hi - lo + 1, colour)
        _rect(img, x0, yb, x - x0 + 1, 1, colour)                       # into the receiver
        for d in range(3):                                              # the arrowhead
            _rect(img, x0 + d, yb - d, 1, 2 * d + 1, colour)
    y = lay.text_y
    for line, colour in message_lines(f):
        text(img, 8, y, line, colour)
        y += LINE
    y = lay.height - 2 * LINE - 2
    if f is ex["frames"][-1]:
        text(img, 8, y, _final(ex), BLACK if ex["final_ok"] else CHANGED)
    y += LINE
    x = 8
    for colour, edge, name in ((NONE, GREY, "none"), (SOME, GREY, "some"), (ALL, GREY, "all"),
                               (WHITE, CHANGED, "changed"), (MESSAGE, MESSAGE, "sent"),
                               (SYNC, SYNC, "slot read")):
        _box(img, x, y, 8, 7, colour, edge)
        x = text(img, x + 11, y, name, GREY) + 8
    return img


def frames(ex: dict[str, Any]) -> list[np.ndarray]:
    """Every frame of ``ex`` as an image of :data:`PALETTE` indices."""
    lay = layout(ex)
    return [draw(ex, f, lay) for f in ex["frames"]]


def gif(ex: dict[str, Any], delay_cs: int = 90, last_cs: int = 300) -> bytes:
    """The animated GIF of ``ex``: one frame per step, looping, the last one held longer."""
    imgs = frames(ex)
    delays = [delay_cs] * (len(imgs) - 1) + [last_cs]
    return _gif.encode(imgs, PALETTE, delays, loop=0)
