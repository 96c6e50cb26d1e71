"""Probe (issue 29): the few-heads CUDA variants at H16 B64 with rows that cost memory (random
over 4M rows) and with none read at all (every index padding), at 1, 2 and 4 splits. What the
kernel keeps without rows is on-chip work. Run on the device from the repo root:
    python3 scripts/probe_few_heads_rows.py 5 8 9
"""

import sys
from functools import partial
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_kernels import timed  # noqa: E402

from kernels.cuda_decode import sparse_mla_decode_cuda  # noqa: E402

H, B, TOPK, POOL = 16, 64, 2048, 1 << 22
gen = torch.Generator(device="cuda").manual_seed(0)
q = torch.randn(B, H, 576, generator=gen, device="cuda").to(torch.bfloat16)
cache = torch.randint(0, 256, (POOL // 16, 16, 352), generator=gen, device="cuda",
                      dtype=torch.uint8)
cache.view(-1, 352)[:, 320:] = 0x38  # scales 1.0: no NaN / inf from random scale bytes
cases = {
    "random rows": torch.randint(0, POOL, (B, TOPK), generator=gen, device="cuda",
                                 dtype=torch.int32),
    "all padding": torch.full((B, TOPK), -1, device="cuda", dtype=torch.int32),
}
out = torch.empty(B, H, 512, dtype=torch.bfloat16, device="cuda")
lse = torch.empty(B, H, dtype=torch.float32, device="cuda")
for v in [int(a) for a in sys.argv[1:]]:
    for name, idx in cases.items():
        row = []
        for splits in (1, 2, 4):
            t = timed(partial(sparse_mla_decode_cuda, q, cache, idx, 0.07, num_splits=splits,
                              out=out, lse=lse, variant=v))
            row.append(f"{t * 1e6:6.1f}")
        print(f"v{v:<2} {name:12s} us at 1/2/4 splits: {' / '.join(row)}", flush=True)
