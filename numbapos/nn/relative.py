"""T5's relative position bias: a learned bias per head and bucket of ``key - query``."""

from __future__ import annotations

import numpy as np

from .. import _checks
from .._docs import MODULE, fill_doc
from ..functional import relative as F
from ..functional.arrays import contiguous
from ..functional.relative import _check_bool, _t5_options
from . import init as initializers
from .blocks import _load_arrays, _owned_weights
from .module import Module
from .parameter import Parameter

_PREFIX = "encoder.block.0.layer.0.SelfAttention.relative_attention_bias."


@fill_doc(MODULE)
class RelativePositionBias(Module):
    """T5's relative attention bias (T5, mT5, UMT5, LongT5, Pix2Struct, UDOP).

    ``forward(Lq, Lk, offset)`` returns the ``(1, H, Lq, Lk)`` bias of
    transformers' ``T5Attention.compute_bias``: ``weight[bucket(j - (i +
    offset)), h]`` with the buckets of
    :func:`numbapos.functional.relative_position_bucket`. :meth:`add_` adds it
    into attention scores in place without making it. ``backward(grad)``
    accumulates the table's gradient, summed in a fixed order (the same bits
    for any thread count and on either device, see
    :func:`numbapos.functional.relative_position_bias_grad`).

    Parameters
    ----------
    num_heads : int
        Heads H (> 0).
    num_buckets : int, default 32
        Rows of the table (``config.relative_attention_num_buckets``).
    max_distance : int, default 128
        ``config.relative_attention_max_distance``.
    bidirectional : bool, default True
        True for encoders, False for decoders' self-attention.
    {device}
    dtype : float32 or float64, default float32
    seed : int, default 0
        The table starts as N(0, std^2) from the keyed initialiser
        (:func:`numbapos.nn.init.keyed_normal`), element ``(bucket, head)`` keyed
        by ``(seed, bucket, head)``: the same on either device.
    std : float, default 1.0
        ``torch.nn.Embedding``'s; transformers' T5 draws ``factor * d_model ** -0.5``.

    Attributes
    ----------
    weight : Parameter, shape (num_buckets, num_heads)
        Hugging Face's ``relative_attention_bias.weight``.

    Examples
    --------
    >>> import numpy as np
    >>> from numbapos.nn import RelativePositionBias
    >>> bias = RelativePositionBias(4, num_buckets=8, max_distance=16)
    >>> bias(3, 5).shape
    (1, 4, 3, 5)
    >>> bias.backward(np.ones((1, 4, 3, 5), np.float32))
    >>> float(bias.weight.grad.sum())
    60.0
    """

    def __init__(self, num_heads, num_buckets=32, max_distance=128, bidirectional=True, *,
                 device="cpu", dtype=np.float32, seed=0, std=1.0, _weight=None):
        super().__init__()
        self.num_heads = _checks.check_int(num_heads, "num_heads", minimum=1)
        self.bidirectional = _check_bool(bidirectional, "bidirectional")
        _, self.num_buckets, self.max_distance, _ = _t5_options(
            self.bidirectional, num_buckets, max_distance)
        if _weight is None:
            dtype = _checks.check_float_dtype(dtype)
            seed = _checks.check_uint64(seed, "seed")
            std = _checks.check_positive(std, "std")
            init = initializers.keyed_normal(seed, std=std)
            _weight = initializers.make_array(init, (self.num_buckets, self.num_heads), dtype,
                                              None)
        self.weight = Parameter(_weight)
        self._place(device)

    def _options(self, offset=0):
        return dict(offset=offset, bidirectional=self.bidirectional,
                    max_distance=self.max_distance)

    def forward(self, query_length, key_length=None, offset=0):
        """Return the bias, shape ``(1, H, query_length, key_length)``.

        Parameters
        ----------
        query_length : int
            Lq (>= 0).
        key_length : int, optional
            Lk (>= 0); default ``query_length``.
        offset : int, default 0
            The first query's position: transformers' ``past_seen_tokens``
            (``cache_position[0]``) when decoding with a cache.

        Raises
        ------
        TypeError, ValueError
            Non-integer or negative lengths or offset.
        """
        key_length = query_length if key_length is None else key_length
        bias = F.relative_position_bias(self.weight.data, query_length, key_length,
                                        num_buckets=self.num_buckets, **self._options(offset))
        if self._recording():
            self._save_for_backward(("bias", tuple(bias.shape), int(offset)))
        return bias

    def add_(self, scores, offset=0):
        """Add the bias into attention scores ``(B, H, Lq, Lk)`` in place; return ``scores``.

        Its backward (:meth:`backward` with the scores' gradient) returns that
        gradient and adds its sum over ``B`` to the table's gradient.

        Raises
        ------
        TypeError, ValueError
            As for :func:`numbapos.functional.add_relative_position_bias_`.
        """
        scores = F.add_relative_position_bias_(scores, self.weight.data,
                                               num_buckets=self.num_buckets,
                                               **self._options(offset))
        if self._recording():
            self._save_for_backward(("add", tuple(scores.shape), int(offset)))
        return scores

    @fill_doc(MODULE)
    def backward(self, grad_output):
        """Accumulate the table's gradient from the matching :meth:`forward` or :meth:`add_`.

        Returns None after a forward (it has no array input) and
        ``grad_output`` after :meth:`add_` (the gradient of the scores).

        Raises
        ------
        {no_forward}
        TypeError, ValueError
            ``grad_output`` not a float array of the matching call's shape (the
            record is kept).
        """
        kind, shape, offset = self._saved_context()
        grad_output = _checks.check_float_array(grad_output, "grad_output", ndim=4)
        call = "forward" if kind == "bias" else "add_"
        _checks.check_same_shape(grad_output, shape, "grad_output",
                                 f"the shape of the matching {call}'s output")
        grad = None
        if self.weight.requires_grad:
            grad = F.relative_position_bias_grad(grad_output, self.num_buckets,
                                                 **self._options(offset))
            if grad.dtype != self.weight.dtype:
                grad = contiguous(grad, self.weight.dtype)
        self._release()
        if grad is not None:
            self.weight.accumulate_grad(grad, fresh=True)
        return grad_output if kind == "add" else None

    @classmethod
    @fill_doc(MODULE)
    def from_hf_state_dict(cls, state_dict, prefix=_PREFIX, *, bidirectional=None,
                           max_distance=128, device="cpu"):
        """Build the bias from a Hugging Face T5 state dict.

        Reads ``{prefix}weight``, ``(num_buckets, num_heads)``; every other entry is
        ignored, so a whole-model checkpoint loads directly::

            state = numbapos.io.load_state("t5-small/model.safetensors")
            enc = RelativePositionBias.from_hf_state_dict(state)
            dec = RelativePositionBias.from_hf_state_dict(
                state, "decoder.block.0.layer.0.SelfAttention.relative_attention_bias.")

        T5 and mT5 keep the table in the first block of each stack; UMT5 has one
        in every block (``encoder.block.{i}.layer.0.SelfAttention.``).

        Parameters
        ----------
        state_dict : mapping of str to array_like
            E.g. from :func:`numbapos.io.load_state`, or a PyTorch ``state_dict()``.
        prefix : str, default the encoder's first block
            ``"...relative_attention_bias."``.
        bidirectional : bool, optional
            Default: False for a prefix that starts with ``"decoder."``, else True.
        max_distance : int, default 128
            ``config.relative_attention_max_distance`` (not in the weights).
        {device}

        Returns
        -------
        RelativePositionBias
            An owning copy of the table (bfloat16 / float16 widened to float32).

        Raises
        ------
        KeyError
            ``{prefix}weight`` missing.
        TypeError, ValueError
            A mapping or value of the wrong type, a table that is not 2-D float.
        """
        arrays, _ = _load_arrays(state_dict, prefix, ("weight",), tables=("weight",))
        weight = _owned_weights(arrays, prefix, {"weight": (None, None)})["weight"]
        if bidirectional is None:
            bidirectional = not prefix.startswith("decoder.")
        return cls(weight.shape[1], weight.shape[0], max_distance, bidirectional,
                   device=device, _weight=weight)

    def extra_repr(self) -> str:
        return (f"{self.num_heads}, num_buckets={self.num_buckets}, "
                f"max_distance={self.max_distance}, bidirectional={self.bidirectional}")

