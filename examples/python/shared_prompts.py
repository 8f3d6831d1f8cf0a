"""A batch of requests that share a prompt, as a serving engine's paged KV cache
holds it: treeattn finds the shared pages in the block table, plans the tree once,
and runs attention reading the prompt's KV once for all requests.

    python examples/python/shared_prompts.py            # numpy, the CPU backend
    python examples/python/shared_prompts.py --torch    # torch CUDA tensors, the current stream
"""

import argparse
import time

import numpy as np

import treeattn

parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("--torch", action="store_true", help="torch CUDA tensors instead of numpy arrays")
parser.add_argument("--prompt", type=int, default=2000, help="prompt tokens every request shares")
parser.add_argument("--requests", type=int, default=16)
parser.add_argument("--generated", type=int, default=40, help="tokens each request decoded on its own")
args = parser.parse_args()

heads_q, heads_kv, head_dim, page = 32, 8, 128, 16
rng = np.random.default_rng(0)

# The engine's block table: the prompt's pages first in every row, then each request's own pages.
prompt_pages = list(range((args.prompt + page - 1) // page))
own_pages = (args.generated + page - 1) // page + 1
next_page = len(prompt_pages)
rows, seq_lens = [], []
for r in range(args.requests):
    # The prompt fills whole pages here (a partial last prompt page would be each request's own copy).
    rows.append(prompt_pages + list(range(next_page, next_page + own_pages)))
    next_page += own_pages
    seq_lens.append(len(prompt_pages) * page + args.generated)
tree = treeattn.tree_from_block_tables(np.array(rows), np.array(seq_lens), page, heads_q, heads_kv, head_dim)
print(f"{args.requests} requests: a tree of {tree.num_nodes} nodes (the shared prompt and one node a request)")

slots = next_page * page
q = rng.standard_normal((args.requests, heads_q, head_dim)).astype(np.float16)
k = rng.standard_normal((slots, heads_kv, head_dim)).astype(np.float16)
v = rng.standard_normal((slots, heads_kv, head_dim)).astype(np.float16)
if args.torch:
    import torch

    q, k, v = (torch.from_numpy(a).cuda() for a in (q, k, v))
ctx = treeattn.Context("cuda" if args.torch else "cpu")
start = time.perf_counter()
plan = ctx.plan(tree)
planned = time.perf_counter()
o, lse = ctx.attention(plan, q, k, v)
if args.torch:
    torch.cuda.synchronize()
    o, lse = o.cpu().numpy(), lse.cpu().numpy()
done = time.perf_counter()
print(f"backend {ctx.backend}: planned in {1e3 * (planned - start):.2f} ms ({plan.num_items} work items), "
      f"attention in {1e3 * (done - planned):.1f} ms")

# Request 0 against plain attention over its own sequence.
q0 = (q.cpu().numpy() if args.torch else q)[0].astype(np.float64)
kk = (k.cpu().numpy() if args.torch else k).astype(np.float64)
vv = (v.cpu().numpy() if args.torch else v).astype(np.float64)
path = [rows[0][t // page] * page + t % page for t in range(seq_lens[0])]
worst = 0.0
for h in range(heads_q):
    s = kk[path, h // (heads_q // heads_kv)] @ q0[h] / np.sqrt(head_dim)
    p = np.exp(s - s.max())
    worst = max(worst, np.abs(p @ vv[path, h // (heads_q // heads_kv)] / p.sum() - o[0, h]).max())
print(f"request 0 against plain attention over its sequence: max abs error {worst:.1e}")
