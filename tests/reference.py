"""Slow, obvious NumPy versions of every numbapos op: the oracles the tests trust.

Nothing here is clever; each function is a direct transcription of the
definition (``np.add.at`` for scatter, float64 loops where order matters).
"""

from __future__ import annotations

import functools
import itertools
import math
from decimal import Decimal, localcontext
from fractions import Fraction

import numpy as np

# ----------------------------------------------------------------- embedding


def row_norm(row: np.ndarray, norm_type: float) -> float:
    row = row.astype(np.float64)
    if np.isinf(norm_type):
        return float(np.max(np.abs(row)))
    return float(np.sum(np.abs(row) ** norm_type) ** (1.0 / norm_type))


def embedding_renorm_(weight, indices, max_norm, norm_type=2.0):
    for row in np.unique(np.asarray(indices).reshape(-1)):
        norm = row_norm(weight[row], norm_type)
        if norm > max_norm:
            weight[row] *= weight.dtype.type(max_norm / (norm + 1e-7))
    return weight


def embedding(indices, weight, max_norm=None, norm_type=2.0):
    indices = np.asarray(indices)
    if max_norm is not None:
        embedding_renorm_(weight, indices, max_norm, norm_type)
    return weight[indices]


def embedding_backward(grad_output, indices, num_embeddings, padding_idx=None,
                       scale_grad_by_freq=False):
    indices = np.asarray(indices).reshape(-1)
    dim = grad_output.shape[-1]
    grad = grad_output.reshape(-1, dim).astype(np.float64)
    if scale_grad_by_freq:
        counts = np.bincount(indices, minlength=num_embeddings)
        grad = grad / counts[indices][:, None]
    out = np.zeros((num_embeddings, dim), dtype=np.float64)
    np.add.at(out, indices, grad)
    if padding_idx is not None:
        out[padding_idx] = 0
    return out.astype(grad_output.dtype)


def padding_mask(indices, padding_idx):
    return np.asarray(indices) != padding_idx


# ----------------------------------------------------------------- optim


def sgd_step(param, grad, buf, lr, momentum=0.0, dampening=0.0, weight_decay=0.0,
             nesterov=False, maximize=False):
    """One dense SGD step in float64; returns (param, buf) (buf None on the first step)."""
    g = -grad if maximize else grad
    if weight_decay:
        g = g + weight_decay * param
    if momentum:
        buf = g.copy() if buf is None else momentum * buf + (1 - dampening) * g
        g = g + momentum * buf if nesterov else buf
    return param - lr * g, buf


def adam_step(param, grad, state, step, lr=1e-3, betas=(0.9, 0.999), eps=1e-8,
              weight_decay=0.0, amsgrad=False, maximize=False, decoupled=False, rows=None):
    """One Adam step in float64: torch.optim.Adam dense, torch.optim.SparseAdam on ``rows``.

    ``state`` is a dict of float64 arrays ``m``, ``v`` (and ``vmax``), updated
    in place; ``grad`` holds the rows of ``rows`` (None: a dense step). Lazy
    weight decay applies to the listed rows only. Returns the new param.
    """
    param = param.copy()
    sel = slice(None) if rows is None else np.asarray(rows)
    p, g = param[sel], -grad if maximize else grad
    if weight_decay and decoupled:
        p = p * (1 - lr * weight_decay)
    elif weight_decay:
        g = g + weight_decay * p
    beta1, beta2 = betas
    m = state["m"][sel] * beta1 + (1 - beta1) * g
    v = state["v"][sel] * beta2 + (1 - beta2) * g * g
    state["m"][sel], state["v"][sel] = m, v
    bc1, bc2 = 1 - beta1 ** step, 1 - beta2 ** step
    if rows is not None:  # SparseAdam: eps after the bias correction
        param[sel] = p - lr * np.sqrt(bc2) / bc1 * m / (np.sqrt(v) + eps)
        return param
    if amsgrad:
        state["vmax"] = v = np.maximum(state["vmax"], v)
    param[sel] = p - lr / bc1 * m / (np.sqrt(v) / np.sqrt(bc2) + eps)
    return param


def rowwise_adagrad_step(param, grad, state_sum, lr=1e-2, eps=1e-8, weight_decay=0.0,
                         weight_decay_mode="none", rows=None):
    """FBGEMM's exact row-wise Adagrad (EXACT_ROWWISE_ADAGRAD, its CPU update) in NumPy.

    ``param`` is (V, D); ``grad`` holds the gradient rows of ``rows`` (every
    row when None). Returns new (param, state_sum); arithmetic in the arrays'
    dtype, the row sum taken in order as FBGEMM's loop does.
    """
    param, state_sum = param.copy(), state_sum.copy()
    rows = range(param.shape[0]) if rows is None else rows
    one = param.dtype.type(1)
    lr, eps, wd = (param.dtype.type(x) for x in (lr, eps, weight_decay))
    for j, r in enumerate(rows):
        g = grad[j]
        h = g + wd * param[r] if weight_decay_mode == "l2" else g
        square_sum = param.dtype.type(0)
        for value in h:
            square_sum += value * value
        state_sum[r] += square_sum / param.dtype.type(param.shape[1])
        multiplier = lr / (np.sqrt(state_sum[r]) + eps)
        correction = {"l2": one - multiplier * wd, "decoupled": one - lr * wd}.get(
            weight_decay_mode, one)
        param[r] = correction * param[r] - multiplier * g
    return param, state_sum


# ----------------------------------------------------------------- dropout

_MASK64 = (1 << 64) - 1
_GAMMA = 0x9E3779B97F4A7C15


def splitmix64_mix(z: int) -> int:
    """Stafford's variant-13 finaliser on a Python int, reduced mod 2**64 by hand."""
    z &= _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def dropout_bits(seed: int, counter: int, index: int) -> int:
    """32 bits for (seed, counter, index): a SplitMix64 stream keyed by (seed, counter)."""
    key = splitmix64_mix(splitmix64_mix(seed + _GAMMA) + counter * _GAMMA)
    return splitmix64_mix(key + index * _GAMMA) >> 32


_MASK32 = (1 << 32) - 1
_GAMMA32 = 0x9E3779B9


def lowbias32(x: int) -> int:
    """Wellons' lowbias32 finaliser on a Python int, reduced mod 2**32 by hand."""
    x &= _MASK32
    x ^= x >> 16
    x = (x * 0x7FEB352D) & _MASK32
    x ^= x >> 15
    x = (x * 0x846CA68B) & _MASK32
    return x ^ (x >> 16)


def rounding_bits16(seed: int, step: int, row: int, column: int) -> int:
    """The 16 random bits of stochastic rounding for element (row, column): a 32-bit
    Weyl stream per row, keyed by the top half of SplitMix64's output for the row."""
    key = splitmix64_mix(splitmix64_mix(seed + _GAMMA) + step * _GAMMA)
    row_key = splitmix64_mix(key + row * _GAMMA) >> 32
    return lowbias32(row_key + column * _GAMMA32) >> 16


def bf16_round_stochastic(values, seed: int, step: int):
    """The bfloat16 bits (uint16) of the float32 ``(V, D)`` ``values`` rounded
    stochastically: up (away from zero) iff the element's 16 random bits are below
    its 16 dropped bits; NaN to the quiet NaN with its sign, as round-to-nearest."""
    bits = np.ascontiguousarray(values, np.float32).view(np.uint32).astype(np.int64)
    out = np.empty(bits.shape, np.uint16)
    for (r, d), u in np.ndenumerate(bits):
        if (u & 0x7FFFFFFF) > 0x7F800000:
            out[r, d] = ((u >> 16) & 0x8000) | 0x7FC0
        else:
            up = rounding_bits16(seed, step, r, d) < (u & 0xFFFF)
            out[r, d] = ((u >> 16) + up) & 0xFFFF
    return out


def f16_round_stochastic_bits(u: int, random16: int) -> int:
    """The float32 bits ``u`` rounded stochastically to float16 bits: between the float16
    neighbours ``lo < |x| < hi`` (NumPy's float16 values, ``hi`` 65,536 past the largest
    finite one), up iff ``random16 * (hi - lo) < (|x| - lo) * 2**16`` in float64 (exact);
    exact values stay; infinity and NaN as rounding to nearest (NumPy's conversion: a NaN
    keeps the top ten bits of its payload, at least one)."""
    u &= _MASK32
    sign = (u >> 16) & 0x8000
    fraction = u & 0x7FFFFF
    if (u & 0x7F800000) == 0x7F800000:
        payload = max(fraction >> 13, 1) if fraction else 0
        return sign | 0x7C00 | payload
    x = abs(float(np.uint32(u).view(np.float32)))
    with np.errstate(over="ignore"):
        nearest = int(np.float16(x).view(np.uint16))
    near = float(np.uint16(nearest).view(np.float16))
    if near == x:
        return sign | nearest
    low = nearest - 1 if near > x else nearest
    lo = float(np.uint16(low).view(np.float16))
    hi = float(np.uint16(low + 1).view(np.float16))
    if hi == float("inf"):
        hi = 65536.0
    up = random16 * (hi - lo) < (x - lo) * 65536.0
    return sign | (low + 1 if up else low)


def dropout_keep_threshold(p: float) -> int:
    """Keep iff bits >= this: round(p * 2**32), 2**32 for p == 1, capped below that for p < 1."""
    if p >= 1.0:
        return 1 << 32
    return min(round(p * (1 << 32)), (1 << 32) - 1)


def dropout_mask(shape, p, seed, counter=0):
    """Keep-mask over flat C-order indices, one Python-int hash per element."""
    size = int(np.prod(shape))
    threshold = dropout_keep_threshold(p)
    flat = np.array([dropout_bits(seed, counter, i) >= threshold for i in range(size)],
                    dtype=bool)
    return flat.reshape(shape)


def dropout(x, p, seed, counter=0):
    """x * mask * (1 / (1 - p)) with the scale rounded to x's dtype; zeros (NaN kept) for p=1."""
    mask = dropout_mask(x.shape, p, seed, counter)
    scale = x.dtype.type(0.0 if p == 1.0 else 1.0 / (1.0 - p))
    return x * np.where(mask, scale, x.dtype.type(0))


# ----------------------------------------------------------------- layer norm and blocks


def layer_norm(x, weight=None, bias=None, eps=1e-5):
    """(y, mean, rstd) over the last axis, all in float64 (biased variance, as PyTorch)."""
    x = np.asarray(x, dtype=np.float64)
    mean = x.mean(axis=-1)
    var = ((x - mean[..., None]) ** 2).mean(axis=-1)
    rstd = 1.0 / np.sqrt(var + eps)
    y = (x - mean[..., None]) * rstd[..., None]
    if weight is not None:
        y = y * weight
    if bias is not None:
        y = y + bias
    return y, mean, rstd


def layer_norm_backward(grad_y, x, weight=None, eps=1e-5):
    """(grad_x, grad_weight, grad_bias) in float64, from the textbook formula."""
    grad_y = np.asarray(grad_y, dtype=np.float64)
    x = np.asarray(x, dtype=np.float64)
    _, mean, rstd = layer_norm(x, eps=eps)
    xhat = (x - mean[..., None]) * rstd[..., None]
    g = grad_y * (1.0 if weight is None else np.asarray(weight, dtype=np.float64))
    grad_x = rstd[..., None] * (g - g.mean(-1, keepdims=True)
                                - xhat * (g * xhat).mean(-1, keepdims=True))
    rows = grad_y.reshape(-1, x.shape[-1])
    grad_w = (rows * xhat.reshape(rows.shape)).sum(0)
    return grad_x, grad_w, rows.sum(0)


def hf_positions_from_attention_mask(attention_mask, length):
    """Hugging Face's generation convention, verbatim: cumsum - 1, 1 at padding, last L columns."""
    mask = np.asarray(attention_mask).astype(np.int64)
    positions = np.cumsum(mask, axis=-1) - 1
    positions[mask == 0] = 1
    return positions[..., positions.shape[-1] - length:]


def bert_embeddings(input_ids, word, position, token_type, ln_weight, ln_bias, eps=1e-12,
                    token_type_ids=None, position_ids=None, past_length=0, p=0.0, seed=0,
                    counter=0):
    """Dropout(LayerNorm(word[ids] + position[pos] + token_type[types])), LayerNorm in float64.

    The dropout mask is :func:`dropout_mask` over the output's flat C-order
    indices; the result is float64.
    """
    ids = np.asarray(input_ids)
    length = ids.shape[-1]
    if position_ids is None:
        position_ids = np.arange(past_length, past_length + length)
    if token_type_ids is None:
        token_type_ids = np.zeros_like(ids)
    total = (word[ids].astype(np.float64) + position[np.asarray(position_ids)]
             + token_type[np.asarray(token_type_ids)])
    y = layer_norm(total, ln_weight, ln_bias, eps)[0]
    if p:
        y = y * dropout_mask(y.shape, p, seed, counter) / (1.0 - p)
    return y


def gpt2_embeddings(input_ids, wte, wpe, past_length=0, position_ids=None, attention_mask=None,
                    p=0.0, seed=0, counter=0):
    """Dropout(wte[ids] + wpe[pos]) in float64; mask positions as HF generation makes them."""
    ids = np.asarray(input_ids)
    length = ids.shape[-1]
    if position_ids is None:
        if attention_mask is not None:
            position_ids = hf_positions_from_attention_mask(attention_mask, length)
        else:
            position_ids = np.arange(past_length, past_length + length)
    y = wte[ids].astype(np.float64) + wpe[np.asarray(position_ids)]
    if p:
        y = y * dropout_mask(y.shape, p, seed, counter) / (1.0 - p)
    return y


# ----------------------------------------------------------------- positional


def sinusoidal_table(seq_len, embed_dim, base=10000.0, offset=0):
    """The sinusoid table by its formula, in float64, one channel at a time."""
    positions = np.arange(offset, offset + seq_len, dtype=np.float64)
    out = np.empty((seq_len, embed_dim), dtype=np.float64)
    for channel in range(embed_dim):
        even = channel - channel % 2
        angle = positions * base ** (-even / embed_dim)
        out[:, channel] = np.sin(angle) if channel % 2 == 0 else np.cos(angle)
    return out


def sinusoidal_table_concat(seq_len, embed_dim, base=10000.0, offset=0):
    """fairseq's ``[sin | cos]`` table in float64, one channel at a time: channel ``i < H``
    is ``sin(p w_i)``, ``H + i`` is ``cos(p w_i)``, ``w_i = base**(-i / (H - 1))`` with
    ``H = embed_dim // 2``; an odd D's last channel 0."""
    positions = np.arange(offset, offset + seq_len, dtype=np.float64)
    half = embed_dim // 2
    out = np.zeros((seq_len, embed_dim), dtype=np.float64)
    for i in range(half):
        angle = positions * base ** (-i / (half - 1))
        out[:, i] = np.sin(angle)
        out[:, half + i] = np.cos(angle)
    return out


def timestep_embedding(timesteps, embedding_dim, flip_sin_to_cos=False,
                       downscale_freq_shift=1, scale=1, max_period=10000):
    """diffusers' ``get_timestep_embedding`` in NumPy float64 (diffusers computes in
    float32). Copied from diffusers, src/diffusers/models/embeddings.py (Apache-2.0),
    torch calls replaced by NumPy; timesteps of shape (N,) or (B, N)."""
    timesteps = np.asarray(timesteps, dtype=np.float64)
    half_dim = embedding_dim // 2
    exponent = -np.log(max_period) * np.arange(start=0, stop=half_dim, dtype=np.float64)
    exponent = exponent / (half_dim - downscale_freq_shift)

    emb = np.exp(exponent)
    emb = timesteps[..., None] * emb

    # scale embeddings
    emb = scale * emb

    # concat sine and cosine embeddings
    emb = np.concatenate([np.sin(emb), np.cos(emb)], axis=-1)

    # flip sine and cosine embeddings
    if flip_sin_to_cos:
        emb = np.concatenate([emb[..., half_dim:], emb[..., :half_dim]], axis=-1)

    # zero pad
    if embedding_dim % 2 == 1:
        emb = np.concatenate([emb, np.zeros(emb.shape[:-1] + (1,))], axis=-1)
    return emb


def positions_from_padding(input_ids, padding_idx, past_length=0, pad_position=0):
    """Loop version: count the real tokens of each row."""
    ids = np.asarray(input_ids)
    rows = ids.reshape(-1, ids.shape[-1])
    past = np.broadcast_to(np.asarray(past_length), ids.shape[:-1]).reshape(-1)
    out = np.empty(rows.shape, dtype=np.int64)
    for r in range(rows.shape[0]):
        count = 0
        for l in range(rows.shape[1]):
            if rows[r, l] == padding_idx:
                out[r, l] = pad_position
            else:
                out[r, l] = past[r] + count
                count += 1
    return out.reshape(ids.shape)


def fairseq_make_positions(input_ids, padding_idx):
    """fairseq's make_positions, transcribed: cumsum of the mask times the mask, + padding_idx."""
    mask = (np.asarray(input_ids) != padding_idx).astype(np.int64)
    return np.cumsum(mask, axis=-1) * mask + padding_idx


# ----------------------------------------------------------------- checking


def finite_difference(f, x: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """Central-difference gradient of scalar ``f`` at float64 ``x`` (x restored after)."""
    grad = np.zeros_like(x, dtype=np.float64)
    flat_x = x.reshape(-1)
    flat_g = grad.reshape(-1)
    for i in range(flat_x.size):
        old = flat_x[i]
        flat_x[i] = old + eps
        up = f()
        flat_x[i] = old - eps
        down = f()
        flat_x[i] = old
        flat_g[i] = (up - down) / (2 * eps)
    return grad


# ----------------------------------------------------------------- rotary


def rope_inv_freq(dim, base=10000.0):
    return 1.0 / base ** (np.arange(0, dim, 2, dtype=np.float64) / dim)


def rotary(x, positions, inv_freq, scale=1.0, interleaved=False, head_axis=1, sign=1.0):
    """Rotate pairs of the last axis of a 4-D ``x`` in float64; ``positions`` is (P, L)."""
    x = np.asarray(x, dtype=np.float64)
    xx = x if head_axis == 1 else x.transpose(0, 2, 1, 3)  # (B, H, L, D)
    angle = np.asarray(positions, np.float64)[..., None] * np.asarray(inv_freq, np.float64)
    c = (np.cos(angle) * scale)[:, None]  # (P, 1, L, R/2)
    s = (np.sin(angle) * scale * sign)[:, None]
    half = len(inv_freq)
    out = xx.copy()
    if interleaved:
        a, b = xx[..., 0:2 * half:2], xx[..., 1:2 * half:2]
        out[..., 0:2 * half:2] = a * c - b * s
        out[..., 1:2 * half:2] = b * c + a * s
    else:
        a, b = xx[..., :half], xx[..., half:2 * half]
        out[..., :half] = a * c - b * s
        out[..., half:2 * half] = b * c + a * s
    return out if head_axis == 1 else out.transpose(0, 2, 1, 3)


# ----------------------------------------------------------------- ALiBi


def alibi_distance(mode, batch, query_length, key_length, mask=None):
    """The integer distance ``dist[b, i, j]`` of each ALiBi mode, shape (B or 1, Lq, Lk)."""
    i = np.arange(query_length)[:, None]
    j = np.arange(key_length)[None, :]
    if mode == "symmetric":
        return -np.abs(i + key_length - query_length - j)[None]
    if mode == "mpt":
        return np.broadcast_to(j - (key_length - 1), (1, query_length, key_length))
    mask = np.ones((1, key_length), np.int64) if mask is None else np.atleast_2d(mask)
    positions = (np.cumsum(mask, axis=1) - 1) * mask
    return np.broadcast_to(positions[:, None, :], (mask.shape[0], query_length, key_length))


def nearest_float32(exact):
    """The float32 nearest to ``exact`` (a Fraction or a high-precision Decimal), ties to
    even: the candidates around a float64 guess compared by their exact distance."""
    guess = np.float32(float(exact))
    candidates = [np.nextafter(guess, np.float32(-np.inf)), guess,
                  np.nextafter(guess, np.float32(np.inf))]
    convert = Fraction if isinstance(exact, Fraction) else Decimal

    def key(c):
        return abs(convert(float(c)) - exact), int(c.view(np.int32)) & 1

    return min(candidates, key=key)


@functools.cache
def _bloom_power(m, k, max_bias):
    return nearest_float32(Fraction(float(np.float32(2.0 ** (-max_bias / m)))) ** k)


def alibi_slopes_bloom(num_heads, max_bias=8.0):
    """transformers' BLOOM slopes, exactly rounded: ``float32(base) ** k`` in rationals."""
    closest = 2 ** int(np.floor(np.log2(num_heads)))
    pairs = [(closest, k) for k in range(1, closest + 1)]
    pairs += [(2 * closest, k) for k in range(1, 2 * (num_heads - closest), 2)]
    return np.array([_bloom_power(m, k, max_bias) for m, k in pairs], np.float32)


@functools.cache
def _mpt_slope(m2, k, max_bias):
    exponent = np.float32(np.float32(k) * np.float32(max_bias / m2))
    with localcontext() as ctx:
        ctx.prec = 40
        power = nearest_float32((Decimal(float(exponent)) * Decimal(2).ln()).exp())
    return nearest_float32(1 / Fraction(float(power)))


def alibi_slopes_mpt(num_heads, max_bias=8.0):
    """transformers' MPT slopes, each float32 operation exactly rounded (2**x in 40 digits)."""
    m2 = 2 ** int(np.ceil(np.log2(num_heads)))
    slopes = np.array([_mpt_slope(m2, k, max_bias) for k in range(1, m2 + 1)], np.float32)
    return np.concatenate([slopes[1::2], slopes[::2]])[:num_heads] if m2 != num_heads else slopes


def alibi_scores(scores, slopes, mode, mask=None):
    """``scores + slope * dist`` with the bias rounded to the scores' dtype first."""
    batch, heads, lq, lk = scores.shape
    dist = alibi_distance(mode, batch, lq, lk, mask).astype(np.float64)
    bias = (np.asarray(slopes, np.float64)[None, :, None, None] * dist[:, None])
    return scores + bias.astype(scores.dtype)


def alibi_slopes_grad(grad, mode, mask=None):
    batch, heads, lq, lk = grad.shape
    dist = alibi_distance(mode, batch, lq, lk, mask).astype(np.float64)
    return np.sum(grad.astype(np.float64) * dist[:, None], axis=(0, 2, 3))


# ----------------------------------------------------------------- resized position tables


def resize_pos_table(table, new_len, mode="linear", prefix=0, fill=None):
    """Row by row in float64: linear as PyTorch's align_corners=False interpolation."""
    table = np.asarray(table)
    old_len = table.shape[0]
    out = np.empty((new_len, table.shape[1]))
    for n in range(new_len):
        if n < prefix:
            out[n] = table[n]
        elif mode == "linear":
            scale = (old_len - prefix) / (new_len - prefix)
            src = max((n - prefix + 0.5) * scale - 0.5, 0.0)
            i0 = min(int(np.floor(src)), old_len - prefix - 1)
            i1 = min(i0 + 1, old_len - prefix - 1)
            lam = src - i0
            out[n] = (1 - lam) * table[prefix + i0] + lam * table[prefix + i1]
        elif mode == "copy":
            out[n] = table[prefix + (n - prefix) % (old_len - prefix)]
        elif mode == "repeat_last":
            out[n] = table[min(n, old_len - 1)]
        else:
            out[n] = table[n] if n < old_len else fill[n - old_len]
    return out.astype(table.dtype)


def add_fractional_positions(x, table, positions):
    """``x + (1 - w) * table[floor(p)] + w * table[floor(p) + 1]`` in float64 (rows rounded to
    the table's dtype, as the kernels do)."""
    p = np.asarray(positions, np.float64)
    i0 = np.minimum(np.floor(p).astype(np.int64), len(table) - 1)
    w = (p - i0)[..., None]
    i1 = np.minimum(i0 + 1, len(table) - 1)
    t = np.asarray(table, np.float64)
    rows = ((1 - w) * t[i0] + w * t[i1]).astype(table.dtype)
    return x + rows


def add_fractional_positions_backward(grad, positions, num_positions):
    p = np.broadcast_to(np.asarray(positions, np.float64), grad.shape[:-1]).reshape(-1)
    g = grad.reshape(-1, grad.shape[-1]).astype(np.float64)
    i0 = np.minimum(np.floor(p).astype(np.int64), num_positions - 1)
    w = (p - i0)[:, None]
    out = np.zeros((num_positions, grad.shape[-1]))
    np.add.at(out, i0, (1 - w) * g)
    np.add.at(out, np.minimum(i0 + 1, num_positions - 1), w * g)
    return out


# ----------------------------------------------------------------- quantised tables
# FBGEMM's fused row-wise formats, transcribed from its reference C++
# (FloatOrHalfToFused8BitRowwiseQuantizedSBFloatRef,
# FloatOrHalfToFusedNBitRowwiseQuantizedSBHalfRef, EmbeddingSpMDM_ref).


def fma32(a, b, c):
    """``a * b + c`` for float32 arrays, rounded once to float32 (as C's ``fmaf``).

    The product is exact in float64; the float64 sum is made round-to-odd
    from its two-sum error, so the final rounding to float32 is the only one
    that counts.
    """
    p = np.asarray(a, np.float64) * np.asarray(b, np.float64)
    c = np.asarray(c, np.float64)
    s = p + c
    back = s - p
    err = (p - (s - back)) + (c - back)
    even = (s.view(np.int64) & 1) == 0
    nudge = (err != 0) & even & np.isfinite(s)
    s = np.where(nudge, np.nextafter(s, np.where(err > 0, np.inf, -np.inf)), s)
    return s.astype(np.float32)


def quantize_rowwise(table, bits=8):
    """The packed table, row by row, as FBGEMM's reference code computes it."""
    table = np.asarray(table, np.float32)
    num, dim = table.shape
    width = dim + 8 if bits == 8 else (dim + 1) // 2 + 4
    out = np.zeros((num, width), np.uint8)
    f32 = np.float32
    for r in range(num):
        row = table[r]
        if dim == 0:
            if bits == 4:
                out[r, 0:2] = np.frombuffer(np.float16(1).tobytes(), np.uint8)
            continue
        low, high = row.min(), row.max()
        if bits == 8:
            span = f32(high - low)
            scale = f32(span / f32(255))
            inverse = f32(f32(255) / f32(span + f32(1e-8)))
            codes = np.rint(((row - low).astype(f32) * inverse).astype(f32))
            out[r, :dim] = codes.astype(np.int64).astype(np.uint8)
            out[r, dim:dim + 4] = np.frombuffer(scale.tobytes(), np.uint8)
            out[r, dim + 4:] = np.frombuffer(f32(low).tobytes(), np.uint8)
        else:
            bias = f32(np.float16(low))
            span = f32(high - bias)
            scale = f32(1) if span == 0 else f32(span / f32(15))
            scale = f32(np.float16(scale))
            if scale == 0:
                scale = f32(1)
            inverse = f32(f32(1) / scale)
            if np.isinf(inverse):
                scale = inverse = f32(1)
            codes = np.clip(np.rint(((row - bias).astype(f32) * inverse).astype(f32)), 0, 15)
            codes = codes.astype(np.uint8)
            nb = (dim + 1) // 2
            padded = np.zeros(2 * nb, np.uint8)
            padded[:dim] = codes
            out[r, :nb] = padded[0::2] | (padded[1::2] << 4)
            out[r, nb:nb + 2] = np.frombuffer(np.float16(scale).tobytes(), np.uint8)
            out[r, nb + 2:] = np.frombuffer(np.float16(bias).tobytes(), np.uint8)
    return out


def rowwise_parts(packed, bits, dim):
    """``(codes (V, D) float32, scale (V, 1) float32, bias (V, 1) float32)`` of a packed table."""
    packed = np.asarray(packed, np.uint8)
    num = packed.shape[0]
    if bits == 8:
        codes = packed[:, :dim].astype(np.float32)
        sb = np.ascontiguousarray(packed[:, dim:dim + 8]).view(np.float32)
    else:
        nb = (dim + 1) // 2
        raw = packed[:, :nb]
        codes = np.stack([raw & 15, raw >> 4], axis=-1).reshape(num, 2 * nb)[:, :dim]
        codes = codes.astype(np.float32)
        sb = np.ascontiguousarray(packed[:, nb:nb + 4]).view(np.float16).astype(np.float32)
    return codes, sb[:, :1], sb[:, 1:2]


def dequantize_rowwise(packed, bits, dim):
    """``fma(scale, code, bias)`` per element, float32."""
    codes, scale, bias = rowwise_parts(packed, bits, dim)
    return fma32(codes, scale, bias)


def quantized_embedding(indices, packed, bits, dim, padding_idx=None):
    """Rows of the dequantised table, zeros at ``padding_idx``."""
    table = dequantize_rowwise(packed, bits, dim)
    indices = np.asarray(indices)
    out = table[indices]
    if padding_idx is not None:
        out[indices == padding_idx] = 0
    return out


# ----------------------------------------------------------------- 16-bit tables


def half_renorm_(weight, indices, max_norm, norm_type=2.0):
    """Max-norm on a bfloat16 / float16 table: the norm in float64 of the float32 values,
    the clipped row ``value * float32(max_norm / (norm + 1e-7))`` in float32, cast back
    (round to nearest even: ml_dtypes / NumPy's casts)."""
    for row in np.unique(np.asarray(indices).reshape(-1)):
        values = weight[row].astype(np.float32)
        norm = row_norm(values, norm_type)
        if norm > max_norm:
            weight[row] = (values * np.float32(max_norm / (norm + 1e-7))).astype(weight.dtype)
    return weight


def half_embedding(indices, weight, max_norm=None, norm_type=2.0, out_dtype=np.float32):
    """A lookup into a bfloat16 / float16 table: float32 values (exact), or the table's own
    dtype."""
    indices = np.asarray(indices)
    if max_norm is not None:
        half_renorm_(weight, indices, max_norm, norm_type)
    return weight[indices].astype(out_dtype)


# ------------------------------------------------------------ rope_index
# Plain NumPy oracle of ``numbapos.functional.rope_index``.

def rope_index(input_ids, *, image_grid_thw=None, video_grid_thw=None, attention_mask=None,
               second_per_grid_ts=None, spatial_merge_size, image_token_id, video_token_id,
               tokens_per_second=None):
    ids = np.asarray(input_ids)
    batch, length = ids.shape
    types = np.where(ids == image_token_id, 1, np.where(ids == video_token_id, 2, 0))
    grids = {1: iter(np.asarray(image_grid_thw)) if image_grid_thw is not None else None,
             2: iter(np.asarray(video_grid_thw)) if video_grid_thw is not None else None}
    if isinstance(second_per_grid_ts, (list, tuple)):  # torch.tensor makes floats float32
        second_per_grid_ts = np.asarray(second_per_grid_ts, np.float32)
    seconds = iter(second_per_grid_ts) if second_per_grid_ts is not None else None
    positions = np.zeros((3, batch, length), np.int64)
    deltas = np.zeros((batch, 1), np.int64)
    for b in range(batch):
        keep = (np.ones(length, bool) if attention_mask is None
                else np.asarray(attention_mask)[b].astype(bool))
        kept = types[b][keep]
        pieces = []
        current = 0
        start = 0
        for kind, group in itertools.groupby(kept.tolist()):
            size = len(list(group))
            start += size
            if kind == 0:
                pieces.append(np.broadcast_to(np.arange(size) + current, (3, size)))
                current += size
                continue
            t, h, w = (int(v) for v in next(grids[kind]))
            gh, gw = h // spatial_merge_size, w // spatial_merge_size
            temporal = np.arange(t)
            if kind == 2 and tokens_per_second is not None:
                if seconds is None:
                    temporal = temporal * tokens_per_second
                else:
                    s = next(seconds)  # torch: int * tensor in the tensor's float dtype
                    interval = (s.dtype.type(tokens_per_second) * s).astype(s.dtype)
                    temporal = (temporal.astype(s.dtype) * interval).astype(np.int64)
            tt, hh, ww = np.meshgrid(temporal, np.arange(gh), np.arange(gw), indexing="ij")
            piece = np.stack([tt, hh, ww]).reshape(3, -1) + current
            assert piece.shape[1] == size, "vision span length does not match its grid"
            pieces.append(piece)
            current += max(h, w) // spatial_merge_size
        if not pieces:
            continue
        llm = np.concatenate(pieces, axis=1)
        positions[:, b, keep] = llm
        deltas[b, 0] = llm.max() + 1 - llm.shape[1]
    return positions, deltas


# ------------------------------------------------------------ relative
# Plain NumPy oracles of the relative-position ops (T5 bias, DeBERTa log buckets).

f32 = np.float32


def _log32(x):
    """float32 log of float32 values (the float64 log rounded once)."""
    return np.log(np.asarray(x, np.float64)).astype(f32)


def t5_bucket(relative, bidirectional=True, num_buckets=32, max_distance=128):
    """transformers' ``T5Attention._relative_position_bucket``, in NumPy."""
    relative = np.asarray(relative, np.int64)
    buckets = np.zeros_like(relative)
    if bidirectional:
        num_buckets //= 2
        buckets += (relative > 0) * num_buckets
        n = np.abs(relative)
    else:
        n = -np.minimum(relative, 0)
    max_exact = num_buckets // 2
    with np.errstate(divide="ignore"):  # log(0) where n is small (not used there)
        x = (n.astype(f32) / f32(max_exact)).astype(f32)
        scaled = (_log32(x) / f32(math.log(max_distance / max_exact))).astype(f32)
        scaled = (scaled * f32(num_buckets - max_exact)).astype(f32)
        large = max_exact + np.trunc(np.where(n < max_exact, 0, scaled)).astype(np.int64)
    large = np.minimum(large, num_buckets - 1)
    return buckets + np.where(n < max_exact, n, large)


def t5_bias(weight, query_length, key_length, offset=0, bidirectional=True, max_distance=128):
    """``compute_bias``: ``(1, H, Lq, Lk)`` of ``weight[bucket(j - (i + offset)), h]``."""
    rel = np.arange(key_length)[None, :] - (np.arange(query_length)[:, None] + offset)
    buckets = t5_bucket(rel, bidirectional, weight.shape[0], max_distance)
    return np.ascontiguousarray(weight[buckets].transpose(2, 0, 1)[None])


def t5_bias_grad(grad, num_buckets, offset=0, bidirectional=True, max_distance=128):
    """The table's gradient in the defined order, float64 sums rounded once to grad's dtype.

    Per head, diagonal ``d = j - i`` increasing: the cells over ``b``, then ``i``,
    added one after another (``np.add.accumulate`` is sequential); then per
    bucket its diagonals, ``d`` increasing.
    """
    batch, heads, rows, cols = grad.shape
    out = np.zeros((num_buckets, heads), np.float64)
    for d in range(-(rows - 1), cols):
        bucket = int(t5_bucket(d - offset, bidirectional, num_buckets, max_distance))
        i = np.arange(max(0, -d), min(rows, cols - d))
        if i.size == 0:
            continue
        cells = grad[:, :, i, i + d].astype(np.float64)  # (B, H, cells)
        cells = cells.transpose(1, 0, 2).reshape(heads, -1)  # b outer, i inner
        sums = np.add.accumulate(cells, axis=1)[:, -1]
        for h in range(heads):
            out[bucket, h] = out[bucket, h] + sums[h]
    return out.astype(grad.dtype)


def deberta_log_bucket(relative, bucket_size, max_position):
    """transformers' ``make_log_bucket_position`` (DeBERTa-v2), as int64."""
    relative = np.asarray(relative, np.int64)
    sign = np.sign(relative)
    mid = bucket_size // 2
    abs_pos = np.where((relative < mid) & (relative > -mid), mid - 1, np.abs(relative))
    x = (abs_pos.astype(f32) / f32(mid)).astype(f32)
    denominator = _log32(f32((max_position - 1) / mid))
    with np.errstate(all="ignore"):  # log(0) * 0 where abs_pos is 0 (bucket_size 2; unused)
        log_pos = (np.ceil((_log32(x) / denominator).astype(f32) * f32(mid - 1)).astype(f32)
                   + f32(mid)).astype(f32)
        far = (log_pos * sign).astype(np.int64)
    return np.where(abs_pos <= mid, relative, far)


def deberta_relative_positions(query_size, key_size, bucket_size=-1, max_position=-1):
    """transformers' ``build_relative_position`` (DeBERTa-v2): ``(1, Lq, Lk)`` int64."""
    rel = np.arange(query_size)[:, None] - np.arange(key_size)[None, :]
    if bucket_size > 0 and max_position > 0:
        rel = deberta_log_bucket(rel, bucket_size, max_position)
    return rel.astype(np.int64)[None]


# ------------------------------------------------------------ bag
# Plain NumPy oracles of the pooled lookups (to be merged into tests/reference.py).

def fma(a, b, c):
    """``a * b + c`` rounded once, elementwise, float32 or float64 arrays."""
    a, b, c = np.broadcast_arrays(a, b, c)
    if c.dtype == np.float64:
        from fractions import Fraction
        flat = [float(Fraction(float(x)) * Fraction(float(y)) + Fraction(float(z)))
                for x, y, z in zip(a.ravel(), b.ravel(), c.ravel(), strict=True)]
        return np.array(flat, np.float64).reshape(c.shape)
    p = a.astype(np.float64) * b.astype(np.float64)  # exact
    s = p + c.astype(np.float64)
    back = s - p
    err = (p - (s - back)) + (c.astype(np.float64) - back)
    bits = s.view(np.int64)
    odd = (err != 0) & ((bits & 1) == 0)
    s = np.where(odd, np.nextafter(s, np.where(err > 0, np.inf, -np.inf)), s)
    return s.astype(np.float32)


def bag_bounds(input, offsets, include_last_offset=False):
    """``(flat ids, list of (start, end))`` of a 1-D input with offsets or a 2-D input."""
    input = np.asarray(input)
    if input.ndim == 2:
        width = input.shape[1]
        return input.reshape(-1), [(b * width, (b + 1) * width) for b in range(input.shape[0])]
    offsets = [int(o) for o in offsets]
    ends = offsets[1:] + ([] if include_last_offset else [input.size])
    return input, list(zip(offsets[:len(ends)], ends, strict=True))


def embedding_bag(input, weight, offsets=None, mode="mean", per_sample_weights=None,
                  include_last_offset=False, padding_idx=None):
    """PyTorch's CPU ``embedding_bag`` forward, one entry at a time."""
    weight = np.asarray(weight)
    dtype = np.dtype(np.float32 if weight.dtype.itemsize == 2 else weight.dtype).type
    table = weight.astype(dtype)
    flat, bounds = bag_bounds(input, offsets, include_last_offset)
    psw = None if per_sample_weights is None else np.asarray(per_sample_weights).reshape(-1)
    pad = None if padding_idx is None else padding_idx % weight.shape[0]
    out = np.zeros((len(bounds), weight.shape[1]), dtype)
    for b, (start, end) in enumerate(bounds):
        acc = np.zeros(weight.shape[1], dtype)
        entries = [i for i in range(start, end) if flat[i] != pad]
        for k, i in enumerate(entries):
            row = table[flat[i]]
            if mode == "max":
                acc = row.copy() if k == 0 else np.where(row > acc, row, acc)
            elif psw is None:
                acc = acc + row
            elif pad is None:
                acc = fma(dtype(psw[i]), row, acc)
            else:
                acc = acc + dtype(psw[i]) * row
        if mode == "mean" and entries:
            acc = acc / dtype(len(entries))
        out[b] = acc
    return out


def embedding_bag_backward(grad_output, input, weight, offsets=None, mode="mean",
                           per_sample_weights=None, include_last_offset=False, padding_idx=None,
                           scale_grad_by_freq=False):
    """``(grad_weight, grad_per_sample_weights)``: each row's terms in input order, scaled
    ones as fused multiply-adds of ``float(scale)``; the scale computed in float64."""
    weight = np.asarray(weight)
    grad_output = np.asarray(grad_output)
    dtype = grad_output.dtype
    table = weight.astype(dtype)
    flat, bounds = bag_bounds(input, offsets, include_last_offset)
    pad = None if padding_idx is None else padding_idx % weight.shape[0]
    psw = None if per_sample_weights is None else np.asarray(per_sample_weights).reshape(-1)
    bag_of = np.empty(flat.size, np.int64)
    sizes = []
    for b, (start, end) in enumerate(bounds):
        bag_of[start:end] = b
        sizes.append(sum(1 for i in range(start, end) if flat[i] != pad))
    counts = np.bincount(flat, minlength=weight.shape[0])
    winners = {}
    if mode == "max":
        for b, (start, end) in enumerate(bounds):
            for d in range(weight.shape[1]):
                best = None
                for i in range(start, end):
                    if flat[i] == pad:
                        continue
                    if best is None or table[flat[i], d] > table[flat[best], d]:
                        best = i
                winners[b, d] = best
    grad = np.zeros(weight.shape, dtype)
    for i in range(flat.size):
        r, b = flat[i], bag_of[i]
        if r == pad:
            continue
        if mode == "max":
            for d in range(weight.shape[1]):
                if winners[b, d] == i:
                    grad[r, d] += grad_output[b, d]
            continue
        if mode == "sum" and psw is None and not scale_grad_by_freq:
            grad[r] = grad[r] + grad_output[b]
            continue
        scale = 1.0
        if scale_grad_by_freq:
            scale /= counts[r]
        if mode == "mean":
            scale /= sizes[b]
        if psw is not None:
            scale *= float(psw[i])
        grad[r] = fma(dtype.type(scale), grad_output[b], grad[r])
    grad_psw = None
    if psw is not None:
        grad_psw = np.zeros(flat.size, dtype)
        for i in range(flat.size):
            if flat[i] != pad:
                acc = dtype.type(0)
                for d in range(weight.shape[1]):
                    acc = dtype.type(acc + grad_output[bag_of[i], d] * table[flat[i], d])
                grad_psw[i] = acc
        grad_psw = grad_psw.reshape(np.shape(input))
    return grad, grad_psw


# ------------------------------------------------------------ mrope
# Plain NumPy oracles of multimodal rotary (Qwen2-VL / Qwen2.5-VL / Qwen3-VL), in float64.

def mrope_angles(positions, inv_freq, section, interleaved=False):
    """Angles ``(P, L, R/2)`` of three position streams ``positions`` ``(3, P, L)``.

    Every stream's angles are formed for every frequency, then frequency ``i``
    takes those of its stream, as transformers does.
    """
    positions = np.asarray(positions, np.float64)
    inv_freq = np.asarray(inv_freq, np.float64)
    freqs = positions[..., None] * inv_freq  # (3, P, L, R/2)
    if not interleaved:  # Qwen2-VL: torch.cat([m[i % 3] for i, m in enumerate(split)])
        pieces, start = [], 0
        for i, size in enumerate(section):
            pieces.append(freqs[i % 3, ..., start:start + size])
            start += size
        return np.concatenate(pieces, axis=-1)
    out = freqs[0].copy()  # Qwen3-VL: overwrite T's entries with H's and W's
    for stream, offset in ((1, 1), (2, 2)):
        idx = slice(offset, section[stream] * 3, 3)
        out[..., idx] = freqs[stream, ..., idx]
    return out


def mrope_rotary(x, positions, inv_freq, section, interleaved=False, scale=1.0, sign=1.0,
                 pairs="half"):
    """Multimodal rotary of a 4-D ``(B, H, L, D)`` ``x`` in float64; ``positions`` is
    ``(3, P, L)`` with ``P`` 1 or ``B``; channels past ``R`` pass through. ``pairs``:
    ``"half"`` pairs channel ``j`` with ``j + R/2`` (the Qwen-VL models), ``"interleaved"``
    ``2j`` with ``2j + 1``."""
    x = np.asarray(x, np.float64)
    angle = mrope_angles(positions, inv_freq, section, interleaved)
    c = (np.cos(angle) * scale)[:, None]  # (P, 1, L, R/2)
    s = (np.sin(angle) * scale * sign)[:, None]
    half = len(inv_freq)
    first, second = ((slice(0, half), slice(half, 2 * half)) if pairs == "half"
                     else (slice(0, 2 * half, 2), slice(1, 2 * half, 2)))
    a, b = x[..., first], x[..., second]
    out = x.copy()
    out[..., first] = a * c - b * s
    out[..., second] = b * c + a * s
    return out


def quantized_embedding_bag(input, packed, bits, dim, offsets=None, mode="mean",
                            per_sample_weights=None, include_last_offset=False,
                            padding_idx=None):
    """FBGEMM's pooled lookup, one entry at a time: a sum adds
    ``fma(scale * w, code, acc + bias * w)`` per entry (products rounded to float32),
    a mean divides that sum by the entries (padding left out), a max keeps the largest
    ``fma(scale, code, bias)``; empty bags are zeros."""
    codes, scale, bias = rowwise_parts(packed, bits, dim)
    flat, bounds = bag_bounds(input, offsets, include_last_offset)
    psw = None if per_sample_weights is None else np.asarray(per_sample_weights).reshape(-1)
    pad = None if padding_idx is None else padding_idx % packed.shape[0]
    out = np.zeros((len(bounds), dim), np.float32)
    for b, (start, end) in enumerate(bounds):
        entries = [i for i in range(start, end) if flat[i] != pad]
        acc = np.zeros(dim, np.float32)
        for k, i in enumerate(entries):
            r = flat[i]
            if mode == "max":
                row = fma32(codes[r], scale[r], bias[r])
                acc = row if k == 0 else np.where(row > acc, row, acc)
                continue
            s, c = scale[r], bias[r]
            if psw is not None:
                s, c = s * np.float32(psw[i]), c * np.float32(psw[i])
            acc = fma32(codes[r], s, acc + c)
        if mode == "mean" and entries:
            acc = acc / np.float32(len(entries))
        out[b] = acc
    return out


# ----------------------------------------------------------------- collections of bags
# TorchRec's EmbeddingBagCollection: each (table, feature) bag pooled on its own, each
# table's gradient from its features' bags stacked in input (key) order.
def key_bags(keys, values, lengths, key):
    """``(ids, offsets with the last, positions)`` of ``key``'s bags (key-major layout)."""
    values, lengths = np.asarray(values), np.asarray(lengths)
    batch = lengths.size // len(keys)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    f = keys.index(key)
    start, end = offsets[f * batch], offsets[(f + 1) * batch]
    return values[start:end], offsets[f * batch:(f + 1) * batch + 1] - start, np.arange(start,
                                                                                        end)


def embedding_bag_collection(keys, values, lengths, weights, tables, weight_of_table):
    """``(B, total)``: ``tables`` is a list of ``(name, pooling, feature_names)``; each
    (table, feature) bag pooled by ``reference.embedding_bag``, in table then feature order."""
    columns = []
    for name, pooling, features in tables:
        for feature in features:
            ids, offsets, positions = key_bags(keys, values, lengths, feature)
            psw = None if weights is None else np.asarray(weights)[positions]
            columns.append(embedding_bag(ids, weight_of_table[name], offsets, pooling, psw,
                                             include_last_offset=True))
    return np.concatenate(columns, axis=1)


def embedding_bag_collection_backward(grad_output, keys, values, lengths, weights, tables,
                                      weight_of_table):
    """``({name: dense grad}, grad of weights or None)``: a table's features' bags stacked in
    key order (its rows' terms then come in input order) through
    ``reference.embedding_bag_backward``; a weight's gradient summed over the tables that
    read its key, in table order."""
    grad_output = np.asarray(grad_output)
    grads = {}
    grad_weights = None if weights is None else np.zeros(len(values), grad_output.dtype)
    touched = np.zeros(len(values), bool)
    col = 0
    cols = {}
    for name, _, features in tables:
        for feature in features:
            width = weight_of_table[name].shape[1]
            cols[name, feature] = (col, col + width)
            col += width
    for name, pooling, features in tables:
        ordered = sorted(features, key=keys.index)
        ids, offsets, grad, positions = [], [0], [], []
        for feature in ordered:
            i, o, p = key_bags(keys, values, lengths, feature)
            ids.append(i)
            offsets.extend((o[1:] + offsets[-1]).tolist())
            a, b = cols[name, feature]
            grad.append(grad_output[:, a:b])
            positions.append(p)
        ids, positions = np.concatenate(ids), np.concatenate(positions)
        psw = None if weights is None else np.asarray(weights)[positions]
        gw, gp = embedding_bag_backward(np.concatenate(grad), ids, weight_of_table[name],
                                            np.array(offsets), pooling, psw,
                                            include_last_offset=True)
        grads[name] = gw
        if gp is not None:
            for k, i in enumerate(positions):
                grad_weights[i] = gp[k] if not touched[i] else grad_weights[i] + gp[k]
                touched[i] = True
    return grads, grad_weights
