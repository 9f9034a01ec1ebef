"""CPU kernels of the multimodal rotary's position ids (Qwen2-VL / Qwen2.5-VL ``get_rope_index``).

Launchers (``__all__``, twinned in ``kernels/cuda/ropeindex.py``) take validated
arrays and caller-owned outputs. A vision span is a run of image (or video)
tokens among the attended tokens of a sequence; spans take their grids in
order across the batch, so a first kernel counts each sequence's spans, a
prefix sum gives each sequence its first grid, and the fill kernel then runs one
sequence per iteration (``prange``). Spans whose length does not match their
grid, and grids left over or missing, raise ValueError before the launcher
returns (the outputs are the caller's fresh arrays; no input is modified).
"""

import numpy as np
from numba import prange

from .arrays import pick
from .jit import kernel

__all__ = ["rope_index"]

TEXT, IMAGE, VIDEO = 0, 1, 2


def rope_index(input_ids, attention_mask, image_grid_thw, video_grid_thw, second_per_grid_ts,
               token_ids, spatial_merge_size, tokens_per_second, position_ids, deltas):
    """Fill ``position_ids`` (3, B, L) and ``deltas`` (B, 1), both int64.

    ``input_ids`` and ``attention_mask`` are (B, L) (the mask may be empty,
    shape (0, 0): every token attended); ``image_grid_thw`` / ``video_grid_thw``
    are (n, 3) integer arrays (n may be 0); ``second_per_grid_ts`` a float32 or
    float64 array of one value per video, or empty; ``token_ids`` is
    ``(image_token_id, video_token_id)``; ``tokens_per_second`` an int, ``-1``
    for none (Qwen2-VL: no temporal scaling). The mask's values were checked by
    the caller (a host mask is small; any nonzero value counts as attended here).
    Raises ValueError for grids that do not match the spans or a span whose
    length is not its grid's ``t * (h // m) * (w // m)``.
    """
    batch = input_ids.shape[0]
    image_id, video_id = token_ids
    counts = np.zeros((batch, 2), np.int64)
    work = input_ids.size
    pick(_count_spans, work)(input_ids, attention_mask, image_id, video_id, counts)
    firsts = np.zeros((batch, 2), np.int64)
    np.cumsum(counts[:-1], axis=0, out=firsts[1:])
    for kind, grids, name in ((0, image_grid_thw, "image_grid_thw"),
                              (1, video_grid_thw, "video_grid_thw")):
        total = int(counts[:, kind].sum())
        if total != grids.shape[0]:
            what = "image" if kind == 0 else "video"
            raise ValueError(f"{name}: expected one grid per {what} span of input_ids ({total}, "
                             f"counted over the attended tokens), got {grids.shape[0]} grids")
    tps = np.int64(tokens_per_second)
    single = second_per_grid_ts.dtype == np.float32
    status = np.full(batch, -1, np.int64)
    pick(_fill_positions, work)(input_ids, attention_mask, image_grid_thw, video_grid_thw,
                                second_per_grid_ts, single, image_id, video_id,
                                np.int64(spatial_merge_size), tps, firsts, position_ids, deltas,
                                status)
    bad = np.flatnonzero(status >= 0)
    if bad.size:
        b = int(bad[0])
        _raise_span_error(input_ids, attention_mask, b, int(status[b]), image_grid_thw,
                          video_grid_thw, firsts[b], image_id, spatial_merge_size)


def _raise_span_error(input_ids, attention_mask, b, start, image_grid_thw, video_grid_thw,
                      first, image_id, merge):
    """The ValueError of the span of sequence ``b`` starting at column ``start``."""
    ids = input_ids[b]
    keep = (np.ones(ids.size, bool) if attention_mask.size == 0
            else attention_mask[b].astype(bool))
    token = ids[start]
    kinds = np.where(ids == token, 1, 0)
    kinds[~keep] = -1
    # The span: attended tokens of this id from ``start`` on, padding skipped.
    attended = np.flatnonzero(keep[start:]) + start
    length = 0
    for col in attended:
        if kinds[col] != 1:
            break
        length += 1
    # Its grid: how many spans of this kind the sequence has before it.
    before = _attended_spans(kinds[:start][keep[:start]])
    is_image = token == image_id
    row = int(first[0 if is_image else 1]) + before
    grids, name = ((image_grid_thw, "image_grid_thw") if is_image
                   else (video_grid_thw, "video_grid_thw"))
    t, h, w = (int(v) for v in grids[row])
    expected = t * (h // merge) * (w // merge)
    raise ValueError(
        f"{name}: grid {row} {[t, h, w]} gives {expected} tokens (t * (h // {merge}) * "
        f"(w // {merge})), but its span in input_ids[{b}] (from column {start}) has {length}")


def _attended_spans(kinds) -> int:
    """How many runs of 1 ``kinds`` holds."""
    ones = np.asarray(kinds) == 1
    return int(np.count_nonzero(ones[1:] & ~ones[:-1]) + (1 if ones.size and ones[0] else 0))


# ---------------------------------------------------------------- kernels


@kernel(inline="always")
def _kind(token, image_id, video_id):
    if token == image_id:
        return IMAGE
    if token == video_id:
        return VIDEO
    return TEXT


@kernel(parallel=True)
def _count_spans(input_ids, mask, image_id, video_id, counts):
    """``counts[b] = (image spans, video spans)`` of sequence ``b``, one sequence per thread."""
    masked = mask.size > 0
    for b in prange(input_ids.shape[0]):
        previous = TEXT
        for l in range(input_ids.shape[1]):
            if masked and mask[b, l] == 0:
                continue
            kind = _kind(input_ids[b, l], image_id, video_id)
            if kind != previous and kind != TEXT:
                counts[b, kind - 1] += 1
            previous = kind


@kernel(inline="always")
def _temporal(i, seconds, single, video, tps):
    """The temporal offset of frame ``i``: ``i``, or ``i * tokens_per_second``, or
    ``trunc(i * (tokens_per_second * seconds[video]))`` in the seconds' float type."""
    if tps < 0:
        return np.int64(i)
    if seconds.size == 0:
        return np.int64(i) * tps
    if single:
        interval = np.float32(tps) * np.float32(seconds[video])
        return np.int64(np.float32(i) * interval)
    return np.int64(np.float64(i) * (np.float64(tps) * np.float64(seconds[video])))


@kernel(parallel=True)
def _fill_positions(input_ids, mask, image_grids, video_grids, seconds, single, image_id,
                    video_id, merge, tps, firsts, out, deltas, status):
    """One sequence per thread: text tokens count on from the current position; a span's
    tokens take (start + t', start + h, start + w) over its grid (t' the scaled frame),
    and the text after it starts at ``start + max(h, w) // merge``. ``status[b]`` gets the
    first column of a span whose length does not match its grid."""
    masked = mask.size > 0
    length = input_ids.shape[1]
    for b in prange(input_ids.shape[0]):
        image = firsts[b, 0]
        video = firsts[b, 1]
        current = np.int64(0)
        largest = np.int64(-1)
        attended = np.int64(0)
        previous = TEXT
        start = np.int64(0)
        span_col = -1
        k = np.int64(0)  # the token's index in its span
        size = np.int64(0)  # the span's tokens by its grid
        gh = np.int64(1)
        gw = np.int64(1)
        video_index = np.int64(0)
        for l in range(length):
            if masked and mask[b, l] == 0:
                out[0, b, l] = 0
                out[1, b, l] = 0
                out[2, b, l] = 0
                continue
            attended += 1
            kind = _kind(input_ids[b, l], image_id, video_id)
            if kind != previous and previous != TEXT and k != size and status[b] < 0:
                status[b] = span_col
            if kind == TEXT:
                out[0, b, l] = current
                out[1, b, l] = current
                out[2, b, l] = current
                largest = max(largest, current)
                current += 1
            else:
                if kind != previous:  # a new span: the next grid of its kind
                    if kind == IMAGE:
                        gt = np.int64(image_grids[image, 0])
                        hh = np.int64(image_grids[image, 1])
                        ww = np.int64(image_grids[image, 2])
                        image += 1
                    else:
                        gt = np.int64(video_grids[video, 0])
                        hh = np.int64(video_grids[video, 1])
                        ww = np.int64(video_grids[video, 2])
                        video_index = video
                        video += 1
                    gh = hh // merge
                    gw = ww // merge
                    size = gt * gh * gw
                    start = current
                    current = start + max(hh, ww) // merge
                    span_col = l
                    k = 0
                if k < size:
                    frame = k // (gh * gw)
                    rest = k - frame * gh * gw
                    row = rest // gw
                    t = start + (_temporal(frame, seconds, single, video_index, tps)
                                 if kind == VIDEO else frame)
                    h = start + row
                    w = start + rest - row * gw
                    out[0, b, l] = t
                    out[1, b, l] = h
                    out[2, b, l] = w
                    largest = max(largest, max(t, max(h, w)))
                elif status[b] < 0:
                    status[b] = span_col
                k += 1
            previous = kind
        if previous != TEXT and k != size and status[b] < 0:
            status[b] = span_col
        deltas[b, 0] = largest + 1 - attended
