"""What ``python -m numbapos bench`` times: the cases, their sizes and every side's code.

A case names its shape and, per side (``numbapos``, ``numpy``, ``torch``,
``cupy``), a factory ``make(inputs, device)`` that prepares the arrays on the
device and returns a zero-argument callable doing one call of the work. The
NumPy side exists on the CPU only, CuPy's on CUDA only; PyTorch's runs on the
device asked for. The shapes are those of ``benchmarks/`` and of the issue's
targets: BERT-base (vocabulary 30522, D = 768) and MiniLM (D = 384) blocks,
32 x 128 tokens, and the sparse training step at V = 50,000, 32 x 512 tokens.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from itertools import cycle
from typing import NamedTuple

import numpy as np

from .. import _device, nn, no_grad, optim
from .. import functional as F
from . import peers
from .data import (
    LN_EPS,
    Inputs,
    Shape,
    Sizes,
    bag_grad,
    batches,
    bert_block,
    collection_batches,
    collection_ids,
    gpt2_block,
    layer_norm_params,
    primed,
    rope_qk,
    t5_table,
)

Factory = Callable[[Inputs, str], Callable[[], object]]


class Case(NamedTuple):
    """One row of the table: ``sides`` maps a side's name to its :data:`Factory`.

    ``moved(shape)``: bytes read and written by one call (for GB/s), or None.
    """

    name: str
    shape: Shape
    sides: dict
    moved: Callable[[Shape], int] | None = None
    note: str = ""


def _on(device, *arrays):
    return [_device.to_device(a, device) for a in arrays]


# ------------------------------------------------------------------ numbapos sides


def _lookup(x, device):
    weight, ids = _on(device, x.weight, x.ids)
    return lambda: F.embedding(ids, weight)


def _lookup_out(x, device):
    weight, ids = _on(device, x.weight, x.ids)
    out = _device.empty(x.ids.shape + (x.shape.dim,), np.float32, device)
    return lambda: F.embedding(ids, weight, out=out)


def _backward(sparse):
    def make(x, device):
        grad, ids = _on(device, x.grad, x.ids)
        return lambda: F.embedding_backward(grad, ids, x.shape.vocab, sparse=sparse)
    return make


def _training_step(module, grad_of, fused, **options):
    """Forward, backward and SGD of a sparse ``module`` (``nn.Embedding`` or
    ``nn.EmbeddingBag``), a new batch of ids each step; ``fused``: the update inside the
    backward (``SGD.fuse_with_backward``: the row sums applied inside the update)."""
    def make(x, device):
        # A table the module initialises (seeded), as a user's is: from 32 MB on in huge
        # pages (numbapos._alignment). Its values do not change times.
        layer = module(x.shape.vocab, x.shape.dim, sparse=True, device=device, seed=0)
        opt = optim.SGD(layer.parameters(), lr=1e-3, **options)
        if fused:
            opt.fuse_with_backward()
        id_batches = cycle(_on(device, *batches(x)))
        (grad,) = _on(device, grad_of(x))

        def step():
            layer.zero_grad()
            layer(next(id_batches))
            layer.backward(grad)
            opt.step()
        return primed(step, x)
    return make


def _sparse_step(fused):
    return _training_step(nn.Embedding, lambda x: x.grad, fused, momentum=0.9)


def _bag(mode):
    def make(x, device):
        weight, ids = _on(device, x.weight, x.ids)
        return lambda: F.embedding_bag(ids, weight, mode=mode)
    return make


def _bag_sparse_step(fused):
    return _training_step(partial(nn.EmbeddingBag, mode="sum"), bag_grad, fused)


def _collection(tables):
    def make(x, device):
        from ..jagged import KeyedJaggedArray

        keys, values, lengths = collection_ids(x, tables)
        rows = x.shape.vocab // tables
        ebc = nn.EmbeddingBagCollection(  # its own seeded tables: values do not change times
            [nn.EmbeddingBagConfig(f"t{t}", rows, x.shape.dim, [key])
             for t, key in enumerate(keys)], device=device, seed=0)
        kjt = KeyedJaggedArray(keys, *_on(device, values, lengths))

        def forward():  # an inference forward, as the peer's (its tables need no gradient)
            with no_grad():
                return ebc(kjt).values()
        return forward
    return make


def _collection_step(tables):
    """Forward, backward and Adagrad fused into the backward of a collection of ``tables``
    sum tables, a new batch each step (the tables are updated inside ``backward``)."""
    def make(x, device):
        from ..jagged import KeyedJaggedArray

        keys = [f"f{t}" for t in range(tables)]
        ebc = nn.EmbeddingBagCollection(
            [nn.EmbeddingBagConfig(f"t{t}", x.shape.vocab // tables, x.shape.dim, [key])
             for t, key in enumerate(keys)], device=device, seed=0)
        optim.Adagrad(ebc.parameters(), lr=0.01).fuse_with_backward()
        kjts = cycle([KeyedJaggedArray(keys, *_on(device, values, lengths))
                      for values, lengths in collection_batches(x, tables)])
        (grad,) = _on(device, np.tile(bag_grad(x), (1, tables)))

        def step():
            ebc(next(kjts))
            ebc.backward(grad)
        return primed(step, x)
    return make


def _layer_norm(x, device):
    rows, w, b = _on(device, x.grad_rows, *layer_norm_params(x.shape.dim))
    return lambda: F.layer_norm(rows, w, b, LN_EPS)


def _layer_norm_backward(x, device):
    rows, w, b = _on(device, x.grad_rows, *layer_norm_params(x.shape.dim))
    _, mean, rstd = F.layer_norm_forward(rows, w, b, LN_EPS)
    return lambda: F.layer_norm_backward(rows, rows, mean, rstd, w, b)


def _train_or_eval(block, ids, grad, train, **kwargs):
    if not train:
        block.eval()
        return no_grad()(lambda: block(ids, **kwargs))  # inference, as under torch.no_grad()

    block.train()

    def step():
        block.zero_grad()
        block(ids, **kwargs)
        block.backward(grad)
    return step


def _bert(train):
    def make(x, device):
        block = bert_block(x.shape).to(device)
        ids, grad = _on(device, x.ids, x.grad)
        return _train_or_eval(block, ids, grad, train)
    return make


def _gpt2(train, positions):
    def make(x, device):
        block = gpt2_block(x.shape, positions).to(device)
        ids, grad = _on(device, x.ids, x.grad)
        return _train_or_eval(block, ids, grad, train)
    return make


def _gpt2_next_token(positions):
    def make(x, device):
        block = gpt2_block(x.shape, positions).to(device).eval()
        (ids,) = _on(device, x.ids[:1, :1])
        return no_grad()(lambda: block(ids, past_length=positions // 2))
    return make


def _rotary(x, device):
    q, k = _on(device, *rope_qk(x.shape))
    rope = nn.RotaryEmbedding(x.shape.dim, device=device).eval()
    return lambda: rope(q, k)


def _t5_bias(x, device):
    (table,) = _on(device, t5_table(x.shape))
    return lambda: F.relative_position_bias(table, x.shape.seq, x.shape.seq)


# ------------------------------------------------------------------ the cases


def _gathered(shape: Shape) -> int:
    return 2 * shape.tokens * shape.dim * 4


def _activations(copies):
    return lambda shape: copies * shape.tokens * shape.dim * 4


def _lookup_sides():
    return {"numbapos": _lookup, "numpy": peers.numpy_take, "torch": peers.torch_embedding,
            "cupy": peers.cupy_take}


def _step_sides(fused=False):
    return {"numbapos": _sparse_step(fused), "torch": peers.torch_dense_step}


def headline(sizes: Sizes) -> list[Case]:
    """The comparison table's cases at ``sizes``."""
    base = Shape(sizes.vocab, sizes.dim, sizes.batch, sizes.seq)
    minilm = base._replace(dim=sizes.minilm_dim)
    small = base._replace(batch=1, seq=sizes.small_tokens)
    step = Shape(sizes.step_vocab, sizes.dim, sizes.batch, sizes.step_seq)
    gpt2 = base._replace(vocab=sizes.gpt2_vocab)
    positions = sizes.gpt2_positions
    cases = [
        Case(f"lookup, {small.tokens} tokens", small, _lookup_sides(), _gathered),
        Case(f"lookup, {base.tokens} tokens", base, _lookup_sides(), _gathered),
        Case(f"lookup, {base.tokens} tokens into out=", base,
             {"numbapos": _lookup_out, "numpy": peers.numpy_copyto,
              "torch": peers.torch_index_select_out, "cupy": peers.cupy_take_out}, _gathered,
             "NumPy: np.copyto of the same bytes"),
        Case("dense backward", base, {"numbapos": _backward(False), "numpy": peers.numpy_add_at,
                                      "torch": peers.torch_dense_backward},
             lambda s: s.tokens * s.dim * 4 + s.vocab * s.dim * 4),
        Case("sparse backward", base, {"numbapos": _backward(True),
                                       "numpy": peers.numpy_sparse_backward,
                                       "torch": peers.torch_sparse_backward},
             note="PyTorch: + coalesce(), as its optimisers do"),
        Case(f"training step V={step.vocab}, {step.batch}x{step.seq}", step, _step_sides(),
             note="fwd + bwd + SGD(momentum=0.9); numbapos sparse, PyTorch dense"),
        Case(f"training step V={step.vocab}, {step.batch}x{step.seq}, fused", step,
             _step_sides(fused=True),
             note="the same with SGD.fuse_with_backward (row sums inside the update)"),
        Case("LayerNorm forward", base, {"numbapos": _layer_norm, "numpy": peers.numpy_layer_norm,
                                         "torch": peers.torch_layer_norm}, _activations(2)),
        Case("LayerNorm backward", base, {"numbapos": _layer_norm_backward,
                                          "torch": peers.torch_layer_norm_backward},
             _activations(4)),
    ]
    for train in (False, True):
        what = "fwd + bwd" if train else "forward"
        for shape, label in ((minilm, "MiniLM"), (base, "base")):
            cases.append(Case(f"BertEmbeddings {what}, {label} D={shape.dim}", shape,
                              {"numbapos": _bert(train), "numpy": peers.numpy_bert(train),
                               "torch": peers.torch_bert(train)},
                              None if train else _gathered))
        for shape in (gpt2._replace(dim=sizes.minilm_dim), gpt2):
            cases.append(Case(f"GPT2Embeddings {what}, D={shape.dim}", shape,
                              {"numbapos": _gpt2(train, positions),
                               "numpy": peers.numpy_gpt2(train, positions),
                               "torch": peers.torch_gpt2(train, positions)},
                              None if train else _gathered))
    cases.append(Case("GPT2Embeddings forward, 1 token", gpt2,
                      {"numbapos": _gpt2_next_token(positions),
                       "numpy": peers.numpy_gpt2_next_token(positions),
                       "torch": peers.torch_gpt2_next_token(positions)}))
    rope = Shape(sizes.rope_heads, sizes.rope_head_dim, sizes.rope_batch, sizes.rope_seq)
    cases.append(Case(f"RotaryEmbedding q, k {rope.batch}x{rope.vocab}x{rope.seq}x{rope.dim}",
                      rope, {"numbapos": _rotary, "numpy": peers.numpy_copy_qk,
                             "torch": peers.torch_rotary},
                      lambda s: 4 * s.batch * s.vocab * s.seq * s.dim * 4,
                      "NumPy: q.copy(), k.copy() (the memory limit); PyTorch: transformers' "
                      "Llama rotary"))
    t5 = Shape(sizes.t5_heads, 32, 1, sizes.t5_seq)
    cases.append(Case(f"T5 relative bias {t5.vocab} heads, {t5.seq}x{t5.seq}", t5,
                      {"numbapos": _t5_bias, "numpy": peers.numpy_t5_bias,
                       "torch": peers.torch_t5_bias},
                      lambda s: s.vocab * s.seq * s.seq * 4,
                      "NumPy and PyTorch: transformers' compute_bias (buckets, then a lookup)"))
    bag = Shape(sizes.bag_vocab, sizes.bag_dim, sizes.bags, sizes.bag_size)
    bags = f"{bag.batch}x{bag.seq}"
    table = f"V={bag.vocab}, D={bag.dim}, {bag.batch} bags of {bag.seq} ids"
    for mode in ("sum", "mean", "max"):
        cases.append(Case(f"EmbeddingBag {mode}, {bags}", bag,
                          {"numbapos": _bag(mode), "numpy": peers.numpy_bag(mode),
                           "torch": peers.torch_bag(mode)},
                          lambda s: s.tokens * s.dim * 4 + s.batch * s.dim * 4, table))
    cases.append(Case(f"EmbeddingBag sum + bwd + sparse SGD, {bags}", bag,
                      {"numbapos": _bag_sparse_step(False),
                       "torch": peers.torch_bag_sparse_step},
                      note=f"{table}; PyTorch: sparse=True and optim.SGD, its fastest "
                           "equivalent"))
    cases.append(Case(f"EmbeddingBag sum + bwd + SGD fused, {bags}", bag,
                      {"numbapos": _bag_sparse_step(True),
                       "torch": peers.torch_bag_sparse_step},
                      note="the same with SGD.fuse_with_backward"))
    tables = sizes.collection_tables
    cases.append(Case(f"EmbeddingBagCollection, {tables} tables, {bags}", bag,
                      {"numbapos": _collection(tables),
                       "torch": peers.torch_separate_bags(tables)},
                      note=f"{tables} tables of {bag.vocab // tables} x {bag.dim}, "
                           f"{bag.batch} bags of {bag.seq} ids each, the module under "
                           f"no_grad; PyTorch: {tables} separate F.embedding_bag calls "
                           "(sum), concatenated"))
    cases.append(Case(f"EBC + bwd + Adagrad fused, {tables} tables, {bags}", bag,
                      {"numbapos": _collection_step(tables),
                       "torch": peers.torch_collection_step(tables)},
                      note="the same tables trained: forward, backward, Adagrad fused into "
                           f"the backward; PyTorch: {tables} sparse EmbeddingBags and "
                           "optim.Adagrad"))
    return cases


class Scaling(NamedTuple):
    """A case of the scaling curves: ``op`` at ``axis`` (``"D"`` or ``"batch"``) = ``value``."""

    op: str
    axis: str
    value: int
    case: Case


def scaling(sizes: Sizes) -> list[Scaling]:
    """How cost grows with D (at the base batch) and with the batch (at the base D)."""
    base = Shape(sizes.vocab, sizes.dim, sizes.batch, sizes.seq)
    points = [("D", d, base._replace(dim=d)) for d in sizes.dims]
    points += [("batch", b, base._replace(batch=b)) for b in sizes.batches]
    found = []
    for axis, value, shape in points:
        label = f"{axis}={value}" if axis == "D" else f"{value}x{shape.seq} tokens"
        found.append(Scaling("lookup", axis, value,
                             Case(f"lookup, {label}", shape, _lookup_sides(), _gathered)))
        found.append(Scaling("training step", axis, value,
                             Case(f"training step, {label}", shape, _step_sides())))
    return found
