"""The reference sides of the bench: NumPy, PyTorch (eager) and CuPy doing the same work.

Each factory takes the case's :class:`~numbapos.bench.cases.Inputs` and the
device and returns a zero-argument callable. PyTorch and CuPy are optional:
:func:`available` says whether a side can run on a device, and why not.
"""

from __future__ import annotations

import numpy as np

from .data import (
    LN_EPS,
    bag_grad,
    batches,
    bert_block,
    collection_batches,
    collection_ids,
    gpt2_block,
    host_tables,
    layer_norm_params,
    primed,
    rope_qk,
    t5_table,
)


def _torch():
    import torch

    return torch


def _cupy():
    import cupy

    return cupy


def available(side: str, device: str) -> str | None:
    """None when ``side`` can run on ``device``, else the reason it cannot."""
    if side == "numbapos":
        return None
    if side == "numpy":
        return None if device == "cpu" else "CPU only"
    if side == "cupy" and device == "cpu":
        return "CUDA only"
    try:
        module = _torch() if side == "torch" else _cupy()
    except ImportError:
        return "not installed"
    if device == "cuda":
        try:
            usable = (module.cuda.is_available() if side == "torch"
                      else module.cuda.runtime.getDeviceCount() > 0)
        except Exception:  # CuPy raises its own CUDA errors without a driver
            usable = False
        if not usable:
            return "no CUDA device"
    return None


def version(side: str) -> str:
    """The version of the library behind ``side`` (importable: see :func:`available`)."""
    module = {"numpy": lambda: np, "torch": _torch, "cupy": _cupy}[side]()
    return module.__version__


def sync(side: str, device: str):
    """What waits for ``side``'s queue on ``device`` (None on the CPU)."""
    if device == "cpu":
        return None
    if side == "numbapos":
        from numba import cuda

        return cuda.synchronize
    if side == "torch":
        return _torch().cuda.synchronize
    return lambda: _cupy().cuda.Device().synchronize()


def _tensors(device, *arrays):
    torch = _torch()
    return [torch.from_numpy(np.ascontiguousarray(a)).to(device) for a in arrays]


# ------------------------------------------------------------------ NumPy


def numpy_take(x, device):
    return lambda: np.take(x.weight, x.ids, axis=0)


def numpy_copyto(x, device):
    src = np.take(x.weight, x.ids, axis=0)
    out = np.empty_like(src)
    return lambda: np.copyto(out, src)


def numpy_add_at(x, device):
    def backward():
        out = np.zeros((x.shape.vocab, x.shape.dim), np.float32)
        np.add.at(out, x.ids.reshape(-1), x.grad_rows)
        return out
    return backward


def _sparse_rows(ids, grad2d):
    rows, inverse = np.unique(ids, return_inverse=True)
    values = np.zeros((rows.size, grad2d.shape[1]), grad2d.dtype)
    np.add.at(values, inverse.reshape(-1), grad2d)
    return rows, values


def numpy_sparse_backward(x, device):
    return lambda: _sparse_rows(x.ids, x.grad_rows)


def _np_layer_norm(v, gamma, beta):
    centred = v - v.mean(-1, keepdims=True)
    rstd = 1.0 / np.sqrt((centred * centred).mean(-1, keepdims=True) + np.float32(LN_EPS))
    xhat = centred * rstd
    return xhat * gamma + beta, xhat, rstd


def numpy_layer_norm(x, device):
    rows = x.grad_rows
    w, b = layer_norm_params(x.shape.dim)
    return lambda: _np_layer_norm(rows, w, b)[0]


def _np_layer_norm_backward(g_y, xhat, rstd, gamma):
    g = g_y * gamma
    return rstd * (g - g.mean(-1, keepdims=True) - xhat * (g * xhat).mean(-1, keepdims=True))


def numpy_bert(train):
    def make(x, device):
        word, pos, types, gamma, beta = host_tables(bert_block(x.shape))
        ids, seq = x.ids, x.shape.seq
        type_ids = np.zeros_like(ids)

        def step():
            total = word[ids] + types[type_ids] + pos[np.arange(seq)]
            y, xhat, rstd = _np_layer_norm(total, gamma, beta)
            if train:
                g_sum = _np_layer_norm_backward(x.grad, xhat, rstd, gamma)
                grads = [(x.grad * xhat).sum(axis=(0, 1)), x.grad.sum(axis=(0, 1))]
                for flat, table in ((ids, word), (type_ids, types)):
                    table_grad = np.zeros_like(table)
                    np.add.at(table_grad, flat.reshape(-1), g_sum.reshape(-1, x.shape.dim))
                    grads.append(table_grad)
                grads.append(g_sum.sum(axis=0))  # positions: the same rows in every sequence
            return y
        return step
    return make


def numpy_gpt2(train, positions):
    def make(x, device):
        wte, wpe = host_tables(gpt2_block(x.shape, positions))
        ids, seq = x.ids, x.shape.seq

        def step():
            y = wte[ids] + wpe[np.arange(seq)]
            if train:
                grad_wte = np.zeros_like(wte)
                np.add.at(grad_wte, ids.reshape(-1), x.grad_rows)
                x.grad.sum(axis=0)
            return y
        return step
    return make


def numpy_gpt2_next_token(positions):
    def make(x, device):
        wte, wpe = host_tables(gpt2_block(x.shape, positions))
        ids, where = x.ids[:1, :1], np.array([[positions // 2]])
        return lambda: wte[ids] + wpe[where]
    return make


# ------------------------------------------------------------------ PyTorch


def torch_embedding(x, device):
    torch = _torch()
    weight, ids = _tensors(device, x.weight, x.ids)
    return lambda: torch.nn.functional.embedding(ids, weight)


def torch_index_select_out(x, device):
    torch = _torch()
    weight, ids = _tensors(device, x.weight, x.ids.reshape(-1))
    out = torch.empty((ids.numel(), x.shape.dim), device=device)
    return lambda: torch.index_select(weight, 0, ids, out=out)


def torch_dense_backward(x, device):
    torch = _torch()
    grad, ids = _tensors(device, x.grad, x.ids)
    return lambda: torch.ops.aten.embedding_dense_backward(grad, ids, x.shape.vocab, -1, False)


def torch_sparse_backward(x, device):
    torch = _torch()
    grad, ids = _tensors(device, x.grad, x.ids)
    vocab = x.shape.vocab
    return lambda: torch.ops.aten.embedding_backward(grad, ids, vocab, -1, False, True).coalesce()


def torch_dense_step(x, device):
    """PyTorch's usual training step: dense gradient, SGD with momentum 0.9."""
    torch = _torch()
    emb = torch.nn.Embedding.from_pretrained(torch.from_numpy(x.weight.copy()), freeze=False)
    emb = emb.to(device)
    opt = torch.optim.SGD(emb.parameters(), lr=1e-3, momentum=0.9)
    id_batches = _tensors(device, *batches(x))
    (grad,) = _tensors(device, x.grad)
    state = {"i": 0}

    def step():
        state["i"] += 1
        opt.zero_grad()
        emb(id_batches[state["i"] % len(id_batches)]).backward(grad)
        opt.step()
    return primed(step, x)


def torch_layer_norm(x, device):
    torch = _torch()
    rows, w, b = _tensors(device, x.grad_rows, *layer_norm_params(x.shape.dim))
    return lambda: torch.nn.functional.layer_norm(rows, (x.shape.dim,), w, b, LN_EPS)


def torch_layer_norm_backward(x, device):
    torch = _torch()
    rows, w, b = (t.requires_grad_() for t in _tensors(device, x.grad_rows,
                                                       *layer_norm_params(x.shape.dim)))
    out = torch.nn.functional.layer_norm(rows, (x.shape.dim,), w, b, LN_EPS)
    grad = rows.detach()
    return lambda: torch.autograd.grad(out, (rows, w, b), grad, retain_graph=True)


def _torch_run(torch, forward, params, grad, train):
    """The callable of an eager forward (under no_grad) or forward + backward."""
    if not train:
        def run():
            with torch.no_grad():
                return forward()
        return run

    def step():
        for param in params:
            param.grad = None
        forward().backward(grad)
    return step


def torch_bert(train):
    """Hugging Face's BertEmbeddings in eager PyTorch: three lookups, sum, LayerNorm."""
    def make(x, device):
        torch = _torch()
        word, pos, types, gamma, beta = (
            torch.nn.Parameter(t) for t in _tensors(device, *host_tables(bert_block(x.shape))))
        ids, grad = _tensors(device, x.ids, x.grad)
        type_ids = torch.zeros_like(ids)
        positions = torch.arange(x.shape.seq, device=device)[None]
        F = torch.nn.functional

        def forward():
            total = F.embedding(ids, word) + F.embedding(type_ids, types) \
                + F.embedding(positions, pos)
            return F.layer_norm(total, (x.shape.dim,), gamma, beta, LN_EPS)
        return _torch_run(torch, forward, (word, pos, types, gamma, beta), grad, train)
    return make


def torch_gpt2(train, positions):
    """GPT-2's ``wte(ids) + wpe(positions)`` in eager PyTorch."""
    def make(x, device):
        torch = _torch()
        wte, wpe = (torch.nn.Parameter(t) for t in
                    _tensors(device, *host_tables(gpt2_block(x.shape, positions))))
        ids, grad = _tensors(device, x.ids, x.grad)
        where = torch.arange(x.shape.seq, device=device)[None]
        F = torch.nn.functional
        return _torch_run(torch, lambda: F.embedding(ids, wte) + F.embedding(where, wpe),
                          (wte, wpe), grad, train)
    return make


def torch_gpt2_next_token(positions):
    def make(x, device):
        torch = _torch()
        wte, wpe = _tensors(device, *host_tables(gpt2_block(x.shape, positions)))
        ids = _tensors(device, x.ids[:1, :1])[0]
        where = torch.tensor([[positions // 2]], device=device)
        F = torch.nn.functional
        return lambda: F.embedding(ids, wte) + F.embedding(where, wpe)
    return make


# ------------------------------------------------------------------ CuPy


def cupy_take(x, device):
    cp = _cupy()
    weight, ids = cp.asarray(x.weight), cp.asarray(x.ids)
    return lambda: cp.take(weight, ids, axis=0)


def cupy_take_out(x, device):
    cp = _cupy()
    weight, ids = cp.asarray(x.weight), cp.asarray(x.ids)
    out = cp.empty(x.ids.shape + (x.shape.dim,), cp.float32)
    return lambda: cp.take(weight, ids, axis=0, out=out)


# ------------------------------------------------------------------ rotary


def numpy_copy_qk(x, device):
    """q.copy() and k.copy(): the bytes a rotation reads and writes, moved once."""
    q, k = rope_qk(x.shape)
    return lambda: (q.copy(), k.copy())


def _t5_buckets(xp, relative, num_buckets=32, max_distance=128):
    """transformers' T5Attention._relative_position_bucket (bidirectional) in NumPy or PyTorch:
    ``xp`` is the module of the arrays."""
    num_buckets //= 2
    buckets = (relative > 0).astype(xp.int64) * num_buckets if xp is np else \
        (relative > 0).to(relative.dtype) * num_buckets
    relative = abs(relative)
    max_exact = num_buckets // 2
    is_small = relative < max_exact
    scaled = relative / max_exact if xp is np else relative.float() / max_exact
    if xp is np:
        scaled = scaled.astype(np.float32)
    large = max_exact + (np.log(scaled) if xp is np else xp.log(scaled)) / np.float32(
        np.log(max_distance / max_exact)) * (num_buckets - max_exact)
    large = large.astype(np.int64) if xp is np else large.to(relative.dtype)
    large = xp.minimum(large, xp.full_like(large, num_buckets - 1))
    return buckets + xp.where(is_small, relative, large)


def numpy_t5_bias(x, device):
    """transformers' compute_bias in NumPy: buckets of key - query, a table lookup, (1, H, L, L)."""
    table = t5_table(x.shape)
    seq = x.shape.seq

    def run():
        relative = np.arange(seq)[None, :] - np.arange(seq)[:, None]
        with np.errstate(divide="ignore", invalid="ignore"):  # the small ones: where()
            buckets = _t5_buckets(np, relative)
        return table[buckets].transpose(2, 0, 1)[None]
    return run


def torch_t5_bias(x, device):
    """transformers' T5Attention.compute_bias (PyTorch's formula without transformers)."""
    torch = _torch()
    (table,) = _tensors(device, t5_table(x.shape))
    heads, seq = x.shape.vocab, x.shape.seq
    embedding = torch.nn.Embedding(table.shape[0], heads).to(device)
    with torch.no_grad():
        embedding.weight.copy_(table)
    try:
        from transformers.models.t5.modeling_t5 import T5Attention
    except ImportError:
        def buckets_of(relative):
            return _t5_buckets(torch, relative)
    else:
        def buckets_of(relative):
            return T5Attention._relative_position_bucket(relative, True, 32, 128)

    @torch.no_grad()
    def run():
        context = torch.arange(seq, dtype=torch.long, device=device)[:, None]
        memory = torch.arange(seq, dtype=torch.long, device=device)[None, :]
        values = embedding(buckets_of(memory - context))
        return values.permute([2, 0, 1]).unsqueeze(0)
    return run


def torch_rotary(x, device):
    """transformers' LlamaRotaryEmbedding + apply_rotary_pos_emb (PyTorch's formula without
    transformers)."""
    torch = _torch()
    q, k = _tensors(device, *rope_qk(x.shape))
    batch, heads, seq, dim = q.shape
    ids = torch.arange(seq, device=device)[None].expand(batch, -1)
    try:
        import transformers
        from transformers.models.llama import modeling_llama
    except ImportError:
        inv_freq = 1.0 / 10000.0 ** (torch.arange(0, dim, 2, device=device).float() / dim)

        def rope(t, positions):
            freqs = positions[..., None].float() * inv_freq
            emb = torch.cat((freqs, freqs), dim=-1)
            return emb.cos(), emb.sin()

        def apply(q, k, cos, sin):
            def rotate_half(t):
                return torch.cat((-t[..., dim // 2:], t[..., :dim // 2]), dim=-1)
            cos, sin = cos[:, None], sin[:, None]
            return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
    else:
        config = transformers.LlamaConfig(hidden_size=heads * dim, num_attention_heads=heads,
                                          max_position_embeddings=max(seq, 2048))
        rope = modeling_llama.LlamaRotaryEmbedding(config).to(device)
        apply = modeling_llama.apply_rotary_pos_emb

    def call():
        with torch.no_grad():
            cos, sin = rope(q, ids)
            return apply(q, k, cos, sin)
    return call


# ------------------------------------------------------------------ bags


def numpy_bag(mode):
    """NumPy's pooled lookup: the rows gathered, then reduced per bag (one bag per row)."""
    reduce = {"sum": np.sum, "mean": np.mean, "max": np.max}[mode]
    return lambda x, device: lambda: reduce(np.take(x.weight, x.ids, axis=0), axis=1)


def torch_bag(mode):
    def make(x, device):
        torch = _torch()
        weight, ids = _tensors(device, x.weight, x.ids)
        return lambda: torch.nn.functional.embedding_bag(ids, weight, mode=mode)
    return make


def torch_bag_sparse_step(x, device):
    """PyTorch's fastest bag training step: ``sparse=True`` and ``optim.SGD`` (no momentum:
    PyTorch's SGD takes sparse gradients only without it)."""
    torch = _torch()
    bag = torch.nn.EmbeddingBag.from_pretrained(torch.from_numpy(x.weight.copy()), freeze=False,
                                                mode="sum", sparse=True).to(device)
    opt = torch.optim.SGD(bag.parameters(), lr=1e-3)
    id_batches = _tensors(device, *batches(x))
    (grad,) = _tensors(device, bag_grad(x))
    state = {"i": 0}

    def step():
        state["i"] += 1
        opt.zero_grad()
        bag(id_batches[state["i"] % len(id_batches)]).backward(grad)
        opt.step()
    return primed(step, x)


def torch_collection_step(tables):
    """PyTorch's training step of a collection without table batching: ``tables`` sparse
    ``EmbeddingBag`` s (sum), their outputs concatenated, ``optim.Adagrad`` (which takes
    sparse gradients)."""
    def make(x, device):
        torch = _torch()
        # Off, as by default, but said explicitly: Adagrad's sparse update warns otherwise.
        torch.sparse.check_sparse_tensor_invariants.disable()
        rows = x.shape.vocab // tables
        bags = [torch.nn.EmbeddingBag.from_pretrained(
                    torch.from_numpy(x.weight[t * rows:(t + 1) * rows].copy()), freeze=False,
                    mode="sum", sparse=True).to(device) for t in range(tables)]
        opt = torch.optim.Adagrad([bag.weight for bag in bags], lr=0.01)
        per = x.shape.batch * x.shape.seq
        id_batches = [_tensors(device, *(values[t * per:(t + 1) * per].reshape(x.shape.batch, -1)
                                         for t in range(tables)))
                      for values, _ in collection_batches(x, tables)]
        (grad,) = _tensors(device, np.tile(bag_grad(x), (1, tables)))
        state = {"i": 0}

        def step():
            state["i"] += 1
            opt.zero_grad()
            ids = id_batches[state["i"] % len(id_batches)]
            torch.cat([bag(i) for bag, i in zip(bags, ids, strict=True)], 1).backward(grad)
            opt.step()
        return primed(step, x)
    return make


def torch_separate_bags(tables):
    """``tables`` separate ``F.embedding_bag`` sum calls, one per feature (what a model
    without table batching does), their results concatenated."""
    def make(x, device):
        torch = _torch()
        keys, values, lengths = collection_ids(x, tables)
        rows = x.shape.vocab // tables
        weights = _tensors(device, *(x.weight[t * rows:(t + 1) * rows] for t in range(tables)))
        per = x.shape.batch * x.shape.seq
        ids = _tensors(device, *(values[t * per:(t + 1) * per].reshape(x.shape.batch, -1)
                                 for t in range(tables)))
        bag = torch.nn.functional.embedding_bag
        return lambda: torch.cat([bag(i, w, mode="sum") for i, w in zip(ids, weights,
                                                                          strict=True)], 1)
    return make

