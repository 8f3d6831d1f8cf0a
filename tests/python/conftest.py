import numpy as np
import pytest


def reference_attention(q, k, v, paths, scale):
    """fp64 attention: query i over the KV slots in paths[i] (its root-to-node tokens)."""
    nq, hq, d = q.shape
    hkv = k.shape[1]
    group = hq // hkv
    o = np.zeros((nq, hq, d))
    lse = np.zeros((nq, hq))
    for i, slots in enumerate(paths):
        for h in range(hq):
            keys = k[slots, h // group].astype(np.float64)
            values = v[slots, h // group].astype(np.float64)
            s = keys @ q[i, h].astype(np.float64) * scale
            m = s.max()
            p = np.exp(s - m)
            o[i, h] = p @ values / p.sum()
            lse[i, h] = m + np.log(p.sum())
    return o, lse


@pytest.fixture
def rng():
    return np.random.default_rng(7)
