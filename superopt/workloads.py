"""Example workloads: the programs of the benchmark suite (`bench/` runs them), shipped in the package
so that `superopt optimize superopt.workloads:reassoc_chain` works from an installed wheel.

Each workload is a plain JAX function plus deterministic example arguments.
Builders are lazy: importing this module creates no arrays; call a builder
(or ``WORKLOADS[name]()``) to materialise the inputs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np


@dataclass(frozen=True)
class Workload:
    name: str  # short kebab-case id, e.g. "reassoc-chain"
    description: str  # one line for a table
    fn: Callable  # the JAX function to optimize
    args: tuple  # example arguments (arrays or pytrees of arrays), deterministic


def _normal(key, shape, scale=1.0, dtype=jnp.float32):
    """Normal draws of `shape` from the bits of `key`, by numpy: an eager `jax.random.normal` compiles an XLA
    program for every new shape (a suite of workloads spent about 40 s in those compiles)."""
    rng = np.random.default_rng(np.asarray(key, np.uint32).ravel())
    return jnp.asarray((np.float32(scale) * rng.standard_normal(shape, dtype=np.float32)).astype(dtype))


# --------------------------------------------------------------------------
# 1. Matrix-chain reassociation
# --------------------------------------------------------------------------


def reassoc_chain() -> Workload:
    """(A @ B) @ v with A, B 1024x1024 and v 1024x1.

    Written left-associated as a typical author would; A @ (B @ v) is
    ~1000x fewer FLOPs.
    """
    n = 1024

    def fn(A, B, v):
        return (A @ B) @ v

    ka, kb, kv = jax.random.split(jax.random.PRNGKey(0), 3)
    scale = 1.0 / math.sqrt(n)
    args = (_normal(ka, (n, n), scale), _normal(kb, (n, n), scale), _normal(kv, (n, 1)))
    return Workload("reassoc-chain", "(A@B)@v, A,B 1024x1024, v 1024x1 (f32)", fn, args)


# --------------------------------------------------------------------------
# 2. Q/K/V projection with frozen weights
# --------------------------------------------------------------------------


def qkv_projection() -> Workload:
    """Three projections of one input x (128, 768) by closed-over 768x768 weights.

    Models inference with frozen parameters: Wq, Wk, Wv are constants in the
    traced program, so they can be concatenated at compile time.
    """
    d, seq = 768, 128
    kq, kk, kv, kx = jax.random.split(jax.random.PRNGKey(1), 4)
    scale = 1.0 / math.sqrt(d)
    Wq = _normal(kq, (d, d), scale)
    Wk = _normal(kk, (d, d), scale)
    Wv = _normal(kv, (d, d), scale)

    def fn(x):
        return (x @ Wq, x @ Wk, x @ Wv)

    args = (_normal(kx, (seq, d)),)
    return Workload(
        "qkv-projection", "x(128,768) @ Wq,Wk,Wv (768x768 constants) -> 3 outputs", fn, args
    )


# --------------------------------------------------------------------------
# 3. Batched GEMM chains G1..G12
# --------------------------------------------------------------------------

# name -> (batch, M, N, K, L)
GEMM_CHAIN_SHAPES: dict[str, tuple[int, int, int, int, int]] = {
    "g1": (8, 512, 64, 64, 512),
    "g2": (12, 512, 64, 64, 512),
    "g3": (16, 512, 64, 64, 512),
    "g4": (12, 256, 64, 64, 256),
    "g5": (16, 256, 64, 64, 256),
    "g6": (16, 256, 80, 80, 256),
    "g7": (12, 208, 64, 64, 208),
    "g8": (16, 208, 64, 64, 208),
    "g9": (16, 208, 80, 80, 208),
    "g10": (1, 512, 64, 64, 256),
    "g11": (1, 768, 64, 64, 384),
    "g12": (1, 1024, 64, 64, 512),
}


def gemm_chain(name: str) -> Workload:
    """Batched back-to-back GEMM chain E = (A @ B) @ D.

    GEMM1: A (b,M,K) x B (b,K,L) -> C (b,M,L);
    GEMM2: C (b,M,L) x D (b,L,N) -> E (b,M,N).
    Shapes are the G1..G12 table (attention-like: K = N = head dim,
    L = sequence length). ``name`` is "g1".."g12" (case-insensitive).
    """
    key = name.lower()
    b, M, N, K, L = GEMM_CHAIN_SHAPES[key]

    def fn(A, B, D):
        return (A @ B) @ D

    idx = int(key[1:])
    ka, kb, kd = jax.random.split(jax.random.PRNGKey(100 + idx), 3)
    args = (
        _normal(ka, (b, M, K)),
        _normal(kb, (b, K, L), 1.0 / math.sqrt(K)),
        _normal(kd, (b, L, N), 1.0 / math.sqrt(L)),
    )
    desc = f"GEMM chain {key.upper()}: b={b} M={M} N={N} K={K} L={L} (f32)"
    return Workload(f"gemm-chain-{key}", desc, fn, args)


# --------------------------------------------------------------------------
# Shared transformer pieces
# --------------------------------------------------------------------------


def _layer_norm(x, gamma, beta, eps):
    mean = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + eps) * gamma + beta


def _attention(params, x, num_heads, mask=None):
    """Multi-head self-attention on x (batch, seq, hidden)."""
    bsz, seq, hidden = x.shape
    head_dim = hidden // num_heads

    def split_heads(t):  # (b, s, h*d) -> (b, h, s, d)
        return t.reshape(bsz, seq, num_heads, head_dim).transpose(0, 2, 1, 3)

    q = split_heads(x @ params["Wq"] + params["bq"])
    k = split_heads(x @ params["Wk"] + params["bk"])
    v = split_heads(x @ params["Wv"] + params["bv"])

    scores = jnp.einsum("bhqd,bhkd->bhqk", q, k) / math.sqrt(head_dim)
    if mask is not None:
        scores = scores + mask
    probs = jax.nn.softmax(scores, axis=-1)
    ctx = jnp.einsum("bhqk,bhkd->bhqd", probs, v)
    ctx = ctx.transpose(0, 2, 1, 3).reshape(bsz, seq, hidden)
    return ctx @ params["Wo"] + params["bo"]


def _transformer_params(key, hidden, ffn):
    """Dict of float32 weights: Wq/Wk/Wv/Wo, W1/W2, biases, two LayerNorms."""
    ks = jax.random.split(key, 6)
    sh = 1.0 / math.sqrt(hidden)
    sf = 1.0 / math.sqrt(ffn)
    zeros = lambda n: jnp.zeros((n,), jnp.float32)
    return {
        "Wq": _normal(ks[0], (hidden, hidden), sh), "bq": zeros(hidden),
        "Wk": _normal(ks[1], (hidden, hidden), sh), "bk": zeros(hidden),
        "Wv": _normal(ks[2], (hidden, hidden), sh), "bv": zeros(hidden),
        "Wo": _normal(ks[3], (hidden, hidden), sh), "bo": zeros(hidden),
        "W1": _normal(ks[4], (hidden, ffn), sh), "b1": zeros(ffn),
        "W2": _normal(ks[5], (ffn, hidden), sf), "b2": zeros(hidden),
        "ln1_gamma": jnp.ones((hidden,), jnp.float32), "ln1_beta": zeros(hidden),
        "ln2_gamma": jnp.ones((hidden,), jnp.float32), "ln2_beta": zeros(hidden),
    }


# --------------------------------------------------------------------------
# 4. BERT-base encoder layer
# --------------------------------------------------------------------------


def bert_encoder_layer(seq: int = 128) -> Workload:
    """One BERT-base encoder layer (post-LayerNorm), batch 1.

    hidden 768, 12 heads of 64, FFN 3072 with tanh-GELU, LayerNorm eps 1e-12,
    additive attention mask of shape (1, 1, 1, seq) (all zeros here).
    """
    hidden, heads, ffn, eps = 768, 12, 3072, 1e-12

    def fn(params, x, mask):
        attn = _attention(params, x, heads, mask)
        h = _layer_norm(x + attn, params["ln1_gamma"], params["ln1_beta"], eps)
        ff = jax.nn.gelu(h @ params["W1"] + params["b1"], approximate=True)
        ff = ff @ params["W2"] + params["b2"]
        return _layer_norm(h + ff, params["ln2_gamma"], params["ln2_beta"], eps)

    kp, kx = jax.random.split(jax.random.PRNGKey(2 + seq))
    params = _transformer_params(kp, hidden, ffn)
    x = _normal(kx, (1, seq, hidden))
    mask = jnp.zeros((1, 1, 1, seq), jnp.float32)
    desc = f"BERT-base encoder layer, batch 1, seq {seq} (f32)"
    return Workload(f"bert-encoder-{seq}", desc, fn, (params, x, mask))


# --------------------------------------------------------------------------
# 5. Small pre-LN transformer block (demo)
# --------------------------------------------------------------------------


def transformer_block() -> Workload:
    """Small pre-LayerNorm transformer block: hidden 256, 4 heads, FFN 1024,
    seq 64, batch 1, GELU FFN, LayerNorm eps 1e-5, no mask."""
    hidden, heads, ffn, seq, eps = 256, 4, 1024, 64, 1e-5

    def fn(params, x):
        h = x + _attention(params, _layer_norm(x, params["ln1_gamma"], params["ln1_beta"], eps), heads)
        y = _layer_norm(h, params["ln2_gamma"], params["ln2_beta"], eps)
        y = jax.nn.gelu(y @ params["W1"] + params["b1"]) @ params["W2"] + params["b2"]
        return h + y

    kp, kx = jax.random.split(jax.random.PRNGKey(3))
    params = _transformer_params(kp, hidden, ffn)
    x = _normal(kx, (1, seq, hidden))
    return Workload(
        "transformer-block", "pre-LN transformer block: d=256, 4 heads, FFN 1024, seq 64", fn, (params, x)
    )


# --------------------------------------------------------------------------
# 6. ResNet-50 bottleneck block, inference, batch-norm with fixed statistics
# --------------------------------------------------------------------------


def resnet_bottleneck(batch: int = 1, size: int = 56, channels: int = 256, width: int = 64) -> Workload:
    """conv1x1 (C -> W) BN ReLU, conv3x3 (W -> W) BN ReLU, conv1x1 (W -> C) BN, + x, ReLU; NHWC, f32.
    Weights and BN statistics are closed-over constants (inference), eps 1e-5."""
    keys = jax.random.split(jax.random.PRNGKey(7), 16)
    shapes = [(1, 1, channels, width), (3, 3, width, width), (1, 1, width, channels)]
    weights = [_normal(k, s, 1.0 / math.sqrt(math.prod(s[:3]))) for k, s in zip(keys[:3], shapes)]
    bns = []
    for i, (_, _, _, out) in enumerate(shapes):
        k1, k2, k3, k4 = keys[3 + 4 * i: 7 + 4 * i]
        bns.append((1.0 + 0.1 * _normal(k1, (out,)), 0.1 * _normal(k2, (out,)), 0.1 * _normal(k3, (out,)),
                    1.0 + jnp.abs(_normal(k4, (out,)))))

    def conv_bn(x, w, bn, padding):
        gamma, beta, mean, var = bn
        y = jax.lax.conv_general_dilated(x, w, (1, 1), padding, dimension_numbers=("NHWC", "HWIO", "NHWC"))
        return (y - mean) * (gamma / jnp.sqrt(var + 1e-5)) + beta

    def fn(x):
        h = jax.nn.relu(conv_bn(x, weights[0], bns[0], "VALID"))
        h = jax.nn.relu(conv_bn(h, weights[1], bns[1], "SAME"))
        return jax.nn.relu(conv_bn(h, weights[2], bns[2], "VALID") + x)

    x = _normal(keys[15], (batch, size, size, channels))
    desc = f"ResNet-50 bottleneck, {size}x{size}x{channels}, width {width}, batch {batch}, BN inference (f32)"
    return Workload("resnet-bottleneck", desc, fn, (x,))


# --------------------------------------------------------------------------
# 7. Training step: mixed-precision MLP, dynamic loss scaling, clipping, Adam
# --------------------------------------------------------------------------

ADAM = dict(lr=1e-3, b1=0.9, b2=0.999, eps=1e-8, max_norm=1.0)
SGD = dict(lr=1e-2, momentum=0.9, max_norm=1.0)


def _mlp_loss(params, x, labels):
    """Softmax cross-entropy of a two-layer GELU MLP (f32 master weights)."""
    h = jax.nn.gelu(x @ params["W1"] + params["b1"], approximate=True)
    logits = h @ params["W2"] + params["b2"]
    logp = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.mean(jnp.sum(labels * logp, axis=-1))


def _scaled_grads(params, x, labels, loss_scale, max_norm):
    """The front half of a step under dynamic loss scaling: the loss is multiplied by the loss scale
    before differentiation; the gradients are unscaled (multiplied by 1/scale), checked for Inf/NaN and
    clipped to a global norm. Returns (scaled loss, 1/scale, all finite, clipped gradients)."""
    scaled_loss, grads = jax.value_and_grad(lambda p: _mlp_loss(p, x, labels) * loss_scale)(params)
    inv = 1.0 / loss_scale
    grads = jax.tree_util.tree_map(lambda g: g * inv, grads)                            # unscale
    finite = jnp.all(jnp.stack([jnp.all(jnp.isfinite(g)) for g in jax.tree_util.tree_leaves(grads)]))
    norm = jnp.sqrt(sum(jnp.sum(jnp.square(g)) for g in jax.tree_util.tree_leaves(grads)))
    clip = jnp.minimum(1.0, max_norm / (norm + 1e-6))
    return scaled_loss, inv, finite, jax.tree_util.tree_map(lambda g: g * clip, grads)  # clip


def _keep_if(finite, new, old):
    """`new` where the step's gradients are finite, else `old` (the skipped step changes nothing)."""
    return jax.tree_util.tree_map(lambda a, b: jnp.where(finite, a, b), new, old)


def train_step_fn(params, m, v, x, labels, loss_scale, count):
    """One step of Adam with global-norm clipping under dynamic loss scaling (`_scaled_grads`).

    A step whose gradients are not finite is skipped (parameters and moments unchanged) and halves the
    scale; a finite step keeps it (growth every N good steps is left to the caller's counter).
    Returns (params, m, v, loss_scale, count, loss)."""
    hp = ADAM
    scaled_loss, inv, finite, grads = _scaled_grads(params, x, labels, loss_scale, hp["max_norm"])
    t = count + 1.0
    new_m = jax.tree_util.tree_map(lambda mm, g: hp["b1"] * mm + (1 - hp["b1"]) * g, m, grads)
    new_v = jax.tree_util.tree_map(lambda vv, g: hp["b2"] * vv + (1 - hp["b2"]) * g * g, v, grads)
    c1, c2 = 1 - hp["b1"] ** t, 1 - hp["b2"] ** t
    new_p = jax.tree_util.tree_map(lambda p, mm, vv: p - hp["lr"] * (mm / c1) / (jnp.sqrt(vv / c2) + hp["eps"]),
                                   params, new_m, new_v)
    return (_keep_if(finite, new_p, params), _keep_if(finite, new_m, m), _keep_if(finite, new_v, v),
            jnp.where(finite, loss_scale, loss_scale / 2), jnp.where(finite, t, count), scaled_loss * inv)


def sgd_step_fn(params, mom, x, labels, loss_scale, count):
    """One step of SGD with momentum (mom <- mu * mom + g; p <- p - lr * mom) with global-norm clipping
    under dynamic loss scaling, skipping a step whose gradients are not finite as `train_step_fn` does.
    Returns (params, mom, loss_scale, count, loss)."""
    hp = SGD
    scaled_loss, inv, finite, grads = _scaled_grads(params, x, labels, loss_scale, hp["max_norm"])
    new_mom = jax.tree_util.tree_map(lambda mm, g: hp["momentum"] * mm + g, mom, grads)
    new_p = jax.tree_util.tree_map(lambda p, mm: p - hp["lr"] * mm, params, new_mom)
    return (_keep_if(finite, new_p, params), _keep_if(finite, new_mom, mom),
            jnp.where(finite, loss_scale, loss_scale / 2), jnp.where(finite, count + 1.0, count),
            scaled_loss * inv)


def _mlp_batch(batch: int, features: int, hidden: int, classes: int):
    """(params, zeros like params, x, one-hot labels) of the training-step MLP, deterministic."""
    keys = jax.random.split(jax.random.PRNGKey(7), 4)
    params = {"W1": _normal(keys[0], (features, hidden), 0.05), "b1": jnp.zeros((hidden,)),
              "W2": _normal(keys[1], (hidden, classes), 0.05), "b2": jnp.zeros((classes,))}
    zeros = jax.tree_util.tree_map(jnp.zeros_like, params)
    x = _normal(keys[2], (batch, features))
    labels = jax.nn.one_hot(jax.random.randint(keys[3], (batch,), 0, classes), classes)
    return params, zeros, x, labels


def train_step(batch: int = 256, features: int = 512, hidden: int = 1024, classes: int = 128) -> Workload:
    params, zeros, x, labels = _mlp_batch(batch, features, hidden, classes)
    desc = (f"training step: MLP {features}-{hidden}-{classes}, batch {batch}, dynamic loss scaling, "
            "global-norm clipping, Adam (f32)")
    return Workload("train-step", desc, train_step_fn,
                    (params, zeros, zeros, x, labels, jnp.float32(2.0 ** 15), jnp.float32(0.0)))


def sgd_step(batch: int = 256, features: int = 512, hidden: int = 1024, classes: int = 128) -> Workload:
    params, zeros, x, labels = _mlp_batch(batch, features, hidden, classes)
    desc = (f"training step: MLP {features}-{hidden}-{classes}, batch {batch}, dynamic loss scaling, "
            "global-norm clipping, SGD with momentum (f32)")
    return Workload("train-step-sgd", desc, sgd_step_fn,
                    (params, zeros, x, labels, jnp.float32(2.0 ** 15), jnp.float32(0.0)))


# --------------------------------------------------------------------------
# 8. Decoder block: grouped-query attention, RMSNorm, SwiGLU MLP, LoRA adapters
# --------------------------------------------------------------------------


def _rms_norm(x, gamma, eps=1e-6):
    return x * jax.lax.rsqrt(jnp.mean(jnp.square(x), axis=-1, keepdims=True) + eps) * gamma


def _lora(x, w, a, b, scale):
    """x @ w plus the low-rank update (x @ a) @ b * scale, as LoRA adds it (the base weight frozen)."""
    return x @ w + (x @ a) @ b * scale


def decoder_block(seq: int = 128, hidden: int = 512, q_heads: int = 8, kv_heads: int = 2, ffn: int = 1408,
                  rank: int = 16) -> Workload:
    """A pre-norm decoder block (LLaMA-style, no rotary embedding), batch 1: RMSNorm, causal grouped-query
    attention (`q_heads` query heads share `kv_heads` key/value heads), RMSNorm, gated MLP
    silu(x W_gate) * (x W_up) W_down, with LoRA adapters of rank `rank` on the Q and V projections."""
    head = hidden // q_heads
    group = q_heads // kv_heads
    scale = 2.0  # LoRA alpha / rank

    def fn(p, x):
        bsz = x.shape[0]
        h = _rms_norm(x, p["norm1"])
        q = _lora(h, p["Wq"], p["Aq"], p["Bq"], scale).reshape(bsz, seq, kv_heads, group, head)
        k = (h @ p["Wk"]).reshape(bsz, seq, kv_heads, head)
        v = _lora(h, p["Wv"], p["Av"], p["Bv"], scale).reshape(bsz, seq, kv_heads, head)
        scores = jnp.einsum("bqkgd,bskd->bkgqs", q, k) / math.sqrt(head) + p["mask"]
        ctx = jnp.einsum("bkgqs,bskd->bqkgd", jax.nn.softmax(scores, axis=-1), v).reshape(bsz, seq, hidden)
        x = x + ctx @ p["Wo"]
        h = _rms_norm(x, p["norm2"])
        return x + (jax.nn.silu(h @ p["Wgate"]) * (h @ p["Wup"])) @ p["Wdown"]

    ks = jax.random.split(jax.random.PRNGKey(11), 12)
    sh, sf = 1.0 / math.sqrt(hidden), 1.0 / math.sqrt(ffn)
    kv = kv_heads * head
    causal = jnp.where(jnp.tril(jnp.ones((seq, seq), bool)), 0.0, -1e9).astype(jnp.float32)
    params = {
        "Wq": _normal(ks[0], (hidden, hidden), sh), "Wk": _normal(ks[1], (hidden, kv), sh),
        "Wv": _normal(ks[2], (hidden, kv), sh), "Wo": _normal(ks[3], (hidden, hidden), sh),
        "Aq": _normal(ks[4], (hidden, rank), sh), "Bq": _normal(ks[5], (rank, hidden), 0.01),
        "Av": _normal(ks[6], (hidden, rank), sh), "Bv": _normal(ks[7], (rank, kv), 0.01),
        "Wgate": _normal(ks[8], (hidden, ffn), sh), "Wup": _normal(ks[9], (hidden, ffn), sh),
        "Wdown": _normal(ks[10], (ffn, hidden), sf),
        "norm1": jnp.ones((hidden,), jnp.float32), "norm2": jnp.ones((hidden,), jnp.float32), "mask": causal,
    }
    x = _normal(ks[11], (1, seq, hidden))
    desc = (f"decoder block: GQA {q_heads} query / {kv_heads} kv heads of {head}, RMSNorm, SwiGLU FFN {ffn}, "
            f"LoRA rank {rank} on Q and V, d={hidden}, seq {seq} (f32)")
    return Workload("decoder-gqa-lora", desc, fn, (params, x))


# --------------------------------------------------------------------------
# 9. Convolution chains C1..C8 (thesis Table 3.6)
# --------------------------------------------------------------------------

# name -> (IC, H, W, OC1, OC2, stride1, stride2, k1, k2)
CONV_CHAIN_SHAPES: dict[str, tuple[int, ...]] = {
    "c1": (64, 112, 112, 192, 128, 2, 1, 3, 1),
    "c2": (32, 147, 147, 64, 80, 2, 1, 3, 1),
    "c3": (64, 56, 56, 128, 64, 1, 1, 3, 1),
    "c4": (128, 28, 28, 256, 128, 1, 1, 3, 1),
    "c5": (16, 227, 227, 64, 16, 4, 1, 3, 1),
    "c6": (64, 56, 56, 64, 64, 1, 1, 1, 3),
    "c7": (64, 56, 56, 64, 64, 1, 1, 1, 1),
    "c8": (256, 56, 56, 256, 64, 1, 1, 1, 1),
}


def _conv(x, w, stride):
    return jax.lax.conv_general_dilated(x, w, (stride, stride), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))


def conv_chain(name: str) -> Workload:
    """Two back-to-back convolutions, batch 1, NHWC, SAME padding: x (1,H,W,IC) -> conv k1xk1 stride st1 to
    OC1 channels -> conv k2xk2 stride st2 to OC2 channels. Shapes are the C1..C8 table; ``name`` is
    "c1".."c8" (case-insensitive). Weights are arguments, as the chain's inputs."""
    key = name.lower()
    ic, h, w, oc1, oc2, st1, st2, k1, k2 = CONV_CHAIN_SHAPES[key]

    def fn(x, w1, w2):
        return _conv(_conv(x, w1, st1), w2, st2)

    kx, k1_, k2_ = jax.random.split(jax.random.PRNGKey(200 + int(key[1:])), 3)
    args = (_normal(kx, (1, h, w, ic)), _normal(k1_, (k1, k1, ic, oc1), 1.0 / math.sqrt(k1 * k1 * ic)),
            _normal(k2_, (k2, k2, oc1, oc2), 1.0 / math.sqrt(k2 * k2 * oc1)))
    desc = (f"conv chain {key.upper()}: {h}x{w}x{ic} -> {k1}x{k1}/{st1} -> {oc1} -> {k2}x{k2}/{st2} -> {oc2} "
            "(f32)")
    return Workload(f"conv-chain-{key}", desc, fn, args)


# --------------------------------------------------------------------------
# 10. YOLO v1 convolutions (FlexTensor Table 4.3), a sample
# --------------------------------------------------------------------------

# name -> (C in, K out, H = W, kernel, stride)
YOLO_CONV_SHAPES: dict[str, tuple[int, int, int, int, int]] = {
    "c1": (3, 64, 448, 7, 2), "c2": (64, 192, 112, 3, 1), "c3": (192, 128, 56, 1, 1), "c4": (128, 256, 56, 3, 1),
    "c5": (256, 256, 56, 1, 1), "c6": (256, 512, 56, 3, 1), "c7": (512, 256, 28, 1, 1), "c8": (256, 512, 28, 3, 1),
    "c9": (512, 512, 28, 1, 1), "c10": (512, 1024, 28, 3, 1), "c11": (1024, 512, 14, 1, 1),
    "c12": (512, 1024, 14, 3, 1), "c13": (1024, 1024, 14, 3, 1), "c14": (1024, 1024, 14, 3, 2),
    "c15": (1024, 1024, 7, 3, 1),
}
# The sample benchmarked: the 7x7 stride-2 stem, a 1x1 reduction, a 1x1 at 28x28 and the 3x3 stride-2
# layer; the others take seconds per call on a small CPU.
YOLO_SAMPLE = ("c1", "c3", "c9", "c14")


def yolo_conv(name: str) -> Workload:
    """One YOLO v1 layer, batch 1, NHWC: convolution (SAME padding), bias, leaky ReLU (slope 0.1), with
    the weights and bias as constants (inference). ``name`` is "c1".."c15"."""
    key = name.lower()
    c, k, hw, ksize, stride = YOLO_CONV_SHAPES[key]
    kx, kw, kb = jax.random.split(jax.random.PRNGKey(300 + int(key[1:])), 3)
    weight = _normal(kw, (ksize, ksize, c, k), 1.0 / math.sqrt(ksize * ksize * c))
    bias = 0.1 * _normal(kb, (k,))

    def fn(x):
        return jax.nn.leaky_relu(_conv(x, weight, stride) + bias, negative_slope=0.1)

    desc = f"YOLO v1 {key.upper()}: {hw}x{hw}x{c} -> {ksize}x{ksize}/{stride} -> {k}, bias, leaky ReLU (f32)"
    return Workload(f"yolo-{key}", desc, fn, (_normal(kx, (1, hw, hw, c)),))


# --------------------------------------------------------------------------
# 11. Mixed-precision MLP and an int8 quantized linear layer
# --------------------------------------------------------------------------


def mixed_precision_mlp_fn(x, w1, b1, w2):
    """f16 activations and weights widened to f32 around each matmul, as autocast-style code writes it."""
    h = x.astype(jnp.float32) @ w1.astype(jnp.float32) + b1      # f16 operands widened for an f32 matmul
    h = jax.nn.relu(h).astype(jnp.float16)
    h = h.astype(jnp.float32).astype(jnp.float16)                 # a layer boundary that widens and narrows again
    y = h.astype(jnp.float32) @ w2.astype(jnp.float32)
    return y.astype(jnp.float16)


def mixed_precision_mlp_args(m: int = 64, k: int = 128, n: int = 256, o: int = 64, seed: int = 0) -> tuple:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((m, k)).astype(np.float16), (rng.standard_normal((k, n)) * 0.1).astype(np.float16),
            rng.standard_normal((n,)).astype(np.float32), (rng.standard_normal((n, o)) * 0.1).astype(np.float16))


def mixed_precision_mlp(m: int = 256, k: int = 512, n: int = 2048, o: int = 512) -> Workload:
    desc = f"mixed-precision MLP {k}-{n}-{o}, batch {m}: f16 storage, f32 matmuls, redundant casts"
    return Workload("mixed-precision-mlp", desc, mixed_precision_mlp_fn, mixed_precision_mlp_args(m, k, n, o))


def qlinear_fn(xq, wq, w_scale, bias):
    """Symmetric int8 activations (one scale), int8 weights with a scale per output column, f32 bias, and
    an int8 result with scale 0.1 and zero point 3."""
    x = xq.astype(jnp.float32) * 0.05
    w = wq.astype(jnp.float32) * w_scale
    y = x @ w + bias
    return jnp.clip(jnp.round(y / 0.1) + 3, -128, 127).astype(jnp.int8)


def qlinear_args(m: int, k: int, n: int, seed: int = 0) -> tuple:
    rng = np.random.default_rng(seed)
    return (rng.integers(-128, 128, (m, k)).astype(np.int8), rng.integers(-128, 128, (k, n)).astype(np.int8),
            (rng.random((n,)) * 2e-3).astype(np.float32), rng.standard_normal(n).astype(np.float32))


def qconv_fn(xq, wq, bias):
    """A 3x3 convolution of int8 activations (scale 0.05) and int8 weights (scale 0.02), NHWC x HWIO, SAME
    padding, f32 bias, and an int8 result with scale 0.1 and zero point 3."""
    x = xq.astype(jnp.float32) * 0.05
    w = wq.astype(jnp.float32) * 0.02
    y = jax.lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")) + bias
    return jnp.clip(jnp.round(y / 0.1) + 3, -128, 127).astype(jnp.int8)


def qconv_args(n: int, hw: int, c: int, o: int, seed: int = 0) -> tuple:
    rng = np.random.default_rng(seed)
    return (rng.integers(-128, 128, (n, hw, hw, c)).astype(np.int8),
            rng.integers(-128, 128, (3, 3, c, o)).astype(np.int8), rng.standard_normal(o).astype(np.float32))


def qconv_per_channel_fn(xq, wq, w_scales, bias):
    """qconv_fn with a weight scale per output channel (`w_scales`, one per output feature), as
    per-channel weight quantization writes it."""
    x = xq.astype(jnp.float32) * 0.05
    w = wq.astype(jnp.float32) * w_scales
    y = jax.lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")) + bias
    return jnp.clip(jnp.round(y / 0.1) + 3, -128, 127).astype(jnp.int8)


def qconv_per_channel_args(n: int, hw: int, c: int, o: int, seed: int = 0) -> tuple:
    xq, wq, bias = qconv_args(n, hw, c, o, seed)
    return xq, wq, np.random.default_rng(seed + 1).uniform(0.005, 0.05, o).astype(np.float32), bias


def int8_conv(hw: int = 56, c: int = 64, o: int = 64) -> Workload:
    desc = f"int8 3x3 convolution {hw}x{hw}x{c} -> {o}: dequantize, f32 conv, bias, requantize"
    return Workload("int8-conv", desc, qconv_fn, qconv_args(1, hw, c, o))


def int8_conv_per_channel(hw: int = 56, c: int = 64, o: int = 64) -> Workload:
    desc = (f"int8 3x3 convolution {hw}x{hw}x{c} -> {o}, a weight scale per output channel: dequantize, f32 conv, "
            "bias, requantize")
    return Workload("int8-conv-per-channel", desc, qconv_per_channel_fn, qconv_per_channel_args(1, hw, c, o))


def int8_linear(m: int = 256, k: int = 1024, n: int = 1024) -> Workload:
    desc = f"int8 linear layer {m}x{k} @ {k}x{n}: dequantize, f32 matmul, bias, requantize"
    return Workload("int8-linear", desc, qlinear_fn, qlinear_args(m, k, n))


# --------------------------------------------------------------------------
# 12. NasRNN cell (the recurrent cell found by neural architecture search, Zoph & Le 2017)
# --------------------------------------------------------------------------


def nasrnn(steps: int = 5, hidden: int = 512, batch: int = 1) -> Workload:
    """The NAS recurrent cell unrolled over `steps` time steps, inference (weights are constants shared
    by every step). Each step projects the input and the state eight ways (x W_i + h U_i), combines the
    eight through sigmoid, tanh and ReLU by sums and products in a tree, and returns tanh of the root:
    sixteen small matmuls per step that read only two distinct left operands."""
    keys = jax.random.split(jax.random.PRNGKey(13), 3)
    s = 1.0 / math.sqrt(hidden)
    W = [_normal(k, (hidden, hidden), s) for k in jax.random.split(keys[0], 8)]
    U = [_normal(k, (hidden, hidden), s) for k in jax.random.split(keys[1], 8)]

    def cell(x, h):
        t = [x @ w + h @ u for w, u in zip(W, U)]
        sg, th, relu = jax.nn.sigmoid, jnp.tanh, jax.nn.relu
        a = relu(t[0]) + sg(t[3])
        b = sg(t[1]) + th(t[2])
        c = sg(t[4]) * th(t[5])
        d = sg(t[6]) * relu(t[7])
        e = sg(b) + th(c)
        f = th(a) * th(d)
        return th(th(e) * th(f))

    def fn(xs, h):
        for step in range(steps):
            h = cell(xs[step], h)
        return h

    args = (_normal(keys[2], (steps, batch, hidden)), jnp.zeros((batch, hidden), jnp.float32))
    desc = f"NasRNN cell, hidden {hidden}, batch {batch}, {steps} steps unrolled, constant weights (f32)"
    return Workload("nasrnn", desc, fn, args)


# --------------------------------------------------------------------------
# Registry
# --------------------------------------------------------------------------

WORKLOADS: dict[str, Callable[[], Workload]] = {
    "reassoc-chain": reassoc_chain,
    "qkv-projection": qkv_projection,
    **{f"gemm-chain-{k}": (lambda k=k: gemm_chain(k)) for k in GEMM_CHAIN_SHAPES},
    "bert-encoder-128": lambda: bert_encoder_layer(128),
    "bert-encoder-512": lambda: bert_encoder_layer(512),
    "transformer-block": transformer_block,
    "decoder-gqa-lora": decoder_block,
    "resnet-bottleneck": resnet_bottleneck,
    **{f"conv-chain-{k}": (lambda k=k: conv_chain(k)) for k in CONV_CHAIN_SHAPES},
    **{f"yolo-{k}": (lambda k=k: yolo_conv(k)) for k in YOLO_SAMPLE},
    "mixed-precision-mlp": mixed_precision_mlp,
    "int8-linear": int8_linear,
    "int8-conv": int8_conv,
    "int8-conv-per-channel": int8_conv_per_channel,
    "nasrnn": nasrnn,
    "train-step": train_step,
    "train-step-sgd": sgd_step,
}
