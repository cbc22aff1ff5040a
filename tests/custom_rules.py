"""Functions with derivative rules of their own, as users write them: `tests/test_custom_derivatives.py`
differentiates them through superopt, and the fuzzer's "custom" kind (`tests/fuzzing.py`) calls them in
random programs. Each one's rule differs from the derivative of its body at a kink (0, the clip bounds
+-1) or everywhere (straight-through rules), so a program that loses the rule has a wrong derivative."""
import jax
import jax.numpy as jnp


@jax.custom_vjp
def clip_gradient(x):
    """The identity, whose gradient is clipped to [-0.01, 0.01]."""
    return x


clip_gradient.defvjp(lambda x: (x, None), lambda _, g: (jnp.clip(g, -0.01, 0.01),))


@jax.custom_jvp
def straight_through_round(x):
    """round, with the identity's derivative."""
    return jnp.round(x)


straight_through_round.defjvp(lambda p, t: (straight_through_round(p[0]), t[0]))


@jax.custom_jvp
def safe_norm(x):
    """The norm of all of x, whose derivative at 0 is 0, not NaN."""
    return jnp.sqrt(jnp.sum(x * x))


@safe_norm.defjvp
def _safe_norm_jvp(primals, tangents):
    (x,), (t,) = primals, tangents
    norm = safe_norm(x)
    return norm, jnp.where(norm == 0, 0.0, jnp.sum(x * t) / jnp.where(norm == 0, 1.0, norm))


@jax.custom_jvp
def relu_at_kink(x):
    """relu whose derivative at 0 is 1 (jax.nn.relu's is 0, its body's max 0.5)."""
    return jnp.maximum(x, 0)


relu_at_kink.defjvp(lambda p, t: (relu_at_kink(p[0]), jnp.where(p[0] >= 0, t[0], jnp.zeros_like(t[0]))))


@jax.custom_vjp
def clip_through(x):
    """x clipped to [-1, 1], its gradient passed where -1 <= x <= 1 (the bounds included)."""
    return jnp.clip(x, -1, 1)


clip_through.defvjp(lambda x: (jnp.clip(x, -1, 1), x),
                    lambda x, g: (jnp.where(jnp.abs(x) <= 1, g, jnp.zeros_like(g)),))


@jax.custom_vjp
def floor_through(x):
    """floor, with the identity's gradient."""
    return jnp.floor(x)


floor_through.defvjp(lambda x: (jnp.floor(x), None), lambda _, g: (g,))


# By name, as the fuzzer's programs call them (beside jax.nn's own custom_jvp functions), and which of
# them are custom_vjp functions, which have no forward mode (jax.jvp raises).
RULES = {f.__name__: f for f in (clip_gradient, straight_through_round, safe_norm, relu_at_kink, clip_through,
                                 floor_through)}
CUSTOM_VJP = ("clip_gradient", "clip_through", "floor_through")
