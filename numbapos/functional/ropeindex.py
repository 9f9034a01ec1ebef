"""Position ids of the multimodal rotary: Qwen2-VL's and Qwen2.5-VL's ``get_rope_index``."""

from __future__ import annotations

import numpy as np

from .. import _checks, _device
from ._common import backend_for, on_backend

__all__ = ["rope_index"]


def rope_index(input_ids, *, image_grid_thw=None, video_grid_thw=None, attention_mask=None,
               second_per_grid_ts=None, spatial_merge_size, image_token_id, video_token_id,
               vision_start_token_id, tokens_per_second=None):
    """The three position streams (temporal, height, width) of a Qwen2-VL / Qwen2.5-VL prompt.

    Equal to transformers 5's ``Qwen2VLModel.get_rope_index`` (with
    ``tokens_per_second=None``) and ``Qwen2_5_VLModel.get_rope_index`` (with the
    vision config's ``tokens_per_second``). Per sequence, over its attended
    tokens: a text token gets the current position in all three streams, which
    then grows by one. A vision span (a run of ``image_token_id`` or of
    ``video_token_id`` tokens; transformers 5 reads the same runs from the
    processor's ``mm_token_type_ids``, which marks exactly these ids 1 and 2)
    takes the next grid ``(t, h, w)`` of its kind, in order across the batch,
    and holds ``t * (h // m) * (w // m)`` tokens (``m = spatial_merge_size``),
    frame by frame, row by row; token ``(i, j, k)`` gets ``(start + T(i),
    start + j, start + k)``. The text after the span starts at ``start +
    max(h, w) // m``, as in transformers 5; Qwen's original code (and
    transformers 4) started it one past the span's largest position, which
    differs after videos whose scaled frames run past the grid's larger side.
    ``T(i) = i`` for images and for Qwen2-VL's videos; for Qwen2.5-VL's videos
    ``T(i) = trunc(i * tokens_per_second * second_per_grid_ts[v])``, computed
    in ``second_per_grid_ts``'s float type (``i * tokens_per_second`` without
    it). Padding (``attention_mask == 0``) gets position 0 in all streams.

    Parameters
    ----------
    input_ids : array_like of int32 or int64, shape (B, L)
        Token ids (NumPy or CUDA; the result is on the same device).
    image_grid_thw, video_grid_thw : array_like of int, shape (n, 3), optional
        One ``(t, h, w)`` patch grid per image / video span, in order of the
        spans over the batch; values >= 1.
    attention_mask : array_like of 0 / 1, shape (B, L), optional
        Positions are counted over the attended tokens only (left padding).
    second_per_grid_ts : array_like of float, shape (num_videos,), optional
        Seconds per temporal grid step of each video (Qwen2.5-VL's processor
        output); needs ``tokens_per_second``. float32 or float64 arrays keep
        their type; lists become float32 (as ``torch.tensor`` makes them).
    spatial_merge_size : int
        The vision config's ``spatial_merge_size`` (>= 1).
    image_token_id, video_token_id : int
        The ids of the image and video placeholder tokens (different).
    vision_start_token_id : int
        The config's ``vision_start_token_id``. Qwen's original code found the
        spans after it; transformers 5, and this function, find them as runs of
        image / video tokens, so it is only checked to be an int that differs
        from both placeholder ids (it precedes every span the processors write).
    tokens_per_second : int, optional
        Qwen2.5-VL's ``vision_config.tokens_per_second`` (>= 0): videos' frames
        are spaced by it. None (Qwen2-VL): frames are numbered 0, 1, ...

    Returns
    -------
    position_ids : ndarray of int64, shape (3, B, L)
    rope_deltas : ndarray of int64, shape (B, 1)
        Per sequence, its largest position + 1 - its attended tokens (0 for a
        sequence with none): what decoding adds to the cache length.

    Raises
    ------
    TypeError
        Non-integer ids, grids or mask; float ``second_per_grid_ts`` of another
        type; arrays on different devices.
    ValueError
        Wrong shapes, a ``spatial_merge_size`` below 1, equal token ids, grid
        values below 1, ``second_per_grid_ts`` without ``tokens_per_second`` or
        of the wrong length, a mask value other than 0 and 1, a number of grids
        other than the number of spans, or a span whose length is not its
        grid's ``t * (h // m) * (w // m)``. On CUDA the data-dependent errors
        are deferred (:mod:`numbapos._gpuhost.errors`): a span past the
        grids, or longer than its grid, raises ValueError at the next
        synchronising call; see the CUDA launcher for what it cannot see.

    Examples
    --------
    >>> import numpy as np
    >>> from numbapos.functional import rope_index
    >>> ids = np.array([[5, 1, 9, 9, 9, 9, 2, 5]])  # text, <vision_start>, 4 image tokens, ...
    >>> pos, deltas = rope_index(ids, image_grid_thw=np.array([[1, 4, 4]]), spatial_merge_size=2,
    ...                          image_token_id=9, video_token_id=8, vision_start_token_id=1)
    >>> pos[:, 0]
    array([[0, 1, 2, 2, 2, 2, 4, 5],
           [0, 1, 2, 2, 3, 3, 4, 5],
           [0, 1, 2, 3, 2, 3, 4, 5]])
    >>> deltas
    array([[-2]])
    """
    ids = _checks.check_index_array(input_ids, "input_ids")
    K = backend_for((ids,), ("input_ids",))
    if ids.ndim != 2:
        raise ValueError(f"input_ids: expected a 2-D array (B, L), got shape {tuple(ids.shape)}")
    merge = _checks.check_int(spatial_merge_size, "spatial_merge_size", minimum=1,
                              maximum=_checks.INT64_MAX)
    image_id = _checks.check_int64(image_token_id, "image_token_id")
    video_id = _checks.check_int64(video_token_id, "video_token_id")
    start_id = _checks.check_int64(vision_start_token_id, "vision_start_token_id")
    if image_id == video_id:
        raise ValueError(f"video_token_id: expected an id other than image_token_id "
                         f"({image_id}), got {video_id}")
    if start_id in (image_id, video_id):
        raise ValueError(f"vision_start_token_id: expected an id other than image_token_id "
                         f"({image_id}) and video_token_id ({video_id}), got {start_id}")
    tps = -1
    if tokens_per_second is not None:
        tps = _checks.check_int(tokens_per_second, "tokens_per_second", minimum=0,
                                maximum=_checks.INT64_MAX)
    shape = tuple(ids.shape)
    mask = _mask(K, attention_mask, shape)
    image_grids = _grids(K, image_grid_thw, "image_grid_thw")
    video_grids = _grids(K, video_grid_thw, "video_grid_thw")
    seconds = _seconds(K, second_per_grid_ts, video_grids.shape[0], tps)
    position_ids = K.empty((3,) + shape, np.int64)
    deltas = K.empty((shape[0], 1), np.int64)
    if shape[0]:
        K.rope_index(K.contiguous(ids), mask, image_grids, video_grids, seconds,
                     (image_id, video_id), merge, tps, position_ids, deltas)
    return position_ids, deltas


def _on_device(K, x, name):
    """``x`` (checked) on K's device; TypeError for a CUDA array with CPU ``input_ids``."""
    if _device.is_cuda_array(x) and K.DEVICE == "cpu":
        raise TypeError(f"{name}: is a CUDA array but input_ids is on 'cpu'; move them to one "
                        "device first (numbapos.to_device)")
    return x if K.DEVICE == "cpu" or _device.is_cuda_array(x) else K.asarray(x)


def _mask(K, attention_mask, shape):
    if attention_mask is None:
        return K.empty((0, 0), np.int64)  # no mask: every token attended
    mask = _checks.check_attention_mask(attention_mask, "attention_mask")
    _checks.check_same_shape(mask, shape, "attention_mask", "input_ids.shape")
    return K.contiguous(_on_device(K, mask, "attention_mask"))


def _grids(K, grids, name):
    if grids is None:
        return K.empty((0, 3), np.int64)
    arr = _checks.check_index_array(grids, name)
    if arr.ndim != 2 or arr.shape[1] != 3:
        raise ValueError(f"{name}: expected shape (n, 3) of (t, h, w) rows, got shape "
                         f"{tuple(arr.shape)}")
    if isinstance(arr, np.ndarray) and arr.size and arr.min() < 1:
        flat = arr.reshape(-1)
        bad = int(np.argmax(flat < 1))
        raise ValueError(f"{name}: expected values >= 1, got {int(flat[bad])} at row "
                         f"{bad // 3}")
    return K.contiguous(on_backend(K, arr, name))


def _seconds(K, second_per_grid_ts, num_videos, tps):
    if second_per_grid_ts is None:
        return K.empty(0, np.float64)
    if tps < 0:
        raise ValueError("second_per_grid_ts: needs tokens_per_second (Qwen2.5-VL's "
                         "vision_config.tokens_per_second); Qwen2-VL has no temporal scaling")
    if isinstance(second_per_grid_ts, (list, tuple)):
        arr = np.asarray(second_per_grid_ts, dtype=np.float32)  # torch.tensor's default dtype
    else:
        arr = _checks.as_array(second_per_grid_ts, "second_per_grid_ts")
    if arr.dtype not in (np.float32, np.float64):
        raise TypeError(f"second_per_grid_ts: expected float32 or float64 values, got dtype "
                        f"{arr.dtype}")
    if arr.ndim != 1 or arr.shape[0] != num_videos:
        raise ValueError(f"second_per_grid_ts: expected shape ({num_videos},), one value per "
                         f"video grid, got shape {tuple(arr.shape)}")
    if isinstance(arr, np.ndarray) and not np.isfinite(arr).all():
        raise ValueError(f"second_per_grid_ts: expected finite values, got "
                         f"{float(arr[~np.isfinite(arr)][0])}")
    return K.contiguous(_on_device(K, arr, "second_per_grid_ts"))
