"""Random inputs shaped like MLA decode data, for the tests and the benchmark.

Plain Gaussians flatter a block-scaled format: real latents have heavy tails and outlier
channels, which set the block scales and crush their neighbours onto coarse grid points.
"""

import torch

from kernels.kv_formats import E2M1_VALUES, KV_DIM, LATENT_DIM, NVFP4_BLOCK


def heavy_tailed(
    shape: tuple[int, ...],
    gen: torch.Generator,
    outlier_frac: float = 0.02,
    outlier_gain: float = 30.0,
) -> torch.Tensor:
    """bf16 with a log-normal scale mixture per value and a few outlier channels (last dim)."""
    dev = gen.device
    x = torch.randn(shape, generator=gen, device=dev)
    x *= torch.exp(0.75 * torch.randn(shape, generator=gen, device=dev))
    outlier = torch.rand(shape[-1], generator=gen, device=dev) < outlier_frac
    x *= torch.where(outlier, outlier_gain, 1.0)
    return x.to(torch.bfloat16)


def nvfp4_exact_kv(n: int, gen: torch.Generator) -> torch.Tensor:
    """[n, 576] float32 rows that NVFP4 stores exactly, with power-of-two block scales.

    Each 16-value block is E2M1 grid values times 2**k with one +-6 * 2**k (so amax / 6 is the
    scale), the rope part E4M3 values; any power-of-two rescale keeps them exact in E4M3 too.
    """
    dev = gen.device
    blocks = LATENT_DIM // NVFP4_BLOCK
    table = torch.tensor(E2M1_VALUES, device=dev)
    lat = table[torch.randint(0, 16, (n, blocks, NVFP4_BLOCK), generator=gen, device=dev)]
    lat[..., 0] = torch.where(torch.rand(n, blocks, generator=gen, device=dev) < 0.5, 6.0, -6.0)
    exp = torch.randint(-6, 5, (n, blocks, 1), generator=gen, device=dev).float()
    lat = lat * torch.exp2(exp)
    rope = torch.randint(
        0, 256, (n, KV_DIM - LATENT_DIM), generator=gen, device=dev, dtype=torch.uint8
    )
    rope = rope.view(torch.float8_e4m3fn).float()
    rope = torch.where(rope.isnan(), 1.0, rope).clamp(-64, 64)
    return torch.cat([lat.reshape(n, LATENT_DIM), rope], dim=1)


def ragged_topk(batch: int, topk: int, pool: int, gen: torch.Generator) -> torch.Tensor:
    """[batch, topk] int32 slots in [1, pool): each query keeps a random-length prefix with
    -1 holes in it, the rest -1; query 0 keeps none, query 1 all. Slot 0 is never used, so
    tests can poison it.
    """
    dev = gen.device
    idx = torch.randint(1, pool, (batch, topk), generator=gen, device=dev, dtype=torch.int32)
    keep = torch.randint(1, topk + 1, (batch, 1), generator=gen, device=dev)
    keep[0] = 0
    if batch > 1:
        keep[1] = topk
    pos = torch.arange(topk, device=dev)[None, :]
    holes = torch.rand(batch, topk, generator=gen, device=dev) < 0.1
    holes[1:2] = False
    return torch.where((pos < keep) & ~holes, idx, -1).to(torch.int32)


def logit_scaled_q(
    bsz: int, heads: int, kv: torch.Tensor, sm_scale: float, gen: torch.Generator, std: float = 3.0
) -> torch.Tensor:
    """Heavy-tailed bf16 q [bsz, heads, 576], rescaled so that its scaled scores against
    rows of kv spread with `std`, like real logits; raw heavy-tailed products would make
    every softmax one-hot and hide errors on all but one row."""
    q = heavy_tailed((bsz, heads, KV_DIM), gen).float()
    sample = kv[: min(len(kv), 512)].float()
    s = (q.reshape(-1, KV_DIM) @ sample.T) * sm_scale
    return (q * (std / s.std())).to(torch.bfloat16)
