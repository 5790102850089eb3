#!/usr/bin/env python3
"""Draws the figures of docs/TOUR.md as SVG files in docs/figures/ (plain text, no
third-party package).

    python3 scripts/make_figures.py                 # redraw every figure
    python3 scripts/make_figures.py --measure MODEL # first run `build/barellm ladder MODEL`
                                                    # and save its output for the bar chart
    python3 scripts/make_figures.py --output DIR    # write into DIR instead

Figures:
  transformer_block.svg  one block of CpuBackend::forward with stories260K's tensor shapes
  kv_cache_gqa.svg       the KV cache of one layer, and which KV head each query head reads
  prefill_gemm.svg       the prefill GEMM's tiles, sizes read from the constants of
                         src/cpu/avx2/: avx2.h, helpers_avx2.h and gemm_avx2.cpp
  gpu_decode.svg         the kernels of one decode step on the GPU and what each reads
  ladder.svg             tok/s per rung of `barellm ladder`, from docs/figures/ladder.txt
                         (the saved output of a real run, the command on its first line)

Every figure is a function of the code's constants and the saved ladder output, so
redrawing gives identical files (tests/test_figures.py checks it)."""

import argparse
import html
import os
import re
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIGURES = os.path.join(REPO, "docs", "figures")
LADDER_OUTPUT = "ladder.txt"

# stories260K (../shared/models/stories260K/config.json), the model the figures draw.
STORIES = {"dim": 64, "hidden_dim": 172, "layers": 5, "heads": 8, "kv_heads": 4,
           "head_dim": 8, "vocab_size": 512, "context": 512}

FONT = "DejaVu Sans, Helvetica, Arial, sans-serif"
INK, MUTED, LINE = "#1f2933", "#52606d", "#7b8794"
FILLS = {"norm": "#e3f2fd", "matmul": "#fff3e0", "attention": "#e8f5e9", "cache": "#f3e5f5",
         "plain": "#f5f7fa", "residual": "#fce4ec"}
HEAD_COLOURS = ["#90caf9", "#a5d6a7", "#ffcc80", "#ce93d8"]


class Svg:
    """An SVG document built element by element; numbers written with one decimal at most,
    so that the text is the same on every run."""

    def __init__(self, width, height, title):
        self.width, self.height = width, height
        self.parts = [f'<title>{html.escape(title)}</title>',
                      f'<rect x="0" y="0" width="{width}" height="{height}" fill="#ffffff"/>']

    @staticmethod
    def number(value):
        text = f"{value:.1f}"
        return text[:-2] if text.endswith(".0") else text

    def rect(self, x, y, width, height, fill, stroke=LINE, radius=4, dash=False):
        n = self.number
        extra = ' stroke-dasharray="4 3"' if dash else ""
        self.parts.append(f'<rect x="{n(x)}" y="{n(y)}" width="{n(width)}" height="{n(height)}" '
                          f'rx="{radius}" fill="{fill}" stroke="{stroke}"{extra}/>')

    def text(self, x, y, content, size=13, anchor="start", weight="normal", colour=INK,
             mono=False):
        family = "DejaVu Sans Mono, Menlo, Consolas, monospace" if mono else FONT
        self.parts.append(
            f'<text x="{self.number(x)}" y="{self.number(y)}" font-family="{family}" '
            f'font-size="{size}" font-weight="{weight}" text-anchor="{anchor}" '
            f'fill="{colour}">{html.escape(content)}</text>')

    def line(self, x1, y1, x2, y2, colour=LINE, arrow=False, width=1.5):
        n = self.number
        head = ' marker-end="url(#arrow)"' if arrow else ""
        self.parts.append(f'<line x1="{n(x1)}" y1="{n(y1)}" x2="{n(x2)}" y2="{n(y2)}" '
                          f'stroke="{colour}" stroke-width="{width}"{head}/>')

    def circle(self, x, y, radius, fill, stroke=LINE):
        n = self.number
        self.parts.append(f'<circle cx="{n(x)}" cy="{n(y)}" r="{n(radius)}" fill="{fill}" '
                          f'stroke="{stroke}"/>')

    def document(self):
        marker = ('<defs><marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" '
                  'markerWidth="7" markerHeight="7" orient="auto-start-reverse">'
                  f'<path d="M 0 0 L 10 5 L 0 10 z" fill="{LINE}"/></marker></defs>')
        return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{self.width}" '
                f'height="{self.height}" viewBox="0 0 {self.width} {self.height}">\n'
                + marker + "\n" + "\n".join(self.parts) + "\n</svg>\n")


# ---- 1. One transformer block

def transformer_block():
    c = STORIES
    q_dim, kv_dim = c["heads"] * c["head_dim"], c["kv_heads"] * c["head_dim"]
    d, hidden = c["dim"], c["hidden_dim"]
    steps = [  # (kind, what, kernel, shape), top to bottom
        ("norm", "RMSNorm (attn_norm)", "cpu::rmsnorm", f"x [{d}] → xb [{d}]"),
        ("matmul", "q, k, v = wq·xb, wk·xb, wv·xb", "cpu::matvec_many",
         f"q [{q_dim}] = {c['heads']} heads × {c['head_dim']};  "
         f"k, v [{kv_dim}] = {c['kv_heads']} × {c['head_dim']}"),
        ("attention", "RoPE: rotate q and k by position", "cpu::rope",
         f"{c['head_dim'] // 2} pairs (i, i + {c['head_dim'] // 2}) per head"),
        ("cache", "store k and v in the cache, row pos", "cpu::kv_store",
         f"2 × [{kv_dim}] into [{c['context']}, {kv_dim}] per layer"),
        ("attention", "attention over positions 0..pos", "cpu::attention",
         f"scores [{c['heads']}, pos+1] → att [{q_dim}]"),
        ("matmul", "proj = wo · att, then x += proj", "cpu::matvec",
         f"[{d}, {q_dim}] · [{q_dim}] → [{d}]"),
        ("norm", "RMSNorm (ffn_norm)", "cpu::rmsnorm", f"x [{d}] → xb [{d}]"),
        ("matmul", "gate = w1·xb, up = w3·xb", "cpu::matvec_many",
         f"[{hidden}, {d}] · [{d}] → [{hidden}] each"),
        ("norm", "SwiGLU: silu(gate) * up", "cpu::swiglu", f"[{hidden}]"),
        ("matmul", "proj = w2 · gate, then x += proj", "cpu::matvec",
         f"[{d}, {hidden}] · [{hidden}] → [{d}]"),
    ]
    box_x, box_width, box_height, gap, top = 110, 300, 44, 14, 96
    height = top + len(steps) * (box_height + gap) + 70
    svg = Svg(820, height, "One transformer block of stories260K")
    svg.text(20, 30, f"One transformer block (repeated {c['layers']} times): stories260K, "
             f"dim {d}, hidden {hidden}", size=16, weight="bold")
    svg.text(20, 52, "CpuBackend::forward: each box is one kernel call; the residual stream x "
             "only ever receives additions", size=12, colour=MUTED)
    residual_x = 60
    svg.text(residual_x, top - 20, f"x [{d}]", anchor="middle", weight="bold")
    svg.text(residual_x, top - 6, "residual stream", size=11, anchor="middle", colour=MUTED)
    bottom = top + len(steps) * (box_height + gap) - gap
    svg.line(residual_x, top, residual_x, bottom + 30, colour="#c2185b", width=3, arrow=True)
    svg.text(residual_x, bottom + 48, "x to the next block", size=11, anchor="middle",
             colour=MUTED)
    for i, (kind, what, kernel, shape) in enumerate(steps):
        y = top + i * (box_height + gap)
        svg.rect(box_x, y, box_width, box_height, FILLS[kind])
        svg.text(box_x + 10, y + 18, what, size=13)
        svg.text(box_x + 10, y + 35, kernel, size=11, colour=MUTED, mono=True)
        svg.text(box_x + box_width + 16, y + 27, shape, size=12, mono=True)
        if i + 1 < len(steps):
            svg.line(box_x + box_width / 2, y + box_height, box_x + box_width / 2,
                     y + box_height + gap, arrow=True)
        if what.startswith("RMSNorm"):  # reads x
            svg.line(residual_x, y + box_height / 2, box_x, y + box_height / 2, arrow=True)
        if what.endswith("x += proj"):  # adds to x
            svg.line(box_x, y + box_height / 2, residual_x + 10, y + box_height / 2,
                     colour="#c2185b", arrow=True)
            svg.circle(residual_x, y + box_height / 2, 9, FILLS["residual"], stroke="#c2185b")
            svg.text(residual_x, y + box_height / 2 + 5, "+", size=15, anchor="middle",
                     weight="bold", colour="#c2185b")
    return svg.document()


# ---- 2. The KV cache and grouped-query attention

def kv_cache_gqa():
    c = STORIES
    group = c["heads"] // c["kv_heads"]
    kv_dim = c["kv_heads"] * c["head_dim"]
    shown_positions, pos = 10, 6
    column_width, row_height, grid_x, grid_top = 8, 22, 370, 120
    svg = Svg(1090, 470, "KV cache layout and grouped-query attention")
    svg.text(20, 30, "The KV cache of one layer, and grouped-query attention (stories260K)",
             size=16, weight="bold")
    svg.text(20, 52, f"{c['heads']} query heads share {c['kv_heads']} KV heads: query head h "
             f"reads KV head h / {group}; the cache holds {c['kv_heads']} × {c['head_dim']} = "
             f"{kv_dim} values per position, not {c['heads'] * c['head_dim']}", size=12,
             colour=MUTED)
    # Query heads and their KV heads.
    svg.text(40, grid_top - 14, "query heads (q)", size=12, weight="bold")
    svg.text(190, grid_top - 14, "KV heads", size=12, weight="bold")
    for h in range(c["heads"]):
        y = grid_top + h * 30
        svg.rect(40, y, 90, 22, HEAD_COLOURS[h // group])
        svg.text(85, y + 15, f"q head {h}", size=12, anchor="middle")
        kv_y = grid_top + (h // group) * 60 + 15
        svg.line(130, y + 11, 190, kv_y + 11, arrow=True)
    for k in range(c["kv_heads"]):
        y = grid_top + k * 60 + 15
        svg.rect(190, y, 90, 22, HEAD_COLOURS[k])
        svg.text(235, y + 15, f"KV head {k}", size=12, anchor="middle")
    # The two caches of this layer: rows = positions, columns = kv_dim in head blocks.
    for index, name in enumerate(("key_cache (K)", "value_cache (V)")):
        x0 = grid_x + index * (kv_dim * column_width + 40)
        svg.text(x0, grid_top - 30, name, size=12, weight="bold")
        for k in range(c["kv_heads"]):
            svg.text(x0 + (k + 0.5) * c["head_dim"] * column_width, grid_top - 8, f"head {k}", size=10,
                     anchor="middle", colour=MUTED)
        for row in range(shown_positions):
            for k in range(c["kv_heads"]):
                fill = HEAD_COLOURS[k] if row < pos else ("#ffffff" if row > pos else "#fff59d")
                svg.rect(x0 + k * c["head_dim"] * column_width, grid_top + row * row_height,
                         c["head_dim"] * column_width, row_height, fill, radius=0)
            if index == 0:
                svg.text(x0 - 6, grid_top + row * row_height + 15, f"pos {row}", size=10,
                         anchor="end", colour=MUTED)
            elif row == pos:
                svg.text(x0 + kv_dim * column_width + 8, grid_top + row * row_height + 15,
                         "← pos: written now", size=11, weight="bold")
        svg.text(x0 + kv_dim * column_width / 2, grid_top + shown_positions * row_height + 18,
                 f"{kv_dim} values per row", size=11, anchor="middle", colour=MUTED)
    svg.text(20, grid_top + shown_positions * row_height + 55,
             f"Each cache is [layers {c['layers']}, context {c['context']}, kv_dim {kv_dim}], "
             f"f16 by default: one row is {kv_dim * 2} bytes; K and V of every layer, "
             f"{2 * c['layers'] * kv_dim * 2} bytes per position.", size=12)
    svg.text(20, grid_top + shown_positions * row_height + 75,
             "Decode at position pos writes row pos (yellow) and reads rows 0..pos of its KV "
             "head's columns; rows after pos are not yet written.", size=12)
    return svg.document()


# ---- 3. The prefill GEMM tiling

def cpp_constants():
    """The integer constants of the prefill GEMM, read from the source (`constexpr int kX =
    expression;`, the expression made of numbers and earlier constants)."""
    values = {}
    for file_name in ("helpers_avx2.h", "avx2.h", "gemm_avx2.cpp"):
        with open(os.path.join(REPO, "src", "cpu", "avx2", file_name), encoding="utf-8") as f:
            for name, expression in re.findall(r"constexpr int (k\w+) = ([^;]+);", f.read()):
                tokens = re.findall(r"k\w+|\d+|[*+/()-]", expression)
                if "".join(tokens) != expression.replace(" ", ""):
                    continue
                values[name] = eval("".join(str(values.get(t, t)) for t in tokens), {}, {})
    return values


def prefill_gemm():
    k = cpp_constants()
    token_tile, row_tile, row_block, depth, lanes = (
        k["kTokenTile"], k["kRowTile"], k["kRowBlock"], k["kDepthBlock"], k["kLanes"])
    panel_kib = row_block * depth * 4 // 1024
    tile_kib = depth * token_tile * 4 // 1024
    registers = row_tile * token_tile // lanes
    svg = Svg(980, 580, "The prefill GEMM tiling")
    svg.text(20, 30, "Prefill: out[token][row] = Σ W[row][col] · x[token][col] as tiles "
             "(avx2::gemm_rows)", size=16, weight="bold")
    svg.text(20, 52, "sizes from the constants kRowBlock, kDepthBlock, kTokenTile, kRowTile "
             "and kLanes in src/cpu/", size=12, colour=MUTED)
    # W, with one panel highlighted.
    wx, wy, ww, wh = 40, 100, 300, 380
    svg.rect(wx, wy, ww, wh, FILLS["plain"])
    svg.text(wx + ww / 2, wy - 10, "W [rows, cols] (f32, f16, bf16 or q8)", size=12,
             anchor="middle", weight="bold")
    px, py, pw, ph = wx + 60, wy + 80, 120, 130
    svg.rect(px, py, pw, ph, FILLS["matmul"], stroke="#e65100")
    svg.text(px + pw / 2, py + 20, "panel", size=12, anchor="middle", weight="bold")
    svg.text(px + pw / 2, py + 38, f"{row_block} rows ×", size=11, anchor="middle")
    svg.text(px + pw / 2, py + 53, f"{depth} cols, f32", size=11, anchor="middle")
    svg.text(px + pw / 2, py + 70, f"{panel_kib} KiB: in L2", size=11, anchor="middle")
    svg.text(px + pw / 2, py + 85, "(avx2::pack_rows)", size=10, anchor="middle", colour=MUTED)
    for r in range(1, row_block // row_tile):
        if r < 4:
            svg.line(px, py + 90 + r * 10, px + pw, py + 90 + r * 10, colour="#ffab91", width=1)
    svg.text(px + pw + 8, py + 104, f"{row_tile} rows at a time", size=10, colour=MUTED)
    svg.text(wx + ww / 2, wy + wh + 20, "the threads take rows in chunks from a shared counter;",
             size=11, anchor="middle", colour=MUTED)
    svg.text(wx + ww / 2, wy + wh + 36, f"each block of rows: one panel of {depth} columns after "
             "another", size=11, anchor="middle", colour=MUTED)
    # x tiles.
    tx, ty = 430, 100
    svg.text(tx, ty - 10, f"x transposed into tiles of {token_tile} tokens (avx2::pack_token_tile)",
             size=12, weight="bold")
    for t in range(4):
        fill = FILLS["attention"] if t == 1 else FILLS["plain"]
        svg.rect(tx + t * 70, ty, 60, 200, fill, stroke="#2e7d32" if t == 1 else LINE)
        svg.text(tx + t * 70 + 30, ty + 215, f"tile {t}", size=11, anchor="middle", colour=MUTED)
    svg.text(tx + 100, ty + 90, f"{depth} cols ×", size=11, anchor="middle")
    svg.text(tx + 100, ty + 105, f"{token_tile} tokens", size=11, anchor="middle")
    svg.text(tx + 100, ty + 120, f"{tile_kib} KiB: L1", size=11, anchor="middle")
    svg.text(tx + 280, ty + 100, "each tile in turn meets", size=11, colour=MUTED)
    svg.text(tx + 280, ty + 115, "every row of the panel", size=11, colour=MUTED)
    # The micro-kernel.
    mx, my, cw, ch = 430, 380, 22, 22
    svg.text(mx, my - 30, "micro-kernel (avx2::outer_product_kernel):", size=12, weight="bold")
    svg.text(mx, my - 14, f"{row_tile} rows × {token_tile} tokens of sums in {registers} "
             f"registers of {lanes} floats", size=12, weight="bold")
    for r in range(row_tile):
        for half in range(token_tile // lanes):
            svg.rect(mx + half * lanes * cw, my + r * ch, lanes * cw, ch,
                     HEAD_COLOURS[half], radius=0)
            svg.text(mx + (half + 0.5) * lanes * cw, my + r * ch + 15,
                     f"ymm: row {r}, tokens {half * lanes}-{half * lanes + lanes - 1}", size=10,
                     anchor="middle")
    svg.text(mx, my + row_tile * ch + 22, f"each step: load {token_tile} values of one x column "
             f"({token_tile // lanes} registers), broadcast one weight per row, {registers} FMAs;",
             size=11)
    svg.text(mx, my + row_tile * ch + 38, "no horizontal sums. The sums are transposed into out "
             "8 × 8 at a time (avx2::store_tile_sums).", size=11)
    svg.line(px + pw, py + ph / 2, tx + 70, ty + 100, colour="#e65100", arrow=True)
    svg.line(tx + 100, ty + 200, tx + 100, my - 46, colour="#2e7d32", arrow=True)
    return svg.document()


# ---- 4. The decode step on the GPU

def gpu_decode():
    c = STORIES
    d, hidden = c["dim"], c["hidden_dim"]
    qkv = (c["heads"] + 2 * c["kv_heads"]) * c["head_dim"]
    kv_dim = c["kv_heads"] * c["head_dim"]
    kernels = [  # (name, what it computes, reads, writes)
        ("matvec_kernel", "RMSNorm + q, k, v", [f"x [{d}], attn_norm", f"wqkv [{qkv}, {d}]"],
         f"qkv [{qkv}]"),
        ("attention_split_kernel", "RoPE, KV write, attention",
         ["qkv", f"K, V rows 0..pos [{kv_dim}]"], f"att [{d}], K/V row pos"),
        ("matvec_kernel", "x += wo · att", [f"att [{d}]", f"wo [{d}, {d}]"], f"x [{d}]"),
        ("matvec_swiglu_kernel", "RMSNorm + w1, w3, SwiGLU",
         [f"x [{d}], ffn_norm", f"w1, w3 [{hidden}, {d}]"], f"hidden [{hidden}]"),
        ("matvec_kernel", "x += w2 · hidden", [f"hidden [{hidden}]", f"w2 [{d}, {hidden}]"],
         f"x [{d}]"),
    ]
    box_width, box_height, gap, left, top = 170, 58, 26, 150, 130
    width = left + len(kernels) * (box_width + gap) + 150
    svg = Svg(width, 400, "The decode step on the GPU")
    svg.text(20, 30, "One decode step on the GPU (CudaBackend::record_forward), stories260K "
             "shapes", size=16, weight="bold")
    svg.text(20, 52, f"{len(kernels)} kernels per layer plus 2: "
             f"{len(kernels) * c['layers'] + 2} for stories260K, all replayed as one CUDA graph "
             "per token; matrices are read once per token, a warp per row", size=12,
             colour=MUTED)
    svg.rect(20, top, 110, box_height, FILLS["plain"])
    svg.text(75, top + 22, "embedding_kernel", size=10, anchor="middle", mono=True)
    svg.text(75, top + 40, "x = row token", size=11, anchor="middle")
    svg.line(130, top + box_height / 2, left, top + box_height / 2, arrow=True)
    layer_right = left + len(kernels) * (box_width + gap) - gap
    svg.rect(left - 8, top - 34, layer_right - left + 16, 240, "none", dash=True)
    svg.text(left, top - 16, f"× {c['layers']} layers", size=12, weight="bold", colour=MUTED)
    kinds = ["matmul", "attention", "matmul", "matmul", "matmul"]
    for i, (name, what, reads, writes) in enumerate(kernels):
        x = left + i * (box_width + gap)
        svg.rect(x, top, box_width, box_height, FILLS[kinds[i]])
        svg.text(x + box_width / 2, top + 22, name, size=10, anchor="middle", mono=True)
        svg.text(x + box_width / 2, top + 42, what, size=11, anchor="middle")
        if i + 1 < len(kernels):
            svg.line(x + box_width, top + box_height / 2, x + box_width + gap,
                     top + box_height / 2, arrow=True)
        svg.text(x + 4, top + box_height + 24, "reads:", size=11, weight="bold", colour=MUTED)
        for j, item in enumerate(reads):
            svg.text(x + 4, top + box_height + 42 + j * 16, item, size=11, mono=True)
        svg.text(x + 4, top + box_height + 94, "writes:", size=11, weight="bold", colour=MUTED)
        svg.text(x + 4, top + box_height + 112, writes, size=11, mono=True)
    final_x = layer_right + 24
    svg.line(layer_right, top + box_height / 2, final_x, top + box_height / 2, arrow=True)
    svg.rect(final_x, top, 120, box_height, FILLS["matmul"])
    svg.text(final_x + 60, top + 22, "matvec_kernel", size=10, anchor="middle", mono=True)
    svg.text(final_x + 60, top + 40, "norm + logits", size=11, anchor="middle")
    svg.text(final_x + 4, top + box_height + 24, "reads:", size=11, weight="bold", colour=MUTED)
    svg.text(final_x + 4, top + box_height + 42, f"output [{c['vocab_size']}, {d}]", size=11,
             mono=True)
    svg.text(20, 380, "The weights dominate what is read: on a 7B model each token streams "
             "every matrix once, so the speed is set by the memory bandwidth.", size=12)
    return svg.document()


# ---- 5. The ladder, from a saved run

def parse_ladder(text):
    """(command, rows, notes) of a saved `barellm ladder` output: each row a dict of the
    table's columns."""
    lines = text.splitlines()
    command = lines[0][2:] if lines and lines[0].startswith("$ ") else ""
    table = [line for line in lines if line.startswith("|")]
    header = [cell.strip() for cell in table[0].strip("|").split("|")]
    rows = [dict(zip(header, (cell.strip() for cell in line.strip("|").split("|"))))
            for line in table[2:]]
    notes = [line for line in lines if line.startswith(("other runnable tasks", "warning:"))]
    return command, rows, notes


def ladder_chart(text):
    command, rows, notes = parse_ladder(text)
    speeds = [float(row["tok/s"]) for row in rows]
    spreads = [float(row["spread"].rstrip("%")) / 100 for row in rows]
    top = max(s * (1 + p / 2) for s, p in zip(speeds, spreads))
    step = 10 ** len(str(int(top))) / 10
    scale_top = step * (int(top / step) + 1)
    left, base, chart_height, bar_width, gap = 90, 430, 330, 70, 56
    width = left + len(rows) * (bar_width + gap) + 40
    svg = Svg(width, 560 + 16 * len(notes), "barellm ladder: tok/s per rung")
    svg.text(20, 30, "barellm ladder on stories260K: tokens per second per rung", size=16,
             weight="bold")
    svg.text(20, 52, f"$ {command}", size=11, mono=True, colour=MUTED)
    prefill = next(row["rung"] for row in rows if row["what changed"].startswith("+ batched"))
    svg.text(20, 70, "bar: the mean of 3 timings; whisker: as long as their range, centred on "
             f"the mean. Rung {prefill} is prefill, the others decode.", size=12, colour=MUTED)
    for tick in range(0, 6):
        value = scale_top * tick / 5
        y = base - chart_height * tick / 5
        svg.line(left, y, width - 30, y, colour="#e4e7eb", width=1)
        svg.text(left - 8, y + 4, f"{value:,.0f}", size=11, anchor="end", colour=MUTED)
    svg.line(left, base, left, base - chart_height, colour=MUTED, width=1)
    for i, (row, speed, spread) in enumerate(zip(rows, speeds, spreads)):
        x = left + gap / 2 + i * (bar_width + gap)
        height = chart_height * speed / scale_top
        svg.rect(x, base - height, bar_width, height, HEAD_COLOURS[i % len(HEAD_COLOURS)],
                 radius=0)
        low, high = speed * (1 - spread / 2), speed * (1 + spread / 2)
        middle = x + bar_width / 2
        svg.line(middle, base - chart_height * low / scale_top, middle,
                 base - chart_height * high / scale_top, colour=INK, width=1.5)
        svg.text(middle, base - chart_height * high / scale_top - 8, f"{speed:,.0f}", size=12,
                 anchor="middle", weight="bold")
        svg.text(middle, base + 18, f"rung {row['rung']}", size=12, anchor="middle",
                 weight="bold")
        threads = "1 thread" if row["threads"] == "1" else f"{row['threads']} threads"
        svg.text(middle, base + 34, f"{row['speed-up']}, {threads}", size=11, anchor="middle",
                 colour=MUTED)
        for j, word_line in enumerate(wrap(row["what changed"], 18)[:3]):
            svg.text(middle, base + 52 + j * 14, word_line, size=10, anchor="middle")
    for j, note in enumerate(notes):
        svg.text(20, 545 + 16 * j, note, size=11, colour=MUTED)
    return svg.document()


def wrap(text, width):
    lines, current = [], ""
    for word in text.split():
        if current and len(current) + 1 + len(word) > width:
            lines.append(current)
            current = word
        else:
            current = f"{current} {word}".strip()
    return lines + [current] if current else lines


def measure_ladder(model, output_dir):
    """Runs `build/barellm ladder MODEL --threads 2` from the model's folder (so that the
    saved command and output name the file only) and saves its output."""
    barellm = os.path.join(REPO, "build", "barellm")
    folder, name = os.path.split(os.path.abspath(model))
    arguments = ["ladder", name, "--threads", "2"]
    result = subprocess.run([barellm, *arguments], cwd=folder, capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"make_figures: barellm ladder failed: {result.stderr.strip()}")
    with open(os.path.join(output_dir, LADDER_OUTPUT), "w", encoding="utf-8") as f:
        f.write("$ barellm " + " ".join(arguments) + "\n" + result.stdout)


FIGURES_DRAWN = {
    "transformer_block.svg": transformer_block,
    "kv_cache_gqa.svg": kv_cache_gqa,
    "prefill_gemm.svg": prefill_gemm,
    "gpu_decode.svg": gpu_decode,
}


def draw_all(output_dir, ladder_source):
    os.makedirs(output_dir, exist_ok=True)
    documents = {name: draw() for name, draw in FIGURES_DRAWN.items()}
    with open(ladder_source, encoding="utf-8") as f:
        documents["ladder.svg"] = ladder_chart(f.read())
    for name, document in documents.items():
        with open(os.path.join(output_dir, name), "w", encoding="utf-8") as f:
            f.write(document)
    return sorted(documents)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", default=FIGURES, help="folder to write (docs/figures)")
    parser.add_argument("--measure", metavar="MODEL",
                        help="run the ladder on MODEL first and save its output")
    args = parser.parse_args()
    os.makedirs(args.output, exist_ok=True)
    written = [os.path.join(args.output, name) for name in [*FIGURES_DRAWN, "ladder.svg",
                                                             LADDER_OUTPUT]]
    if args.measure and os.path.exists(args.measure) and any(
            os.path.exists(path) and os.path.samefile(args.measure, path) for path in written):
        parser.error(f"--measure {args.measure} is a file this script writes in {args.output}")
    if args.measure:
        measure_ladder(args.measure, args.output)
        ladder_source = os.path.join(args.output, LADDER_OUTPUT)
    else:
        ladder_source = os.path.join(FIGURES, LADDER_OUTPUT)
    for name in draw_all(args.output, ladder_source):
        print(os.path.join(args.output, name))


if __name__ == "__main__":
    main()
