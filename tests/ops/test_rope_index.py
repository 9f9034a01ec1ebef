"""``rope_index``: Qwen2-VL / Qwen2.5-VL multimodal rotary position ids.

Checked against the NumPy oracle (tests/reference.py) on the CPU and
on CUDA (the simulator without a GPU; every case is tiny), and against
transformers' ``get_rope_index`` called as the models call it (skipped without
transformers). Bad inputs: the CPU raises ValueError / TypeError and modifies
nothing; on CUDA the data-dependent errors are deferred (raised at the next synchronising call).
"""

import types

import numpy as np
import pytest
import reference as ref
from conftest import device_cases, host, on

import numbapos
from numbapos.functional.ropeindex import rope_index

PAD, START, END, IMAGE, VIDEO = 0, 1, 2, 3, 4
IDS = dict(image_token_id=IMAGE, video_token_id=VIDEO, vision_start_token_id=START)


def _prompt(layout, merge, rng):
    """Token ids of ``layout`` (("text", n) / ("image" | "video", (t, h, w)) items), each
    vision span between START and END as the processors write it, and its grids."""
    tokens, images, videos = [], [], []
    for kind, what in layout:
        if kind == "text":
            tokens += rng.integers(10, 50, what).tolist()
            continue
        t, h, w = what
        tokens += [START] + [IMAGE if kind == "image" else VIDEO] * (t * (h // merge) *
                                                                      (w // merge)) + [END]
        (images if kind == "image" else videos).append(what)
    return tokens, images, videos


def _batch(layouts, merge=2, seed=0, dtype=np.int64):
    """Left-padded ids, mask (None when nothing is padded) and grids of ``layouts``."""
    rng = np.random.default_rng(seed)
    prompts = [_prompt(layout, merge, rng) for layout in layouts]
    length = max(len(tokens) for tokens, _, _ in prompts)
    ids = np.full((len(prompts), length), PAD, dtype)
    mask = np.zeros((len(prompts), length), np.int64)
    images, videos = [], []
    for b, (tokens, im, vi) in enumerate(prompts):
        ids[b, length - len(tokens):] = tokens
        mask[b, length - len(tokens):] = 1
        images += im
        videos += vi
    return ids, (None if mask.all() else mask), _grid(images), _grid(videos)


def _grid(rows):
    return np.array(rows, np.int64).reshape(-1, 3) if rows else None


TEXT = [("text", 7)]
ONE_IMAGE = [("text", 3), ("image", (1, 4, 6)), ("text", 2)]
IMAGES = [("image", (1, 4, 4)), ("text", 2), ("image", (1, 6, 2)), ("text", 1)]
VIDEO_ = [("text", 2), ("video", (3, 4, 4)), ("text", 3)]
LONG_VIDEO = [("text", 1), ("video", (6, 2, 4)), ("text", 2)]  # frames outrun the grid side
MIXED = [("text", 1), ("image", (1, 2, 4)), ("text", 1), ("video", (2, 4, 2)), ("text", 2)]

# (name, layouts, merge, tokens_per_second, second_per_grid_ts)
CASES = [
    ("text", [TEXT], 2, None, None),
    ("one_image", [ONE_IMAGE], 2, None, None),
    ("images", [IMAGES], 2, None, None),
    ("merge_1", [[("text", 1), ("image", (1, 2, 3)), ("text", 1)]], 1, None, None),
    ("video_qwen2", [VIDEO_], 2, None, None),
    ("video_tps", [VIDEO_], 2, 4, None),
    ("video_seconds_f32", [LONG_VIDEO], 2, 3, np.array([0.7], np.float32)),
    ("video_seconds_f64", [LONG_VIDEO], 2, 3, np.array([0.7], np.float64)),
    ("video_seconds_list", [LONG_VIDEO], 2, 25, [1 / 3]),
    ("mixed", [MIXED], 2, 2, np.array([1.0], np.float32)),
    ("left_padded", [TEXT, ONE_IMAGE, IMAGES], 2, None, None),
    ("batch_layouts", [MIXED, TEXT, VIDEO_, LONG_VIDEO], 2, 2,
     np.array([1.0, 0.5, 0.7], np.float32)),
]


def _args(case, dtype=np.int64):
    name, layouts, merge, tps, seconds = case
    ids, mask, images, videos = _batch(layouts, merge, dtype=dtype)
    return ids, dict(image_grid_thw=images, video_grid_thw=videos, attention_mask=mask,
                     second_per_grid_ts=seconds, spatial_merge_size=merge,
                     tokens_per_second=tps)


def _on(device, kwargs):
    return {key: on(device, value) if isinstance(value, np.ndarray) else value
            for key, value in kwargs.items()}


@pytest.mark.parametrize(("device", "case"), device_cases([(case,) for case in CASES]),
                         indirect=["device"])
@pytest.mark.parametrize("dtype", [np.int64, np.int32])
def test_matches_reference(device, case, dtype):
    ids, kwargs = _args(case, dtype)
    expected, expected_deltas = ref.rope_index(ids, image_token_id=IMAGE, video_token_id=VIDEO,
                                               **kwargs)
    saved = {key: np.copy(value) for key, value in kwargs.items()
             if isinstance(value, np.ndarray)}
    positions, deltas = rope_index(on(device, ids), **_on(device, kwargs), **IDS)
    assert positions.dtype == np.int64 and positions.shape == (3,) + ids.shape
    assert deltas.dtype == np.int64 and deltas.shape == (ids.shape[0], 1)
    np.testing.assert_array_equal(host(positions), expected)
    np.testing.assert_array_equal(host(deltas), expected_deltas)
    for key, value in saved.items():
        np.testing.assert_array_equal(kwargs[key], value)


def test_text_after_a_long_video_starts_at_the_larger_grid_side():
    """transformers 5's rule (not Qwen's original ``max + 1``), written out by hand."""
    ids = np.array([[7, START] + [VIDEO] * 4 + [END, 8]])
    positions, deltas = rope_index(ids, video_grid_thw=[[4, 2, 2]], second_per_grid_ts=[1.0],
                                   spatial_merge_size=2, tokens_per_second=2, **IDS)
    # Frames at 2 + 0, 2, 4, 6; the text after the span starts at 2 + max(2, 2) // 2 = 3.
    np.testing.assert_array_equal(positions[0, 0], [0, 1, 2, 4, 6, 8, 3, 4])
    np.testing.assert_array_equal(positions[1, 0], [0, 1, 2, 2, 2, 2, 3, 4])
    assert deltas[0, 0] == 8 + 1 - 8


def test_fully_padded_sequence_and_empty_sequences():
    ids = np.array([[PAD, PAD], [5, 6]])
    positions, deltas = rope_index(ids, attention_mask=np.array([[0, 0], [1, 1]]),
                                   spatial_merge_size=2, **IDS)
    np.testing.assert_array_equal(positions[:, 0], 0)
    np.testing.assert_array_equal(positions[:, 1], [[0, 1]] * 3)
    np.testing.assert_array_equal(deltas, [[0], [0]])
    positions, deltas = rope_index(np.zeros((2, 0), np.int64), spatial_merge_size=2, **IDS)
    assert positions.shape == (3, 2, 0) and deltas.tolist() == [[0], [0]]
    positions, deltas = rope_index(np.zeros((0, 4), np.int32), spatial_merge_size=2, **IDS)
    assert positions.shape == (3, 0, 4) and deltas.shape == (0, 1)


@pytest.mark.parametrize("device", ["cpu", "cuda"], indirect=True)
def test_bool_mask_int32_grids_and_strided_ids(device):
    ids, kwargs = _args(CASES[-1])
    expected = ref.rope_index(ids, image_token_id=IMAGE, video_token_id=VIDEO, **kwargs)
    kwargs = {**kwargs, "attention_mask": kwargs["attention_mask"].astype(bool),
              "image_grid_thw": kwargs["image_grid_thw"].astype(np.int32),
              "video_grid_thw": kwargs["video_grid_thw"].astype(np.int32)}
    if device == "cpu":
        ids = np.asfortranarray(ids)
    got = rope_index(on(device, ids), **_on(device, kwargs), **IDS)
    for g, want in zip(got, expected, strict=True):
        np.testing.assert_array_equal(host(g), want)


def test_torch_inputs():
    torch = pytest.importorskip("torch")
    ids, kwargs = _args(CASES[-1])
    expected = ref.rope_index(ids, image_token_id=IMAGE, video_token_id=VIDEO, **kwargs)
    tensors = {key: torch.from_numpy(value) if isinstance(value, np.ndarray) else value
               for key, value in kwargs.items()}
    got = rope_index(torch.from_numpy(ids), **tensors, **IDS)
    for g, want in zip(got, expected, strict=True):
        np.testing.assert_array_equal(g, want)


def test_parallel_kernel_matches(parallel_threshold):
    ids, kwargs = _args(CASES[-1])
    expected = ref.rope_index(ids, image_token_id=IMAGE, video_token_id=VIDEO, **kwargs)
    parallel_threshold(1)
    for got, want in zip(rope_index(ids, **kwargs, **IDS), expected, strict=True):
        np.testing.assert_array_equal(got, want)


# ---------------------------------------------------------------- transformers


def _transformers_rope_index(ids, kwargs, image_id=IMAGE, video_id=VIDEO):
    """transformers' get_rope_index, called as ``compute_3d_position_ids`` calls it, on a
    minimal model object (its config built from the config classes)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VLModel
    from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VLModel

    tps = kwargs["tokens_per_second"]
    vision = {"spatial_merge_size": kwargs["spatial_merge_size"]}
    common = dict(image_token_id=image_id, video_token_id=video_id)
    if tps is None:
        model_class = Qwen2VLModel
        config = transformers.Qwen2VLConfig(vision_config=vision, **common)
    else:
        model_class = Qwen2_5_VLModel
        config = transformers.Qwen2_5_VLConfig(vision_config={**vision,
                                                              "tokens_per_second": tps},
                                               **common)
    model = types.SimpleNamespace(config=config)
    model.get_vision_position_ids = types.MethodType(model_class.get_vision_position_ids, model)
    input_ids = torch.from_numpy(np.asarray(ids, np.int64))
    # The processors' create_mm_token_type_ids: image tokens 1, video tokens 2.
    types_ = torch.from_numpy(np.where(ids == image_id, 1, np.where(ids == video_id, 2, 0)))

    def tensor(x):
        return None if x is None else torch.from_numpy(np.asarray(x))

    extra = {}
    if tps is not None:
        seconds = kwargs["second_per_grid_ts"]
        extra["second_per_grid_ts"] = (None if seconds is None
                                       else torch.tensor(seconds) if isinstance(seconds, list)
                                       else torch.from_numpy(seconds))
    positions, deltas = model_class.get_rope_index(
        model, input_ids, image_grid_thw=tensor(kwargs["image_grid_thw"]),
        video_grid_thw=tensor(kwargs["video_grid_thw"]),
        attention_mask=tensor(kwargs["attention_mask"]), mm_token_type_ids=types_, **extra)
    return positions.numpy(), deltas.numpy()


@pytest.mark.parametrize("case", CASES, ids=[case[0] for case in CASES])
def test_matches_transformers(case):
    ids, kwargs = _args(case)
    expected, expected_deltas = _transformers_rope_index(ids, kwargs)
    positions, deltas = rope_index(ids, **kwargs, **IDS)
    np.testing.assert_array_equal(positions, expected)
    np.testing.assert_array_equal(deltas, expected_deltas.reshape(-1, 1))
    reference = ref.rope_index(ids, image_token_id=IMAGE, video_token_id=VIDEO, **kwargs)
    np.testing.assert_array_equal(reference[0], expected)


def _random_case(rng):
    """A random batch of 1-3 prompts of text, images and videos (grids up to 3 x 6 x 6)."""
    merge = int(rng.choice([1, 2]))
    layouts = []
    for _ in range(rng.integers(1, 4)):
        layout = []
        for _ in range(rng.integers(1, 5)):
            kind = str(rng.choice(["text", "image", "video"]))
            if kind == "text":
                layout.append(("text", int(rng.integers(1, 4))))
            else:
                t = 1 if kind == "image" else int(rng.integers(1, 4))
                h, w = (int(merge * rng.integers(1, 4)) for _ in range(2))
                layout.append((kind, (t, h, w)))
        layouts.append(layout)
    videos = sum(kind == "video" for layout in layouts for kind, _ in layout)
    tps = None if rng.random() < 0.3 else int(rng.integers(0, 26))
    seconds = (None if tps is None or rng.random() < 0.3
               else rng.choice([0.5, 1.0, 1 / 3, 0.7], videos).astype(np.float32))
    return ("random", layouts, merge, tps, seconds)


@pytest.mark.parametrize("seed", range(12))
def test_random_batches_match_reference_and_transformers(seed):
    case = _random_case(np.random.default_rng(seed))
    ids, kwargs = _args(case)
    positions, deltas = rope_index(ids, **kwargs, **IDS)
    expected = ref.rope_index(ids, image_token_id=IMAGE, video_token_id=VIDEO, **kwargs)
    np.testing.assert_array_equal(positions, expected[0])
    np.testing.assert_array_equal(deltas, expected[1])
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError:
        return
    from_transformers = _transformers_rope_index(ids, kwargs)
    np.testing.assert_array_equal(positions, from_transformers[0])
    np.testing.assert_array_equal(deltas, from_transformers[1].reshape(-1, 1))


def test_matches_transformers_qwen25_config_ids():
    """Called with a Qwen2.5-VL config's own ids, as the docs show."""
    transformers = pytest.importorskip("transformers")
    config = transformers.Qwen2_5_VLConfig()
    vision = config.vision_config
    ids = np.array([[9, config.vision_start_token_id] + [config.image_token_id] * 6
                    + [config.vision_end_token_id, 11, config.vision_start_token_id]
                    + [config.video_token_id] * 8 + [config.vision_end_token_id]])
    kwargs = dict(image_grid_thw=np.array([[1, 4, 6]]), video_grid_thw=np.array([[2, 4, 4]]),
                  attention_mask=None, second_per_grid_ts=np.array([0.5], np.float32),
                  spatial_merge_size=vision.spatial_merge_size,
                  tokens_per_second=vision.tokens_per_second)
    positions, deltas = rope_index(ids, image_token_id=config.image_token_id,
                                   video_token_id=config.video_token_id,
                                   vision_start_token_id=config.vision_start_token_id, **kwargs)
    expected, expected_deltas = _transformers_rope_index(ids, kwargs, config.image_token_id,
                                                         config.video_token_id)
    np.testing.assert_array_equal(positions, expected)
    np.testing.assert_array_equal(deltas, expected_deltas.reshape(-1, 1))


# ---------------------------------------------------------------- bad input


def _good():
    ids, kwargs = _args(CASES[9])  # mixed: one image, one video, scaled
    return ids, kwargs


@pytest.mark.parametrize(("change", "error", "match"), [
    (dict(spatial_merge_size=0), ValueError, "spatial_merge_size: expected an integer >= 1"),
    (dict(spatial_merge_size=2.0), TypeError, "spatial_merge_size: expected an integer"),
    (dict(video_token_id=IMAGE), ValueError, "video_token_id: expected an id other than"),
    (dict(vision_start_token_id=VIDEO), ValueError, "vision_start_token_id: expected an id"),
    (dict(tokens_per_second=-1), ValueError, "tokens_per_second: expected an integer >= 0"),
    (dict(tokens_per_second=None), ValueError, "second_per_grid_ts: needs tokens_per_second"),
    (dict(second_per_grid_ts=np.array([1, 2])), TypeError, "second_per_grid_ts: expected float"),
    (dict(second_per_grid_ts=np.ones(2, np.float32)), ValueError,
     r"second_per_grid_ts: expected shape \(1,\)"),
    (dict(second_per_grid_ts=np.array([np.nan])), ValueError, "expected finite values"),
    (dict(image_grid_thw=np.ones((1, 2), np.int64)), ValueError,
     r"image_grid_thw: expected shape \(n, 3\)"),
    (dict(image_grid_thw=np.array([[1, 0, 4]])), ValueError,
     "image_grid_thw: expected values >= 1, got 0"),
    (dict(image_grid_thw=np.array([[1.0, 2.0, 4.0]])), TypeError,
     "image_grid_thw: expected integer"),
    (dict(attention_mask=np.ones((1, 3), np.int64)), ValueError, "attention_mask"),
    (dict(attention_mask=np.full((1, 14), 2)), ValueError, "attention_mask: expected only 0 and 1"),
    (dict(image_grid_thw=None), ValueError,
     r"image_grid_thw: expected one grid per image span of input_ids \(1, .*got 0 grids"),
    (dict(video_grid_thw=np.array([[2, 4, 2], [2, 4, 2]]), second_per_grid_ts=[1.0, 1.0]),
     ValueError,
     r"video_grid_thw: expected one grid per video span of input_ids \(1, .*got 2 grids"),
    (dict(image_grid_thw=np.array([[1, 4, 4]])), ValueError,
     r"image_grid_thw: grid 0 \[1, 4, 4\] gives 4 tokens .* has 2"),
    (dict(video_grid_thw=np.array([[1, 4, 2]])), ValueError,
     r"video_grid_thw: grid 0 \[1, 4, 2\] gives 2 tokens .* has 4"),
])
def test_bad_input_cpu(change, error, match):
    ids, kwargs = _good()
    ids_ = ids.copy()
    args = {**kwargs, **IDS, **change}
    saved = {key: np.copy(value) for key, value in args.items() if isinstance(value, np.ndarray)}
    assert ids.shape == (1, 14)
    with pytest.raises(error, match=match):
        rope_index(ids, **args)
    np.testing.assert_array_equal(ids, ids_)
    for key, value in saved.items():
        np.testing.assert_array_equal(args[key], value)


@pytest.mark.parametrize("bad", [np.zeros(4, np.int64), np.zeros((1, 2, 2), np.int64)])
def test_bad_ids_shape(bad):
    with pytest.raises(ValueError, match="input_ids: expected a 2-D array"):
        rope_index(bad, spatial_merge_size=2, **IDS)


def test_bad_ids_dtype():
    with pytest.raises(TypeError, match="input_ids: expected integer indices"):
        rope_index(np.zeros((1, 3)), spatial_merge_size=2, **IDS)


@pytest.mark.parametrize(("change", "match"), [
    (dict(image_grid_thw=None), r"input_ids: item 0 .* image_grid_thw.shape\[0\]=0"),
    (dict(video_grid_thw=np.array([[2, 4, 2], [2, 4, 2]]), second_per_grid_ts=[1.0, 1.0]),
     r"video_grid_thw: item 1 .* the video spans of input_ids=1"),
    (dict(image_grid_thw=np.array([[1, 4, 4]])), r"input_ids: item 3 .* its span=2"),
    (dict(video_grid_thw=np.array([[1, 4, 2]])), r"input_ids: item 2 .* its grid=2"),
])
def test_bad_spans_are_deferred_on_cuda(change, match):
    pytest.importorskip("numba.cuda")
    if not numbapos.cuda_available():
        pytest.skip("CUDA is not available (no GPU and the simulator is off)")
    ids, kwargs = _good()
    args = {**kwargs, **IDS, **change}
    positions, deltas = rope_index(on("cuda", ids), **_on("cuda", args))  # queued, not raised
    with pytest.raises(ValueError, match=match):
        numbapos.synchronize()
    numbapos.synchronize()  # cleared: the context lives on


def test_bad_mask_value_is_deferred_on_cuda():
    pytest.importorskip("numba.cuda")
    if not numbapos.cuda_available():
        pytest.skip("CUDA is not available (no GPU and the simulator is off)")
    ids, kwargs = _good()
    args = {**_on("cuda", kwargs), "attention_mask": on("cuda", np.full(ids.shape, 2))}
    rope_index(on("cuda", ids), **args, **IDS)  # queued, not raised
    with pytest.raises(ValueError, match="attention_mask: expected only 0 and 1, got 2"):
        numbapos.synchronize()


def test_cuda_ids_with_host_arrays_and_device_mismatch():
    pytest.importorskip("numba.cuda")
    if not numbapos.cuda_available():
        pytest.skip("CUDA is not available (no GPU and the simulator is off)")
    ids, kwargs = _args(CASES[-1])
    expected = ref.rope_index(ids, image_token_id=IMAGE, video_token_id=VIDEO, **kwargs)
    positions, deltas = rope_index(on("cuda", ids), **kwargs, **IDS)  # host grids and mask
    np.testing.assert_array_equal(host(positions), expected[0])
    with pytest.raises(TypeError, match="attention_mask: is a CUDA array but input_ids is on"):
        rope_index(ids, **{**kwargs, "attention_mask": on("cuda", kwargs["attention_mask"])},
                   **IDS)
