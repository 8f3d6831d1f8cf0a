import numpy as np
import pytest


def reference_attention(q, k, v, paths, scale, sinks=None, softcap=None):
    """fp64 attention: query i over the KV slots in paths[i] (its root-to-node tokens);
    k and v already dequantized, scores soft-capped at `softcap` and a sink logit per
    query head in the softmax's denominator where given."""
    nq, hq, _ = q.shape
    hkv, dv = k.shape[1], v.shape[2]
    group = hq // hkv
    o = np.zeros((nq, hq, dv))
    lse = np.zeros((nq, hq))
    for i, slots in enumerate(paths):
        for h in range(hq):
            keys = k[slots, h // group].astype(np.float64)
            values = v[slots, h // group].astype(np.float64)
            s = keys @ q[i, h].astype(np.float64) * scale
            if softcap:
                s = softcap * np.tanh(s / softcap)
            sink = -np.inf if sinks is None else float(sinks[h])
            m = max(s.max(), sink)
            p = np.exp(s - m)
            total = p.sum() + np.exp(sink - m)
            o[i, h] = p @ values / total
            lse[i, h] = m + np.log(total)
    return o, lse


@pytest.fixture
def rng():
    return np.random.default_rng(7)
