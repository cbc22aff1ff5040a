"""Equivalence-test corpus: small, realistic model pieces written in plain JAX.

Every program takes positional array arguments of fixed small shapes (weights
are arguments, except ``const_projection`` which closes over a numpy
constant). ``make_args`` builds deterministic random inputs for a program.
Shapes are chosen tiny so each program runs in well under 100 ms on CPU.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np


@dataclass(frozen=True)
class CorpusProgram:
    name: str
    fn: Callable
    arg_specs: tuple  # one (shape tuple, dtype string) per positional argument


def make_args(program: CorpusProgram, seed: int) -> tuple:
    """Random numpy arguments for ``program.arg_specs``.

    Floats: standard normal * 0.5, cast to the dtype. Ints: uniform in [-8, 8].
    """
    rng = np.random.default_rng(seed)
    args = []
    for shape, dtype in program.arg_specs:
        dt = jnp.dtype(dtype)  # numpy dtype; handles bfloat16 via ml_dtypes
        if jnp.issubdtype(dt, jnp.integer):
            args.append(rng.integers(-8, 9, size=shape).astype(dt))
        else:
            args.append((0.5 * rng.standard_normal(shape)).astype(dt))
    return tuple(args)


def _layer_norm(x, gamma, beta, eps=1e-5):
    mean = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.var(x, axis=-1, keepdims=True)
    return (x - mean) / jnp.sqrt(var + eps) * gamma + beta


# --------------------------------------------------------------------------
# Programs
# --------------------------------------------------------------------------


def mlp_softmax(x, W1, b1, W2, b2):
    """Two-layer ReLU MLP classifier with softmax output. x (8,16) -> (8,10)."""
    h = jax.nn.relu(x @ W1 + b1)
    return jax.nn.softmax(h @ W2 + b2, axis=-1)


def mha_einsum(x, Wq, Wk, Wv, Wo):
    """Two-head self-attention via einsum. x (2,8,16), head dim 8."""
    b, s, d = x.shape
    h = 2
    q = jnp.einsum("bsd,de->bse", x, Wq).reshape(b, s, h, d // h)
    k = jnp.einsum("bsd,de->bse", x, Wk).reshape(b, s, h, d // h)
    v = jnp.einsum("bsd,de->bse", x, Wv).reshape(b, s, h, d // h)
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(d // h)
    probs = jax.nn.softmax(scores, axis=-1)
    ctx = jnp.einsum("bhqk,bkhd->bqhd", probs, v).reshape(b, s, d)
    return jnp.einsum("bsd,de->bse", ctx, Wo)


def layernorm(x, gamma, beta):
    """LayerNorm over the last axis. x (4,8,32)."""
    return _layer_norm(x, gamma, beta)


def gelu_mlp(x, W1, b1, W2, b2):
    """Transformer FFN: GELU(x W1 + b1) W2 + b2. x (8,32), hidden 64."""
    return jax.nn.gelu(x @ W1 + b1) @ W2 + b2


def conv_bias_relu(x, w, b):
    """3x3 SAME conv (NHWC / HWIO) + bias + ReLU. x (2,8,8,3) -> (2,8,8,8)."""
    y = jax.lax.conv_general_dilated(
        x, w, window_strides=(1, 1), padding="SAME",
        dimension_numbers=("NHWC", "HWIO", "NHWC"),
    )
    return jax.nn.relu(y + b)


def matmul_chain_right_cheaper(A, B, C, v):
    """(A @ B @ C) @ v written left-to-right; right association is far cheaper.
    A,B,C (64,64), v (64,2)."""
    return A @ B @ C @ v


def matmul_chain_left_cheaper(u, A, B):
    """u @ (A @ B) written right-associated; (u @ A) @ B is cheaper.
    u (2,48), A (48,64), B (64,32)."""
    return u @ (A @ B)


def matmul_chain_mixed(A, B, C, D):
    """Four-matrix chain with varied shapes: (16,64)(64,4)(4,64)(64,8)."""
    return A @ B @ C @ D


def einsum_batched_matmul(x, y):
    """Batched matmul 'bij,bjk->bik'. (3,5,7) x (3,7,4)."""
    return jnp.einsum("bij,bjk->bik", x, y)


def einsum_tensor_matrix(x, W):
    """Tensor-times-matrix 'ijk,kl->ijl'. (4,6,8) x (8,5)."""
    return jnp.einsum("ijk,kl->ijl", x, W)


def einsum_multi_contract(x, W):
    """Two contracted axes 'abcd,cde->abe'. (2,3,4,5) x (4,5,6)."""
    return jnp.einsum("abcd,cde->abe", x, W)


def bf16_matmul_f32_acc(x, W, b):
    """bf16 inputs, f32 accumulation via preferred_element_type, f32 bias + tanh.
    x (8,32) bf16, W (32,16) bf16, b (16,) f32."""
    y = jax.lax.dot_general(
        x, W, dimension_numbers=(((1,), (0,)), ((), ())),
        preferred_element_type=jnp.float32,
    )
    return jnp.tanh(y + b)


def fp16_upcast_softmax(x, W):
    """float16 program that upcasts to f32 for a matmul + softmax and casts back.
    x (8,16) f16, W (16,16) f16 -> (8,16) f16."""
    logits = x.astype(jnp.float32) @ W.astype(jnp.float32)
    return jax.nn.softmax(logits, axis=-1).astype(jnp.float16)


def sort_cumsum_scores(x, W):
    """Sort projected scores, take the cumulative sum (as in top-p sampling),
    then normalise. x (4,16), W (16,32)."""
    scores = jax.nn.softmax(x @ W, axis=-1)
    sorted_scores = jnp.sort(scores, axis=-1)[:, ::-1]
    cdf = jnp.cumsum(sorted_scores, axis=-1)
    return cdf * jnp.sum(x, axis=-1, keepdims=True)


def qkv_shared_input(x, Wq, Wk, Wv):
    """Three projections sharing the input x (16,32); weights (32,32)."""
    return x @ Wq, x @ Wk, x @ Wv


def transpose_identity_noise(x, W):
    """Contains cancelling transposes and an x * 1.0 + 0.0 identity.
    x (8,16), W (16,12)."""
    y = x.T.T * 1.0 + 0.0
    z = jnp.transpose(jnp.transpose(y @ W, (1, 0)), (1, 0))
    return (z.T @ y).T


def residual_tanh_explog(x, W1, W2):
    """Residual block with tanh and an exp/log pair (log1p-style softplus).
    x (8,32), W1 (32,32), W2 (32,32)."""
    h = jnp.tanh(x @ W1)
    h = jnp.log(1.0 + jnp.exp(h @ W2))
    return x + jnp.exp(jnp.log(jnp.abs(h) + 1e-3)) * jnp.sign(h)


def embedding_lookup(ids, table, pos):
    """Token embedding gather + positional embedding + LayerNorm-free scaling.
    ids (2,8) int32 (wrapped into the vocab), table (16,24), pos (8,24)."""
    idx = jnp.remainder(ids, table.shape[0])
    return table[idx] * math.sqrt(table.shape[1]) + pos


# A frozen projection matrix closed over as a constant (not an argument).
_CONST_W = np.random.default_rng(1234).standard_normal((24, 12)).astype(np.float32) * 0.2


def const_projection(x, b):
    """Matmul against a closed-over numpy constant, bias, ReLU. x (6,24)."""
    return jax.nn.relu(x @ _CONST_W + b)


# --------------------------------------------------------------------------
# Registry
# --------------------------------------------------------------------------

F32 = "float32"


def _p(name, fn, *specs):
    return CorpusProgram(name, fn, tuple((tuple(s), d) for s, d in specs))


CORPUS: list[CorpusProgram] = [
    _p("mlp_softmax", mlp_softmax,
       ((8, 16), F32), ((16, 32), F32), ((32,), F32), ((32, 10), F32), ((10,), F32)),
    _p("mha_einsum", mha_einsum,
       ((2, 8, 16), F32), ((16, 16), F32), ((16, 16), F32), ((16, 16), F32), ((16, 16), F32)),
    _p("layernorm", layernorm, ((4, 8, 32), F32), ((32,), F32), ((32,), F32)),
    _p("gelu_mlp", gelu_mlp,
       ((8, 32), F32), ((32, 64), F32), ((64,), F32), ((64, 32), F32), ((32,), F32)),
    _p("conv_bias_relu", conv_bias_relu, ((2, 8, 8, 3), F32), ((3, 3, 3, 8), F32), ((8,), F32)),
    _p("matmul_chain_right_cheaper", matmul_chain_right_cheaper,
       ((64, 64), F32), ((64, 64), F32), ((64, 64), F32), ((64, 2), F32)),
    _p("matmul_chain_left_cheaper", matmul_chain_left_cheaper,
       ((2, 48), F32), ((48, 64), F32), ((64, 32), F32)),
    _p("matmul_chain_mixed", matmul_chain_mixed,
       ((16, 64), F32), ((64, 4), F32), ((4, 64), F32), ((64, 8), F32)),
    _p("einsum_batched_matmul", einsum_batched_matmul, ((3, 5, 7), F32), ((3, 7, 4), F32)),
    _p("einsum_tensor_matrix", einsum_tensor_matrix, ((4, 6, 8), F32), ((8, 5), F32)),
    _p("einsum_multi_contract", einsum_multi_contract, ((2, 3, 4, 5), F32), ((4, 5, 6), F32)),
    _p("bf16_matmul_f32_acc", bf16_matmul_f32_acc,
       ((8, 32), "bfloat16"), ((32, 16), "bfloat16"), ((16,), F32)),
    _p("fp16_upcast_softmax", fp16_upcast_softmax, ((8, 16), "float16"), ((16, 16), "float16")),
    _p("sort_cumsum_scores", sort_cumsum_scores, ((4, 16), F32), ((16, 32), F32)),
    _p("qkv_shared_input", qkv_shared_input,
       ((16, 32), F32), ((32, 32), F32), ((32, 32), F32), ((32, 32), F32)),
    _p("transpose_identity_noise", transpose_identity_noise, ((8, 16), F32), ((16, 12), F32)),
    _p("residual_tanh_explog", residual_tanh_explog,
       ((8, 32), F32), ((32, 32), F32), ((32, 32), F32)),
    _p("embedding_lookup", embedding_lookup, ((2, 8), "int32"), ((16, 24), F32), ((8, 24), F32)),
    _p("const_projection", const_projection, ((6, 24), F32), ((12,), F32)),
]
