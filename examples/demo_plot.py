"""A loss-curve PNG without matplotlib (zlib + a 5x7 pixel font), so `make demo` needs no extra package."""
import struct
import zlib

# 5x7 glyphs: 7 rows of 5 pixels separated by '/', '#' = ink.
_GLYPHS = {
    "0": ".###./#...#/#..##/#.#.#/##..#/#...#/.###.", "1": "..#../.##../..#../..#../..#../..#../.###.",
    "2": ".###./#...#/....#/...#./..#../.#.../#####", "3": "#####/...#./..#../...#./....#/#...#/.###.",
    "4": "...#./..##./.#.#./#..#./#####/...#./...#.", "5": "#####/#..../####./....#/....#/#...#/.###.",
    "6": "..##./.#.../#..../####./#...#/#...#/.###.", "7": "#####/....#/...#./..#../.#.../.#.../.#...",
    "8": ".###./#...#/#...#/.###./#...#/#...#/.###.", "9": ".###./#...#/#...#/.####/....#/...#./.##..",
    ".": "...../...../...../...../...../.##../.##..", "-": "...../...../...../#####/...../...../.....",
    ",": "...../...../...../...../.##../..#../.#...", " ": "...../...../...../...../...../...../.....",
    "(": "...#./..#../.#.../.#.../.#.../..#../...#.", ")": ".#.../..#../...#./...#./...#./..#../.#...",
    "a": "...../...../.###./....#/.####/#...#/.####", "c": "...../...../.###./#..../#..../#...#/.###.",
    "d": "....#/....#/.##.#/#..##/#...#/#...#/.####", "e": "...../...../.###./#...#/#####/#..../.###.",
    "h": "#..../#..../#.##./##..#/#...#/#...#/#...#", "i": "..#../...../.##../..#../..#../..#../.###.",
    "k": "#..../#..../#..#./#.#../##.../#.#../#..#.", "l": ".##../..#../..#../..#../..#../..#../.###.",
    "m": "...../...../##.#./#.#.#/#.#.#/#...#/#...#", "n": "...../...../#.##./##..#/#...#/#...#/#...#",
    "o": "...../...../.###./#...#/#...#/#...#/.###.", "p": "...../...../####./#...#/####./#..../#....",
    "r": "...../...../#.##./##..#/#..../#..../#....", "s": "...../...../.####/#..../.###./....#/####.",
    "t": ".#.../.#.../###../.#.../.#.../.#..#/..##.", "u": "...../...../#...#/#...#/#...#/#..##/.##.#",
    "w": "...../...../#...#/#...#/#.#.#/#.#.#/.#.#.", "x": "...../...../#...#/.#.#./..#../.#.#./#...#",
    "y": "...../...../#...#/#...#/.####/....#/.###.", ":": "...../.##../.##../...../.##../.##../.....",
}
_FONT = {ch: [row for row in rows.split("/")] for ch, rows in _GLYPHS.items()}
assert all(len(rows) == 7 and all(len(r) == 5 for r in rows) for rows in _FONT.values())

WHITE, BLACK, GREY = (255, 255, 255), (40, 40, 40), (200, 200, 200)
BLUE, ORANGE, RED = (31, 119, 180), (255, 127, 14), (214, 39, 40)


class Canvas:
    def __init__(self, width, height):
        self.width, self.height = width, height
        self.pixels = [[WHITE] * width for _ in range(height)]

    def dot(self, x, y, color, size=1):
        for dy in range(size):
            for dx in range(size):
                px, py = int(x) + dx - size // 2, int(y) + dy - size // 2
                if 0 <= px < self.width and 0 <= py < self.height:
                    self.pixels[py][px] = color

    def line(self, x0, y0, x1, y1, color, size=1):
        steps = int(max(abs(x1 - x0), abs(y1 - y0), 1))
        for i in range(steps + 1):
            self.dot(x0 + (x1 - x0) * i / steps, y0 + (y1 - y0) * i / steps, color, size)

    def text(self, x, y, string, color=BLACK):
        for ch in string:
            rows = _FONT.get(ch, _FONT[" "])
            for row in range(7):
                for col in range(5):
                    if rows[row][col] == "#":
                        self.dot(x + col, y + row, color)
            x += 6

    def png(self):
        raw = b"".join(b"\x00" + bytes(c for px in row for c in px) for row in self.pixels)

        def chunk(kind, data):
            return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
        header = struct.pack(">IIBBBBB", self.width, self.height, 8, 2, 0, 0, 0)
        return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw, 9)) + \
            chunk(b"IEND", b"")


def loss_curve_png(path, full, resumed, checkpoint_step, width=640, height=400):
    """full/resumed: {step: loss}. Blue line = uninterrupted run, orange dots = resumed run."""
    canvas = Canvas(width, height)
    left, right, top, bottom = 60, width - 20, 40, height - 40
    steps = sorted(full)
    lo, hi = min(full.values()), max(full.values())
    hi = hi if hi > lo else lo + 1
    sx = lambda s: left + (right - left) * (s - steps[0]) / max(1, steps[-1] - steps[0])  # noqa: E731
    sy = lambda v: bottom - (bottom - top) * (v - lo) / (hi - lo)  # noqa: E731
    for i in range(5):  # horizontal grid with loss labels
        value = lo + (hi - lo) * i / 4
        canvas.line(left, sy(value), right, sy(value), GREY)
        canvas.text(6, sy(value) - 3, f"{value:.2f}")
    canvas.line(left, top, left, bottom, BLACK)
    canvas.line(left, bottom, right, bottom, BLACK)
    for s in (steps[0], checkpoint_step, steps[-1]):
        canvas.text(sx(s) - 3 * len(str(s)), bottom + 6, str(s))
    canvas.text(right - 24, bottom + 18, "step")
    canvas.line(sx(checkpoint_step), top, sx(checkpoint_step), bottom, RED)
    canvas.text(sx(checkpoint_step) + 4, top + 4, "checkpoint, kill -9", RED)
    for a, b in zip(steps, steps[1:]):
        canvas.line(sx(a), sy(full[a]), sx(b), sy(full[b]), BLUE, 2)
    for s, v in resumed.items():
        canvas.dot(sx(s), sy(v), ORANGE, 5)
    canvas.text(left, 12, "loss: uninterrupted (line)", BLUE)
    canvas.text(left + 6 * 28, 12, "resumed (dots)", ORANGE)
    with open(path, "wb") as f:
        f.write(canvas.png())
