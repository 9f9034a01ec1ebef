"""CUDA launcher and kernels of the multimodal rotary's position ids (``get_rope_index``).

Twin of :mod:`numbapos.kernels.cpu.ropeindex` (same ``__all__``, signature and
positions). Two launches, one thread per sequence each (prompts are few and
short; a sequence is a serial scan): the first counts each sequence's image and
video spans, the second sums the counts of the sequences before its own (its
first grids) and writes the positions and the delta. Nothing is read back.

What the CPU raises as ValueError is recorded here in the deferred error word
(:mod:`.errors`, raised as the same ValueError's kind at a later call): a span that
needs a grid past the last one (the span's grid number against ``*_grid_thw.shape[0]``),
a span longer than its grid (the token's index in the span against the grid's tokens), a
span shorter than its grid (the grid's last token index against the span's tokens),
grids left over (the first unused row against the number of spans) and a mask value
other than 0 and 1 (counted as padding).
"""

import numpy as np
from numba import cuda, float32, float64, int64

from ..._gpuhost.launch import launch
from . import errors
from .arrays import THREADS, empty, grid

__all__ = ["rope_index"]

TEXT, IMAGE, VIDEO = 0, 1, 2


def rope_index(input_ids, attention_mask, image_grid_thw, video_grid_thw, second_per_grid_ts,
               token_ids, spatial_merge_size, tokens_per_second, position_ids, deltas):
    """Fill ``position_ids`` (3, B, L) and ``deltas`` (B, 1), both int64 device arrays (see
    the CPU twin for the arguments; empty arrays stand for absent ones)."""
    batch = input_ids.shape[0]
    if batch == 0:
        return
    image_id, video_id = token_ids
    counts = empty((batch, 2), np.int64)
    word, host = errors.words()
    binary = errors.tag("attention_mask", "", "binary")
    launch(_count_spans, grid(batch), THREADS, input_ids, attention_mask, np.int64(image_id),
           np.int64(video_id), counts, word, host, binary)
    tags = np.array([
        errors.tag("input_ids", "image_grid_thw.shape[0]", "count"),
        errors.tag("input_ids", "video_grid_thw.shape[0]", "count"),
        errors.tag("input_ids", "the tokens of its grid", "count"),
        errors.tag("input_ids", "the tokens of its span", "count"),
        errors.tag("image_grid_thw", "the image spans of input_ids", "count"),
        errors.tag("video_grid_thw", "the video spans of input_ids", "count"),
    ], np.int64)
    single = second_per_grid_ts.dtype == np.float32
    launch(_fill_positions, grid(batch), THREADS, input_ids, attention_mask, image_grid_thw,
           video_grid_thw, second_per_grid_ts, single, np.int64(image_id), np.int64(video_id),
           np.int64(spatial_merge_size), np.int64(tokens_per_second), counts, position_ids,
           deltas, word, host, tags[0], tags[1], tags[2], tags[3], tags[4], tags[5])
    errors.after_launch()


# ---------------------------------------------------------------- device helpers


@cuda.jit(device=True)
def _kind(token, image_id, video_id):
    if token == image_id:
        return IMAGE
    if token == video_id:
        return VIDEO
    return TEXT


@cuda.jit(device=True)
def _attended(mask, b, l, flat, word, host, binary):
    """Whether token ``(b, l)`` is attended; a mask value other than 0 and 1 counts as
    padding (and is recorded unless ``binary`` is -1: the count kernel records it)."""
    if mask.size == 0:
        return True
    value = int64(mask[b, l])
    if value != 0 and value != 1:
        if binary >= 0:
            errors.record(word, host, flat, value, int64(0), binary)
        return False
    return value == 1


@cuda.jit(device=True)
def _temporal(i, seconds, single, video, tps):
    """The CPU twin's ``_temporal``: the same float type, no FMA (a product alone)."""
    if tps < 0:
        return int64(i)
    if seconds.size == 0:
        return int64(i) * tps
    if single:
        interval = float32(tps) * float32(seconds[video])
        return int64(float32(i) * interval)
    return int64(float64(i) * (float64(tps) * float64(seconds[video])))


# ---------------------------------------------------------------- kernels


@cuda.jit
def _count_spans(input_ids, mask, image_id, video_id, counts, word, host, binary):
    """``counts[b] = (image spans, video spans)`` of sequence ``b``, one thread per sequence."""
    length = input_ids.shape[1]
    for b in range(cuda.grid(1), input_ids.shape[0], cuda.gridsize(1)):
        images = int64(0)
        videos = int64(0)
        previous = TEXT
        for l in range(length):
            if not _attended(mask, b, l, int64(b * length + l), word, host, binary):
                continue
            kind = _kind(input_ids[b, l], image_id, video_id)
            if kind != previous:
                if kind == IMAGE:
                    images += 1
                elif kind == VIDEO:
                    videos += 1
            previous = kind
        counts[b, 0] = images
        counts[b, 1] = videos


@cuda.jit
def _fill_positions(input_ids, mask, image_grids, video_grids, seconds, single, image_id,
                    video_id, merge, tps, counts, out, deltas, word, host, past_images,
                    past_videos, too_long, too_short, unused_images, unused_videos):
    """One thread per sequence, the CPU twin's scan; bad spans recorded (see the module)."""
    batch = input_ids.shape[0]
    length = input_ids.shape[1]
    for b in range(cuda.grid(1), batch, cuda.gridsize(1)):
        image = int64(0)
        video = int64(0)
        for r in range(b):
            image += counts[r, 0]
            video += counts[r, 1]
        if b == batch - 1:  # the last sequence sees every span: grids left over?
            if image + counts[b, 0] < image_grids.shape[0]:
                errors.record(word, host, int64(3 * (image + counts[b, 0])),
                              image + counts[b, 0], image + counts[b, 0], unused_images)
            if video + counts[b, 1] < video_grids.shape[0]:
                errors.record(word, host, int64(3 * (video + counts[b, 1])),
                              video + counts[b, 1], video + counts[b, 1], unused_videos)
        current = int64(0)
        largest = int64(-1)
        attended = int64(0)
        previous = TEXT
        start = int64(0)
        span_flat = int64(0)
        k = int64(0)
        size = int64(0)
        gh = int64(1)
        gw = int64(1)
        video_index = int64(0)
        for l in range(length):
            flat = int64(b * length + l)
            if not _attended(mask, b, l, flat, word, host, -1):
                out[0, b, l] = 0
                out[1, b, l] = 0
                out[2, b, l] = 0
                continue
            attended += 1
            kind = _kind(input_ids[b, l], image_id, video_id)
            if kind != previous and previous != TEXT and k < size:
                errors.record(word, host, span_flat, size - 1, k, too_short)
            if kind == TEXT:
                out[0, b, l] = current
                out[1, b, l] = current
                out[2, b, l] = current
                largest = max(largest, current)
                current += 1
            else:
                if kind != previous:
                    gt = int64(0)
                    hh = int64(0)
                    ww = int64(0)
                    if kind == IMAGE:
                        if image < image_grids.shape[0]:
                            gt = int64(image_grids[image, 0])
                            hh = int64(image_grids[image, 1])
                            ww = int64(image_grids[image, 2])
                        else:
                            errors.record(word, host, flat, image, int64(image_grids.shape[0]),
                                          past_images)
                        image += 1
                    else:
                        if video < video_grids.shape[0]:
                            gt = int64(video_grids[video, 0])
                            hh = int64(video_grids[video, 1])
                            ww = int64(video_grids[video, 2])
                        else:
                            errors.record(word, host, flat, video, int64(video_grids.shape[0]),
                                          past_videos)
                        video_index = video
                        video += 1
                    gh = hh // merge
                    gw = ww // merge
                    size = gt * gh * gw
                    start = current
                    current = start + max(hh, ww) // merge
                    span_flat = flat
                    k = 0
                if k < size:
                    frame = k // (gh * gw)
                    rest = k - frame * gh * gw
                    row = rest // gw
                    t = frame
                    if kind == VIDEO:
                        t = _temporal(frame, seconds, single, video_index, tps)
                    t += start
                    h = start + row
                    w = start + rest - row * gw
                    out[0, b, l] = t
                    out[1, b, l] = h
                    out[2, b, l] = w
                    largest = max(largest, max(t, max(h, w)))
                else:
                    out[0, b, l] = 0
                    out[1, b, l] = 0
                    out[2, b, l] = 0
                    errors.record(word, host, flat, k, size, too_long)
                k += 1
            previous = kind
        if previous != TEXT and k < size:
            errors.record(word, host, span_flat, size - 1, k, too_short)
        deltas[b, 0] = largest + 1 - attended
