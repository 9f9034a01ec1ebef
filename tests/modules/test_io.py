"""numbapos.io: safetensors save/load, atomic writes, dtypes, errors."""

import json
import os
import struct
import subprocess
import sys

import numpy as np
import pytest

import numbapos
from numbapos import nn
from numbapos.io import load_metadata, load_state, save_state

safetensors_numpy = pytest.importorskip("safetensors.numpy")


def write_raw_safetensors(path, entries):
    """A safetensors file by hand: entries maps name -> (dtype tag, shape, raw bytes)."""
    header, blobs, offset = {}, [], 0
    for name, (dtype, shape, raw) in entries.items():
        header[name] = {"dtype": dtype, "shape": list(shape),
                        "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def leftovers(directory, keep):
    return sorted(set(os.listdir(directory)) - set(keep))


# ----------------------------------------------------------------- round trips


def test_round_trip_dtypes_and_shapes(tmp_path, rng):
    state = {
        "f32": rng.standard_normal((3, 4)).astype(np.float32),
        "f64": rng.standard_normal(5),
        "f16": rng.standard_normal((2, 2)).astype(np.float16),
        "i32": np.arange(6, dtype=np.int32).reshape(2, 3),
        "i64": np.array([-(2**40), 2**40]),
        "u8": np.arange(4, dtype=np.uint8),
        "bool": np.array([True, False, True]),
        "c64": np.array([1 + 2j], dtype=np.complex64),
        "scalar": np.array(3.5, dtype=np.float32),
        "empty": np.empty((0, 3), dtype=np.float32),
    }
    path = tmp_path / "state.safetensors"
    assert save_state(state, path) is None
    loaded = load_state(path)
    assert set(loaded) == set(state)
    for name, want in state.items():
        got = loaded[name]
        assert got.dtype == want.dtype and got.shape == want.shape, name
        np.testing.assert_array_equal(got, want)
        assert got.flags.writeable
    assert leftovers(tmp_path, ["state.safetensors"]) == []


def test_non_contiguous_and_big_endian_arrays(tmp_path, rng):
    base = rng.standard_normal((4, 6))
    state = {"strided": base[:, ::2], "transposed": base.T, "reversed": base[::-1],
             "big_endian": np.arange(5, dtype=">f4")}
    path = str(tmp_path / "s.safetensors")
    save_state(state, path)
    loaded = load_state(path)
    for name, want in state.items():
        np.testing.assert_array_equal(loaded[name], want)
    assert loaded["big_endian"].dtype == np.float32


def test_module_round_trip(tmp_path):
    source = nn.Embedding(10, 4, padding_idx=0, seed=0)
    path = tmp_path / "emb.safetensors"
    save_state(source, path)
    loaded = load_state(path)
    assert list(loaded) == ["weight"]
    target = nn.Embedding(10, 4, seed=1)
    target.load_state_dict(loaded)
    np.testing.assert_array_equal(target.weight.data, source.weight.data)
    # Parameters are accepted as values too.
    save_state({"emb.weight": source.weight}, path)
    np.testing.assert_array_equal(load_state(path)["emb.weight"], source.weight.data)


def test_metadata(tmp_path):
    path = tmp_path / "m.safetensors"
    save_state({"a": np.ones(2)}, path, metadata={"format": "np", "step": "10"})
    assert load_metadata(path) == {"format": "np", "step": "10"}
    save_state({"a": np.ones(2)}, path)
    assert load_metadata(path) == {}


def test_overwrite_and_symlink(tmp_path):
    real = tmp_path / "real.safetensors"
    link = tmp_path / "link.safetensors"
    save_state({"a": np.zeros(2)}, real)
    os.symlink(real, link)
    save_state({"a": np.ones(3)}, link)
    assert os.path.islink(link)
    np.testing.assert_array_equal(load_state(real)["a"], np.ones(3))


def test_loaded_state_trains_in_place(tmp_path):
    path = tmp_path / "w.safetensors"
    save_state({"weight": np.ones((3, 2), dtype=np.float32)}, path)
    emb = nn.Embedding.from_pretrained(load_state(path)["weight"], freeze=False)
    emb.weight.data -= 1  # arrays from load_state are independent and writeable
    np.testing.assert_array_equal(load_state(path)["weight"], np.ones((3, 2)))


# ----------------------------------------------------------------- bfloat16 and others


def test_bfloat16_loads_as_float32_exactly(tmp_path, rng):
    values = rng.standard_normal((2, 3)).astype(np.float32)
    upper = (values.view(np.uint32) >> 16).astype("<u2")  # truncation = a bfloat16
    exact = (upper.astype(np.uint32) << 16).view(np.float32)
    path = tmp_path / "bf16.safetensors"
    write_raw_safetensors(path, {
        "w": ("BF16", (2, 3), upper.tobytes()),
        "b": ("F32", (3,), np.arange(3, dtype="<f4").tobytes()),
    })
    loaded = load_state(path)
    assert loaded["w"].dtype == np.float32 and loaded["w"].shape == (2, 3)
    np.testing.assert_array_equal(loaded["w"], exact)
    np.testing.assert_array_equal(loaded["b"], np.arange(3, dtype=np.float32))


def test_bfloat16_written_by_torch(tmp_path):
    torch = pytest.importorskip("torch")
    st_torch = pytest.importorskip("safetensors.torch")
    t = torch.randn(4, 5).to(torch.bfloat16)
    path = tmp_path / "t.safetensors"
    st_torch.save_file({"x": t, "y": torch.arange(3, dtype=torch.float16)}, str(path))
    loaded = load_state(path)
    np.testing.assert_array_equal(loaded["x"], t.float().numpy())
    assert loaded["y"].dtype == np.float16


def test_float8_is_rejected_by_name(tmp_path):
    path = tmp_path / "f8.safetensors"
    write_raw_safetensors(path, {"ok": ("F32", (1,), b"\0" * 4),
                                 "scale": ("F8_E4M3", (2,), b"\0\0")})
    with pytest.raises(ValueError, match="tensor 'scale' .* has dtype F8_E4M3, which NumPy"):
        load_state(path)


# ----------------------------------------------------------------- atomicity


def test_failed_write_leaves_existing_file_intact(tmp_path, monkeypatch):
    path = tmp_path / "ckpt.safetensors"
    save_state({"a": np.arange(4.0)}, path)
    before = path.read_bytes()

    def broken_save_file(tensors, filename, metadata=None):
        with open(filename, "wb") as f:
            f.write(b"partial")
        raise RuntimeError("disk full")

    monkeypatch.setattr(safetensors_numpy, "save_file", broken_save_file)
    with pytest.raises(RuntimeError, match="disk full"):
        save_state({"a": np.zeros(100)}, path)
    assert path.read_bytes() == before
    assert leftovers(tmp_path, ["ckpt.safetensors"]) == []


def test_failed_flush_removes_temp_and_creates_nothing(tmp_path, monkeypatch):
    def broken_fsync(path, directory=False):
        raise OSError("fsync failed")

    monkeypatch.setattr(numbapos.io, "_fsync", broken_fsync)
    with pytest.raises(OSError, match="fsync failed"):
        save_state({"a": np.ones(2)}, tmp_path / "new.safetensors")
    assert os.listdir(tmp_path) == []


def test_interrupted_write_cleans_up(tmp_path, monkeypatch):
    def interrupted(tensors, filename, metadata=None):
        open(filename, "wb").close()
        raise KeyboardInterrupt

    monkeypatch.setattr(safetensors_numpy, "save_file", interrupted)
    with pytest.raises(KeyboardInterrupt):
        save_state({"a": np.ones(2)}, tmp_path / "x.safetensors")
    assert os.listdir(tmp_path) == []


# ----------------------------------------------------------------- errors


@pytest.mark.parametrize("state,match", [
    ({"a": object()}, "save_state: 'a' must be a NumPy array, got object"),
    ({"a": [1.0, object()]}, r"save_state: state\['a'\]\[1\]: cannot store a object"),
    ({1: np.ones(2)}, "save_state: tensor names must be str, got int 1"),
    ({"a": np.array([None])}, "save_state: 'a' has dtype object, which safetensors cannot"),
    ({"a": np.ones(2, np.complex128)}, "'a' has dtype complex128, which safetensors cannot"),
    ([np.ones(2)], "module_or_dict: expected a numbapos Module or a mapping"),
])
def test_bad_state(tmp_path, state, match):
    with pytest.raises(TypeError, match=match):
        save_state(state, tmp_path / "x.safetensors")
    assert os.listdir(tmp_path) == []


def test_lists_and_scalars_are_nested_state(tmp_path):
    # They raised TypeError before nested state (tests/modules/test_checkpoints.py) was saved.
    for state in ({"a": [1.0, 2.0]}, {"a": 1.0}):
        save_state(state, tmp_path / "x.safetensors")
        assert load_state(tmp_path / "x.safetensors") == state


@pytest.mark.parametrize("metadata,match", [
    ({"step": 1}, "metadata: keys and values must be str"),
    ("text", "metadata: expected a mapping of str to str, got str"),
])
def test_bad_metadata(tmp_path, metadata, match):
    with pytest.raises(TypeError, match=match):
        save_state({"a": np.ones(2)}, tmp_path / "x.safetensors", metadata=metadata)
    assert os.listdir(tmp_path) == []


def test_bytes_path(tmp_path):
    path = bytes(tmp_path / "b.safetensors")
    save_state({"a": np.ones(2)}, path)
    np.testing.assert_array_equal(load_state(path)["a"], np.ones(2))


def test_bad_paths(tmp_path):
    with pytest.raises(FileNotFoundError, match="directory .* does not exist"):
        save_state({"a": np.ones(2)}, tmp_path / "missing" / "x.safetensors")
    with pytest.raises(IsADirectoryError, match="is a directory"):
        save_state({"a": np.ones(2)}, tmp_path)
    with pytest.raises(TypeError, match="path: expected a str or os.PathLike, got int"):
        save_state({"a": np.ones(2)}, 3)
    with pytest.raises(ValueError, match="path: expected a file path, got an empty string"):
        save_state({"a": np.ones(2)}, "")
    with pytest.raises(FileNotFoundError):
        load_state(tmp_path / "nope.safetensors")
    (tmp_path / "garbage.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(Exception):  # noqa: B017 - safetensors' own error type
        load_state(tmp_path / "garbage.safetensors")


def test_missing_safetensors_gives_install_hint(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "safetensors", None)
    monkeypatch.setitem(sys.modules, "safetensors.numpy", None)
    with pytest.raises(ImportError, match=r"pip install numbapos\[io\]"):
        save_state({"a": np.ones(2)}, tmp_path / "x.safetensors")
    with pytest.raises(ImportError, match=r"pip install numbapos\[io\]"):
        load_state(tmp_path / "x.safetensors")


def test_import_numbapos_does_not_import_safetensors():
    code = ("import sys, numbapos; import numbapos.io; "
            "assert 'safetensors' not in sys.modules; print('ok')")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"
