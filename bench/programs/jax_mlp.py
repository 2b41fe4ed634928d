"""A JAX MLP trained with jax.jit'd steps: XLA's own allocator holds the memory (a pool it
grows itself), no torch."""
import json
import statistics
import time

import jax
import jax.numpy as jnp

key = jax.random.PRNGKey(0)
params = [jax.random.normal(k, (4096, 4096)) * 0.01 for k in jax.random.split(key, 8)]
x = jax.random.normal(key, (2048, 4096))


def loss_fn(params, x):
    for w in params:
        x = jnp.tanh(x @ w)
    return jnp.mean(x * x)


@jax.jit
def step(params, x):
    loss, grads = jax.value_and_grad(loss_fn)(params, x)
    return [p - 0.01 * g for p, g in zip(params, grads)], loss


losses, times = [], []
for _ in range(20):
    t0 = time.perf_counter()
    params, loss = step(params, x)
    loss.block_until_ready()
    times.append(time.perf_counter() - t0)
    losses.append(float(loss))
stats = jax.devices()[0].memory_stats() or {}
print("COMPAT " + json.dumps({"losses": [repr(v) for v in losses], "times": times,
                              "step_ms": 1e3 * statistics.median(times[len(times) // 4:]),
                              "peak_reserved": stats.get("peak_bytes_in_use", 0)}), flush=True)
