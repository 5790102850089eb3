"""llama.cpp's reference quantizers (quantize_row_*_ref of ggml; for IQ4_NL quantize_iq4_nl,
whose search quantize_row_iq4_nl_ref skips: the ones llama-quantize uses without an
importance matrix) for the block types the mixes of mixes.py choose: Q2_K, Q3_K, Q4_K,
Q5_K, Q6_K, IQ4_XS, IQ4_NL, MXFP4, and the fallbacks Q5_0, Q5_1, Q8_0 and IQ4_NL (Q2_K's and
Q3_K's fallback Q4_0 is dtypes.quantize_q4). numpy, vectorised over blocks.

Every step is float32 in ggml's order of operations, sums included (accumulated element
after element, never pairwise), and rounding is ggml's: nearest_int (to nearest, ties to
even, through the 1.5 * 2^23 trick), C's truncating casts, roundf (ties away from zero) and
f16 conversion to nearest even. So the blocks are ggml's byte for byte (docs/FORMAT.md gives
their layouts).

quantize(values, type_name) takes float32 rows whose length is a multiple of the block and
returns uint8 rows of blocks, or None when a block's f16 scale overflows.
"""

from typing import NamedTuple

import numpy as np

import blocks

F32 = np.float32
# Sub-blocks of a K-quant super-block (QK_K = 256 weights).
SUPER_BLOCK = 256
Q4K_SUB = 32  # weights per Q4_K/Q5_K sub-block (8 of them, 6-bit scale and min each)
Q6K_SUB = 16  # weights per Q6_K sub-block (16 of them, an int8 scale each)
SCALE_LEVELS = 63  # the largest 6-bit scale or min of Q4_K/Q5_K


class Qkx2Search(NamedTuple):
    """make_qkx2_quants' arguments for one type: the levels L in 0..levels (nmax), the
    trials' multipliers levels + rmin + rdelta * step for step in 0..nstep, and whether a
    trial's error is the weighted sum of |error| (use_mad) rather than of error²."""
    levels: int
    rmin: float
    rdelta: float
    nstep: int
    absolute_error: bool


QKX2_SEARCH = {"Q2_K": Qkx2Search(3, -0.5, 0.1, 15, True),
               "Q4_K": Qkx2Search(15, -1.0, 0.1, 20, False),
               "Q5_K": Qkx2Search(31, -0.5, 0.1, 15, False)}
Q6K_LEVELS = 32  # Q6_K's q - 32 in -32..31
Q6K_STEPS = range(-9, 10)  # make_qx_quants tries nmax + 0.1 * step, step != 0
GROUP_MAX_EPS = F32(1e-15)  # ggml: a Q6_K sub-block or block smaller than this is zero
NEAREST_INT_MAGIC = F32(12582912.0)  # 1.5 * 2^23
# Blocks quantized together: their working arrays (a few MB) stay in the caches.
BLOCKS_AT_ONCE = 1024


def nearest_int(values):
    """ggml's nearest_int of float32 values (|v| < 2^22): to nearest, ties to even."""
    shifted = (np.asarray(values, dtype=F32) + NEAREST_INT_MAGIC).view(np.int32)
    return (shifted & 0x007FFFFF) - 0x00400000


def to_f16(values):
    """float32 -> f16 bits (round to nearest even; overflow to Inf)."""
    with np.errstate(over="ignore"):
        return np.asarray(values, dtype=F32).astype("<f2")


def divide(numerator, denominator):
    """numerator / denominator in float32 where the denominator is not 0, else 0."""
    safe = np.where(denominator != 0, denominator, F32(1))
    return np.where(denominator != 0, numerator / safe, F32(0)).astype(F32)


def first_extreme(x, beats):
    """Along axis 0, the first value that `beats` (np.less: the minimum; np.greater: the
    maximum) every value before it, scanning as C does; so of zeros of both signs, the
    first one wins."""
    extreme = x[0].copy()
    for row in x[1:]:
        extreme = np.where(beats(row, extreme), row, extreme)
    return extreme


def first_largest_magnitude(x):
    """Along axis 0: (the first value of the largest magnitude, sign kept, scanning as C does
    from 0; that magnitude)."""
    largest = np.zeros(x.shape[1:], dtype=F32)
    amax = np.zeros(x.shape[1:], dtype=F32)
    for row in x:
        bigger = np.abs(row) > amax
        amax = np.where(bigger, np.abs(row), amax)
        largest = np.where(bigger, row, largest)
    return largest, amax


def running_sum(terms):
    """Sum of terms[0], terms[1], ... (along axis 0) in that order, in float32."""
    total = np.zeros(terms.shape[1:], dtype=F32)
    for term in terms:
        total += term
    return total


# ------------------------------------------------------------ Q4_K and Q5_K (and Q2_K)

def make_qkx2_quants(x, weights, levels, rmin, rdelta, nstep, absolute_error):
    """ggml's make_qkx2_quants on sub-blocks given as columns (x, weights: float32
    [n, count]): a scale and a min (min <= 0, returned negated) fitted by weighted least
    squares over nstep + 1 trial scales, and the levels L in 0..`levels`; the trial kept is
    the one of the least weighted squared error, or with `absolute_error` the least
    weighted absolute error. As in ggml, a trial that lowers the error replaces the min
    that the next trials measure from. Returns (scale [count], -min [count], L uint8
    [n, count])."""
    deviation = np.abs if absolute_error else np.square
    low = first_extreme(x, np.less)
    low = np.where(low > 0, F32(0), low)
    high = first_extreme(x, np.greater)
    sum_w = running_sum(weights)
    sum_x = running_sum(weights * x)
    flat = high == low
    high = np.where(flat, low + F32(1), high)  # no division by 0; the result is replaced
    iscale = (F32(levels) / (high - low)).astype(F32)
    scale = (F32(1) / iscale).astype(F32)
    best_l = np.clip(nearest_int(iscale * (x - low)), 0, levels).astype(F32)
    best_error = running_sum(weights * deviation(scale * best_l + low - x))
    # The trials reuse these buffers (in-place operations: the same values, less traffic).
    levels_f = np.empty_like(x)
    weighted_l = np.empty_like(x)
    work = np.empty_like(x)
    for step in range(nstep + 1):
        trial = F32(rmin) + F32(rdelta) * F32(step) + F32(levels)
        iscale = (trial / (high - low)).astype(F32)
        np.subtract(x, low, out=work)
        work *= iscale
        np.clip(nearest_int(work), 0, levels, out=levels_f, casting="unsafe")
        np.multiply(weights, levels_f, out=weighted_l)
        sum_l = running_sum(weighted_l)
        sum_l2 = running_sum(np.multiply(weighted_l, levels_f, out=work))
        sum_xl = running_sum(np.multiply(weighted_l, x, out=work))
        det = sum_w * sum_l2 - sum_l * sum_l
        this_scale = divide(sum_w * sum_xl - sum_x * sum_l, det)
        this_min = divide(sum_l2 * sum_x - sum_l * sum_xl, det)
        positive = this_min > 0
        this_min = np.where(positive, F32(0), this_min)
        this_scale = np.where(positive, divide(sum_xl, sum_l2), this_scale)
        np.multiply(this_scale, levels_f, out=work)  # deviation(scale * l + min - x) * w
        work += this_min
        work -= x
        deviation(work, out=work)
        work *= weights
        error = running_sum(work)
        better = (det > 0) & (error < best_error)
        np.copyto(best_l, levels_f, where=better)
        best_error = np.where(better, error, best_error)
        scale = np.where(better, this_scale, scale)
        low = np.where(better, this_min, low)
    scale = np.where(flat, F32(0), scale)
    best_l = np.where(flat, F32(0), best_l)
    return scale, -low, best_l.astype(np.uint8)


def pack_scales_mins(ls, lm):
    """The 12 scale bytes of Q4_K/Q5_K from 6-bit scales and mins (uint8 [n, 8])."""
    packed = np.zeros((ls.shape[0], 12), dtype=np.uint8)
    packed[:, 0:4] = ls[:, :4] | ((ls[:, 4:] >> 4) << 6)
    packed[:, 4:8] = lm[:, :4] | ((lm[:, 4:] >> 4) << 6)
    packed[:, 8:12] = (ls[:, 4:] & 15) | ((lm[:, 4:] & 15) << 4)
    return packed


def quantize_k_scaled(x, type_name):
    """Q4_K or Q5_K super-blocks (float32 x [n, 256]): the f16 d and dmin, the 12 scale
    bytes, and the levels L (uint8 [n, 256], 0..15 or 0..31)."""
    search = QKX2_SEARCH[type_name]
    levels = search.levels
    count = x.shape[0]
    subs = SUPER_BLOCK // Q4K_SUB
    columns = np.ascontiguousarray(x.reshape(count * subs, Q4K_SUB).T)  # [32, n * 8]
    sum_x2 = running_sum(columns * columns)
    average = np.sqrt(sum_x2 / F32(Q4K_SUB)).astype(F32)
    weights = average + np.abs(columns)
    scales, mins, levels_l = make_qkx2_quants(columns, weights, *search)
    scales, mins = scales.reshape(count, subs), mins.reshape(count, subs)
    max_scale = np.maximum(scales.max(axis=1), F32(0))
    max_min = np.maximum(mins.max(axis=1), F32(0))
    inv_scale = divide(F32(SCALE_LEVELS), max_scale)
    inv_min = divide(F32(SCALE_LEVELS), max_min)
    # uint8 of nearest_int (C's conversion wraps), then at most 63.
    ls = np.minimum(nearest_int(inv_scale[:, None] * scales) & 0xFF, SCALE_LEVELS)
    lm = np.minimum(nearest_int(inv_min[:, None] * mins) & 0xFF, SCALE_LEVELS)
    d = to_f16(max_scale / F32(SCALE_LEVELS))
    dmin = to_f16(max_min / F32(SCALE_LEVELS))
    sub_d = d.astype(F32)[:, None] * ls.astype(F32)  # [n, 8]
    sub_m = dmin.astype(F32)[:, None] * lm.astype(F32)
    first = levels_l.T.reshape(count, subs, Q4K_SUB)
    grouped = x.reshape(count, subs, Q4K_SUB)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        ratio = (grouped + sub_m[..., None]) / sub_d[..., None]
    usable = (sub_d != 0)[..., None]
    final = np.where(usable, np.clip(nearest_int(np.where(usable, ratio, F32(0))), 0, levels),
                     first).astype(np.uint8).reshape(count, SUPER_BLOCK)
    return d, dmin, pack_scales_mins(ls.astype(np.uint8), lm.astype(np.uint8)), final


def quantize_q4_k(x):
    """Q4_K blocks (uint8 [n, 144]) of float32 super-blocks x [n, 256]."""
    d, dmin, scales, l = quantize_k_scaled(x, "Q4_K")
    chunks = l.reshape(-1, 4, 2, 32)  # chunk c: sub-blocks 2c (low nibbles), 2c + 1 (high)
    qs = (chunks[:, :, 0] | (chunks[:, :, 1] << 4)).reshape(-1, 128)
    return np.concatenate([d.view(np.uint8).reshape(-1, 2), dmin.view(np.uint8).reshape(-1, 2),
                           scales, qs], axis=1)


def quantize_q5_k(x):
    """Q5_K blocks (uint8 [n, 176]) of float32 super-blocks x [n, 256]."""
    d, dmin, scales, l = quantize_k_scaled(x, "Q5_K")
    chunks = l.reshape(-1, 4, 2, 32)
    low = chunks & 15
    qs = (low[:, :, 0] | (low[:, :, 1] << 4)).reshape(-1, 128)
    high = (chunks >> 4).astype(np.uint8)  # the 5th bit of sub-block 2c + t: bit 2c + t
    shifts = np.arange(8, dtype=np.uint8).reshape(1, 4, 2, 1)
    qh = np.bitwise_or.reduce((high << shifts).reshape(-1, 8, 32), axis=1).astype(np.uint8)
    return np.concatenate([d.view(np.uint8).reshape(-1, 2), dmin.view(np.uint8).reshape(-1, 2),
                           scales, qh, qs], axis=1)


# ------------------------------------------------------------------------------ Q6_K

def make_qx_quants(x):
    """ggml's make_qx_quants(16, 32, x, L, rmse_type 1, no weights) on sub-blocks given as
    columns (float32 [16, count]): the scale (of either sign) and the levels L in 0..63
    (l + 32). Sub-blocks whose largest |x| is below GROUP_MAX_EPS get scale 0, L 0."""
    nmax = Q6K_LEVELS
    largest, amax = first_largest_magnitude(x)
    zero = amax < GROUP_MAX_EPS
    largest = np.where(zero, F32(1), largest)
    weights = x * x

    def levels_and_sums(iscale):
        l = np.clip(nearest_int(iscale * x), -nmax, nmax - 1).astype(F32)
        sumlx = running_sum(weights * x * l)
        suml2 = running_sum(weights * l * l)
        return l, sumlx, suml2

    iscale = (F32(-nmax) / largest).astype(F32)
    best_l, sumlx, suml2 = levels_and_sums(iscale)
    scale = divide(sumlx, suml2)
    best = scale * sumlx
    for step in Q6K_STEPS:
        if step == 0:
            continue
        iscale = (-(F32(nmax) + F32(0.1) * F32(step)) / largest).astype(F32)
        l, sumlx, suml2 = levels_and_sums(iscale)
        better = (suml2 > 0) & (sumlx * sumlx > best * suml2)
        best_l = np.where(better, l, best_l)
        scale = np.where(better, divide(sumlx, suml2), scale)
        best = np.where(better, scale * sumlx, best)
    scale = np.where(zero, F32(0), scale)
    levels = np.where(zero, 0, best_l + nmax).astype(np.uint8)
    return scale, levels


def quantize_q6_k(x):
    """Q6_K blocks (uint8 [n, 210]) of float32 super-blocks x [n, 256]."""
    count = x.shape[0]
    subs = SUPER_BLOCK // Q6K_SUB
    columns = np.ascontiguousarray(x.reshape(count * subs, Q6K_SUB).T)  # [16, n * 16]
    scales, first = make_qx_quants(columns)
    scales = scales.reshape(count, subs)
    max_scale, max_abs = first_largest_magnitude(scales.T)
    zero = max_abs < GROUP_MAX_EPS
    iscale = divide(F32(-128), np.where(zero, F32(1), max_scale))
    d = to_f16(divide(F32(1), iscale))
    sub_scales = np.minimum(nearest_int(iscale[:, None] * scales), 127).astype(np.int8)
    sub_d = d.astype(F32)[:, None] * sub_scales.astype(F32)
    grouped = x.reshape(count, subs, Q6K_SUB)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        ratio = grouped / sub_d[..., None]
    usable = (sub_d != 0)[..., None]
    l = np.where(usable, np.clip(nearest_int(np.where(usable, ratio, F32(0))), -32, 31) + 32,
                 first.T.reshape(count, subs, Q6K_SUB)).astype(np.uint8)
    halves = l.reshape(count, 2, 4, 32)  # half n, quarter k: weights 128n + 32k + (0..31)
    ql = np.concatenate([halves[:, :, 0] & 15 | (halves[:, :, 2] & 15) << 4,
                         halves[:, :, 1] & 15 | (halves[:, :, 3] & 15) << 4], axis=2)
    qh = (halves[:, :, 0] >> 4 | (halves[:, :, 1] >> 4) << 2 | (halves[:, :, 2] >> 4) << 4 |
          (halves[:, :, 3] >> 4) << 6)
    out = np.concatenate([ql.reshape(count, 128), qh.reshape(count, 64),
                          sub_scales.view(np.uint8), d.view(np.uint8).reshape(-1, 2)], axis=1)
    out[zero] = 0
    return out


# ------------------------------------------------------------------------------ Q2_K

Q2K_SUB = 16  # weights per Q2_K sub-block (16 of them, a 4-bit scale and min each)
Q2K_SCALE_LEVELS = 15  # the largest 4-bit scale or min
NIBBLE = 4  # bits of a sub-block's scale (low nibble) or min (high nibble)
LOW_NIBBLE = 0x0F
LEVEL_BITS = 2  # bits of a Q2_K level


def quantize_q2_k(x):
    """Q2_K blocks (uint8 [n, 84]) of float32 super-blocks x [n, 256]: quantize_row_q2_K_ref.
    Each sub-block's scale and min from make_qkx2_quants (weights |x|, absolute errors);
    the 16 scales as nearest_int(15 / max * scale) of d = max / 15 (max: the largest scale,
    at least 0), the mins likewise of dmin; a block whose largest scale (min) is not above
    0 stores 0 for each and d (dmin) 0. The weights again as nearest_int((x + dmin * m) /
    (d * s)) in 0..3 with d and dmin rounded to f16, where d * s is not 0."""
    count = x.shape[0]
    subs = SUPER_BLOCK // Q2K_SUB
    columns = np.ascontiguousarray(x.reshape(count * subs, Q2K_SUB).T)  # [16, n * 16]
    search = QKX2_SEARCH["Q2_K"]
    scales, mins, first = make_qkx2_quants(columns, np.abs(columns), *search)
    scales, mins = scales.reshape(count, subs), mins.reshape(count, subs)

    def four_bit_levels(values):
        """(each block's scales or mins [n, 16] as 4-bit levels, uint8 [n, 16]; the f16
        step of those levels [n])."""
        largest = np.maximum(values.max(axis=1), F32(0))
        positive = largest > 0
        inverse = divide(F32(Q2K_SCALE_LEVELS), largest)
        # C's conversion of nearest_int to uint8 wraps.
        stored = np.where(positive[:, None], nearest_int(inverse[:, None] * values) & 0xFF, 0)
        step = to_f16(np.where(positive, largest / F32(Q2K_SCALE_LEVELS), F32(0)))
        return stored.astype(np.uint8), step

    ls, d = four_bit_levels(scales)
    lm, dmin = four_bit_levels(mins)
    packed = ls | (lm << NIBBLE)  # scales[i]: the scale's level low, the min's high (8 bits)
    sub_d = d.astype(F32)[:, None] * (packed & LOW_NIBBLE).astype(F32)  # [n, 16]
    sub_m = dmin.astype(F32)[:, None] * (packed >> NIBBLE).astype(F32)
    grouped = x.reshape(count, subs, Q2K_SUB)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        ratio = (grouped + sub_m[..., None]) / sub_d[..., None]
    usable = (sub_d != 0)[..., None]
    q = np.where(usable, np.clip(nearest_int(np.where(usable, ratio, F32(0))), 0,
                                 search.levels),
                 first.T.reshape(count, subs, Q2K_SUB)).astype(np.uint8)
    quarters = q.reshape(count, 2, 4, 32)  # weight 128h + 32t + l
    # qs[32h + l]: bits 2t, 2t + 1 the level of weight 128h + 32t + l.
    shifts = (LEVEL_BITS * np.arange(4, dtype=np.uint8))[:, None]
    qs = np.bitwise_or.reduce(quarters << shifts, axis=2).reshape(count, 64)
    return np.concatenate([packed, qs.astype(np.uint8), d.view(np.uint8).reshape(-1, 2),
                           dmin.view(np.uint8).reshape(-1, 2)], axis=1)


# ------------------------------------------------------------------------------ Q3_K

Q3K_SUB = 16  # weights per Q3_K sub-block (16 of them, a 6-bit scale each)
Q3K_LEVELS = 4  # make_q3_quants' nmax: q - 4 in -4..3
Q3K_TRIES = 5  # make_q3_quants' passes of its coordinate descent
Q3K_SCALE_LEVELS = 32  # a sub-block scale l in -32..31 is stored as l + 32 (6 bits)


def make_q3_quants(x):
    """ggml's make_q3_quants(16, 4, x, L, do_rmse true) on sub-blocks given as columns
    (float32 [16, count]): levels from the multiplier -4 / max (max: the first value of the
    largest magnitude, sign kept), then up to five passes over the weights, each weight
    moved to nearest_int(x * sl2 / slx) (sums without it, weights x²) where that raises
    sumlx² / suml2; the least-squares scale sumlx / suml2. ggml stops after a pass that
    changes nothing; such a pass leaves the state as it was, so every later one would
    change nothing either: all five run here. Returns (scale [count], L uint8 [16, count]
    in 0..7); sub-blocks whose largest |x| is below GROUP_MAX_EPS get scale 0 and L 0 (not
    4)."""
    nmax = Q3K_LEVELS
    largest, amax = first_largest_magnitude(x)
    zero = amax < GROUP_MAX_EPS
    largest = np.where(zero, F32(1), largest)
    iscale = (F32(-nmax) / largest).astype(F32)
    levels = np.clip(nearest_int(iscale * x), -nmax, nmax - 1).astype(F32)
    weights = x * x
    weighted_x = weights * x  # ggml's w*x[i]*l is (w * x) * l
    sumlx = running_sum(weighted_x * levels)
    suml2 = running_sum(weights * levels * levels)
    for _ in range(Q3K_TRIES):
        for i in range(len(x)):
            wx, w, l = weighted_x[i], weights[i], levels[i]
            slx = sumlx - wx * l
            sl2 = suml2 - w * l * l
            positive = slx > 0
            new_l = np.clip(nearest_int(x[i] * sl2 / np.where(positive, slx, F32(1))),
                            -nmax, nmax - 1).astype(F32)
            slx = slx + wx * new_l
            sl2 = sl2 + w * new_l * new_l
            better = (positive & (new_l != l) & (sl2 > 0) &
                      (slx * slx * suml2 > sumlx * sumlx * sl2))
            levels[i] = np.where(better, new_l, l)
            sumlx = np.where(better, slx, sumlx)
            suml2 = np.where(better, sl2, suml2)
    scale = np.where(zero, F32(0), np.where(suml2 > 0, divide(sumlx, suml2), F32(0)))
    levels = np.where(zero, 0, levels + nmax).astype(np.uint8)
    return scale.astype(F32), levels


def quantize_q3_k(x):
    """Q3_K blocks (uint8 [n, 110]) of float32 super-blocks x [n, 256]: quantize_row_q3_K_ref.
    Each sub-block's scale from make_q3_quants; the 16 scales as l in -32..31 of d =
    1 / (-32 / max) (max: the first scale of the largest magnitude), stored l + 32; the
    weights again as nearest_int(x / (d * l)) in -4..3 with d rounded to f16, where that
    is not 0. A block whose scales are all 0 stores 0 for each (not 32) and d 0."""
    count = x.shape[0]
    subs = SUPER_BLOCK // Q3K_SUB
    columns = np.ascontiguousarray(x.reshape(count * subs, Q3K_SUB).T)  # [16, n * 16]
    scales, first = make_q3_quants(columns)
    scales = scales.reshape(count, subs)
    max_scale, _ = first_largest_magnitude(scales.T)
    nonzero = max_scale != 0
    iscale = (F32(-Q3K_SCALE_LEVELS) / np.where(nonzero, max_scale, F32(1))).astype(F32)
    l = np.clip(nearest_int(iscale[:, None] * scales), -Q3K_SCALE_LEVELS,
                Q3K_SCALE_LEVELS - 1)
    stored = np.where(nonzero[:, None], l + Q3K_SCALE_LEVELS, 0).astype(np.uint8)
    d = to_f16(np.where(nonzero, F32(1) / iscale, F32(0)))
    sub_d = d.astype(F32)[:, None] * (stored.astype(F32) - F32(Q3K_SCALE_LEVELS))  # [n, 16]
    grouped = x.reshape(count, subs, Q3K_SUB)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        ratio = grouped / sub_d[..., None]
    usable = (sub_d != 0)[..., None]
    q = np.where(usable, np.clip(nearest_int(np.where(usable, ratio, F32(0))), -Q3K_LEVELS,
                                 Q3K_LEVELS - 1) + Q3K_LEVELS,
                 first.T.reshape(count, subs, Q3K_SUB)).astype(np.uint8)
    quarters = q.reshape(count, 2, 4, 32)  # weight 128h + 32t + l
    # qs[32h + l]: bits 2t, 2t + 1 the low 2 bits of weight 128h + 32t + l.
    qs = np.bitwise_or.reduce((quarters & 3) << (2 * np.arange(4, dtype=np.uint8))[:, None],
                              axis=2).reshape(count, 64)
    # hmask[l]: bit 4h + t the top bit of weight 128h + 32t + l.
    hmask = np.bitwise_or.reduce((quarters >> 2).reshape(count, 8, 32)
                                 << np.arange(8, dtype=np.uint8)[:, None], axis=1)
    # scales[j] (j < 8): low nibble sub-block j's low 4 bits, high nibble sub-block j + 8's;
    # scales[8 + k]: bits 2g, 2g + 1 the top 2 bits of sub-block 4g + k.
    low = (stored[:, :8] & 15) | ((stored[:, 8:] & 15) << 4)
    high = np.bitwise_or.reduce((stored >> 4).reshape(count, 4, 4)
                                << (2 * np.arange(4, dtype=np.uint8))[:, None], axis=1)
    return np.concatenate([hmask.astype(np.uint8), qs.astype(np.uint8), low.astype(np.uint8),
                           high.astype(np.uint8), d.view(np.uint8).reshape(-1, 2)], axis=1)


# ------------------------------------------------------------------ Q5_0, Q5_1, Q8_0

def pack_5_bit(q):
    """qh (4 bytes, u32 LE: bit j is the 5th bit of weight j) and qs (16 bytes: weight j
    low nibble, j + 16 high) of 32 5-bit values per block (uint8 [n, 32])."""
    qs = (q[:, :16] & 15) | ((q[:, 16:] & 15) << 4)
    bits = (q >> 4).astype(np.uint32) << np.arange(32, dtype=np.uint32)
    qh = np.bitwise_or.reduce(bits, axis=1).astype("<u4").view(np.uint8).reshape(-1, 4)
    return qh, qs


def quantize_q5_0(x):
    """Q5_0 blocks (uint8 [n, 22]) of float32 blocks x [n, 32]."""
    index = np.abs(x).argmax(axis=1)  # the first of the largest magnitude
    largest = x[np.arange(len(x)), index]
    largest = np.where(largest != 0, largest, F32(0))  # ggml starts from +0
    d = (largest / F32(-16)).astype(F32)
    inverse = divide(F32(1), d)
    q = np.minimum(np.trunc(x * inverse[:, None] + F32(16.5)), 31).astype(np.uint8)
    qh, qs = pack_5_bit(q)
    return np.concatenate([to_f16(d).view(np.uint8).reshape(-1, 2), qh, qs], axis=1)


def quantize_q5_1(x):
    """Q5_1 blocks (uint8 [n, 24]) of float32 blocks x [n, 32]."""
    low, high = first_extreme(x.T, np.less), first_extreme(x.T, np.greater)
    d = ((high - low) / F32(31)).astype(F32)
    inverse = divide(F32(1), d)
    q = np.trunc((x - low[:, None]) * inverse[:, None] + F32(0.5)).astype(np.uint8)
    qh, qs = pack_5_bit(q)
    return np.concatenate([to_f16(d).view(np.uint8).reshape(-1, 2),
                           to_f16(low).view(np.uint8).reshape(-1, 2), qh, qs], axis=1)


def quantize_q8_0(values):
    """ggml's Q8_0 of a float32 matrix [rows, cols] (cols a multiple of 32), in barellm's
    storage: (int8 values [rows, cols], f16 scales [rows, cols / 32]). d = max|x| / 127
    in float32; q = roundf(x * (1 / d)) with the unrounded d; the scale stored is d rounded
    to f16 (Inf when it overflows, for the caller to refuse)."""
    rows, cols = values.shape
    grouped = values.reshape(rows, cols // 32, 32)
    # Where 1 / d overflows (d below about 3e-39), x * (1 / d) is Inf or NaN, as in ggml:
    # such a scale is 0 as an f16, whatever the values.
    with np.errstate(over="ignore", invalid="ignore", under="ignore"):
        d = (np.abs(grouped).max(axis=2) / F32(127)).astype(F32)
        scaled = grouped * divide(F32(1), d)[..., None]
        whole = np.trunc(scaled)  # roundf: ties away from 0 (scaled - whole is exact)
        rounded = np.where(np.abs(scaled - whole) >= F32(0.5), whole + np.sign(scaled), whole)
        # roundf of x * id, |x * id| <= 127 up to rounding: never beyond the int8 range.
        values = np.nan_to_num(rounded, nan=0, posinf=0, neginf=0).astype(np.int8)
    return values.reshape(rows, cols), to_f16(d)


# ---------------------------------------------------------------------- IQ4_XS, IQ4_NL

# kvalues_iq4nl: the 16 levels of IQ4_XS (and IQ4_NL), non-uniform, as float32.
IQ4_LEVELS = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113],
                      dtype=F32)
IQ4_SUB = 32  # weights per IQ4_XS sub-block (8 of them, a 6-bit scale each) and IQ4_NL block
IQ4_TRIES = range(-7, 8)  # quantize_iq4_xs's and _nl's search: multipliers (try + levels[0]) / max
IQ4_SCALE_OFFSET = 32  # a sub-block scale l in -32..31 is stored as l + 32 (6 bits)


def nearest_level(x):
    """ggml's best_index_int8 over IQ4_LEVELS of float32 x: the index of the nearest level,
    the upper of two equally near (the distances computed in float32)."""
    # upper: the first level above x (1..15 for x within the levels), counted by comparisons
    # (a 16-entry table: faster than numpy's searchsorted).
    upper = np.ones(np.shape(x), dtype=np.uint8)
    for level in IQ4_LEVELS[1:-1]:
        upper += x >= level
    index = np.where(x - np.take(IQ4_LEVELS, upper - 1) < np.take(IQ4_LEVELS, upper) - x,
                     upper - 1, upper)
    return np.where(x <= IQ4_LEVELS[0], 0, np.where(x >= IQ4_LEVELS[-1], len(IQ4_LEVELS) - 1,
                                                     index))


def iq4_sub_block_scales(x):
    """quantize_row_iq4_nl_impl's scale of each sub-block (of IQ4_NL: each block) given as a
    column (float32 [32, count]), without an importance matrix: weights x², a first
    multiplier 127 / max (max: the first value of the largest magnitude, sign kept), the
    least-squares scale of its levels, then those of the multipliers (try − 127) / max for
    each try, the best kept. Sub-blocks whose largest |x| is below GROUP_MAX_EPS get 0."""
    largest, amax = first_largest_magnitude(x)
    zero = amax < GROUP_MAX_EPS
    largest = np.where(zero, F32(1), largest)
    weights = x * x

    def sums(multiplier):
        q = IQ4_LEVELS[nearest_level(multiplier * x)]
        weighted = weights * q
        return running_sum(weighted * x), running_sum(weighted * q)

    # ggml: d = -max / levels[0], then 1 / d.
    sumqx, sumq2 = sums((F32(1) / (-largest / IQ4_LEVELS[0])).astype(F32))
    scale = np.where(sumq2 > 0, divide(sumqx, sumq2), F32(0))
    best = scale * sumqx
    for attempt in IQ4_TRIES:
        sumqx, sumq2 = sums((F32(attempt + int(IQ4_LEVELS[0])) / largest).astype(F32))
        better = (sumq2 > 0) & (sumqx * sumqx > best * sumq2)
        scale = np.where(better, divide(sumqx, sumq2), scale)
        best = np.where(better, scale * sumqx, best)
    return np.where(zero, F32(0), scale).astype(F32)


def quantize_iq4_xs(x):
    """IQ4_XS blocks (uint8 [n, 136]) of float32 super-blocks x [n, 256]."""
    count = x.shape[0]
    subs = SUPER_BLOCK // IQ4_SUB
    scales = iq4_sub_block_scales(np.ascontiguousarray(x.reshape(count * subs, IQ4_SUB).T))
    scales = scales.reshape(count, subs)
    max_scale, _ = first_largest_magnitude(scales.T)
    d = (-max_scale / F32(IQ4_SCALE_OFFSET)).astype(F32)  # -0.0 for a block of zeros
    l = np.clip(nearest_int(divide(F32(1), d)[:, None] * scales), -IQ4_SCALE_OFFSET,
                IQ4_SCALE_OFFSET - 1)
    sub_d = d[:, None] * l.astype(F32)  # ggml uses d in f32 here, not its f16 rounding
    grouped = x.reshape(count, subs, IQ4_SUB)
    levels = nearest_level(divide(F32(1), sub_d)[..., None] * grouped).astype(np.uint8)
    stored = (l + IQ4_SCALE_OFFSET).astype(np.uint16)  # 6 bits: low 4 and high 2
    scales_l = (stored[:, 0::2] & 15 | (stored[:, 1::2] & 15) << 4).astype(np.uint8)
    scales_h = np.bitwise_or.reduce((stored >> 4) << (2 * np.arange(subs, dtype=np.uint16)),
                                    axis=1).astype("<u2")
    # Byte j of a sub-block's 16: weight j in the low nibble, weight j + 16 in the high.
    half = IQ4_SUB // 2
    qs = (levels[:, :, :half] | levels[:, :, half:] << 4).reshape(count, SUPER_BLOCK // 2)
    return np.concatenate([to_f16(d).view(np.uint8).reshape(-1, 2),
                           scales_h.view(np.uint8).reshape(-1, 2), scales_l, qs], axis=1)


def quantize_iq4_nl(x):
    """IQ4_NL blocks (uint8 [n, 18]) of float32 blocks x [n, 32]: ggml's quantize_iq4_nl
    without an importance matrix. The block's scale d from iq4_sub_block_scales, stored as
    f16; the weights again as the nearest level of x × (1 / d), d in float32 (x × 0 where
    d is 0)."""
    scales = iq4_sub_block_scales(np.ascontiguousarray(x.T))
    levels = nearest_level(divide(F32(1), scales)[:, None] * x).astype(np.uint8)
    # Byte j: weight j in the low nibble, weight j + 16 in the high.
    half = IQ4_SUB // 2
    qs = levels[:, :half] | levels[:, half:] << 4
    return np.concatenate([to_f16(scales).view(np.uint8).reshape(-1, 2), qs], axis=1)


# ---------------------------------------------------------------------- MXFP4

# kvalues_mxfp4: the E2M1 values doubled, as float32 (the scale halves them again).
MXFP4_LEVELS = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], dtype=F32)
MXFP4_BLOCK = 32
E8M0_BIAS = 127
# The exponent is that of the block's largest magnitude less this: its largest level, 12 under
# 2^(e − 128), then lies near 2^(e − 128 + 3.6), above it.
MXFP4_LARGEST_LEVEL_EXPONENT = 2
E8M0_SUBNORMAL_BELOW = 2  # exponents below this give a subnormal f32 scale


def mxfp4_scale(exponents):
    """2^(e − 128) as float32 of uint8 exponents e (ggml's GGML_E8M0_TO_FP32_HALF)."""
    e = exponents.astype(np.uint32)
    bits = np.where(e < E8M0_SUBNORMAL_BELOW, np.uint32(0x00200000) << e,
                    (e - np.uint32(1)) << np.uint32(23))
    return bits.astype(np.uint32).view(F32)


def quantize_mxfp4(x):
    """MXFP4 blocks (uint8 [n, 17]) of float32 blocks x [n, 32]: ggml's quantize_row_mxfp4_ref.
    The exponent e = floor(log2(max |x|)) − 2 + 127 (0 for a block of zeros); each weight the
    index of the level nearest x in units of 2^(e − 128) (the distances in float32; the first
    of two equally near)."""
    amax = np.max(np.abs(x), axis=1)
    with np.errstate(divide="ignore"):
        exponents = np.where(amax > 0, np.floor(np.log2(amax)) - MXFP4_LARGEST_LEVEL_EXPONENT
                             + E8M0_BIAS, 0).astype(np.uint8)
    scale = mxfp4_scale(exponents)
    distances = np.abs(scale[:, None, None] * MXFP4_LEVELS - x[:, :, None])
    levels = np.argmin(distances, axis=2).astype(np.uint8)
    # Byte j: weight j in the low nibble, weight j + 16 in the high.
    half = MXFP4_BLOCK // 2
    qs = levels[:, :half] | levels[:, half:] << 4
    return np.concatenate([exponents[:, None], qs], axis=1)


BLOCK_QUANTIZERS = {"IQ4_XS": quantize_iq4_xs, "IQ4_NL": quantize_iq4_nl,
                    "Q2_K": quantize_q2_k, "Q3_K": quantize_q3_k,
                    "Q4_K": quantize_q4_k, "Q5_K": quantize_q5_k, "Q6_K": quantize_q6_k,
                    "Q5_0": quantize_q5_0, "Q5_1": quantize_q5_1, "MXFP4": quantize_mxfp4}


def quantize(values, type_name):
    """The rows (float32 [rows, cols], cols a multiple of the block) as rows of
    `type_name` blocks (uint8 [rows, row bytes]); None when an f16 field of a block
    overflows (values beyond the type's range)."""
    block = blocks.BLOCK_TYPES[type_name]
    rows = values.shape[0]
    flat = np.ascontiguousarray(values, dtype=F32).reshape(-1, block.weights)
    # A scale that overflows f16 makes Inf and NaN on the way: the result is refused.
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        out = np.concatenate([BLOCK_QUANTIZERS[type_name](flat[start:start + BLOCKS_AT_ONCE])
                              for start in range(0, len(flat), BLOCKS_AT_ONCE)])
    for offset in block.f16_fields:
        if not np.isfinite(out[:, offset:offset + 2].copy().view("<f2")).all():
            return None
    return out.reshape(rows, -1)
