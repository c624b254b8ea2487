"""The machine's matmul peak, timed in the run's own process and precision: the denominator of the fraction of
the peak that training reports (``attnlab train lm``'s last line)."""

from __future__ import annotations

import time

import torch

from attnlab.training.distributed import Place, all_sum, barrier

PEAK_SIZE, PEAK_REPEATS, PEAK_SECONDS = 1024, 20, 1.0
ALONE = Place()  # a plain run: rank 0 of a world of 1
GPU_PEAK_SIZE, GPU_PEAK_PRODUCTS = 4096, 10  # a 1024 product takes microseconds on a GPU: too short to time


def _peak_products(device: torch.device) -> tuple[int, int]:
    """The side of the square product that :func:`measure_peak_matmul` times on ``device``, and how many a timing."""
    return (GPU_PEAK_SIZE, GPU_PEAK_PRODUCTS) if device.type == "cuda" else (PEAK_SIZE, 1)


def measure_peak_matmul(device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32,
                        place: Place = ALONE, repeats: int = PEAK_REPEATS) -> float:
    """The matmul rate (FLOP/s) of ``device`` in ``dtype``: the fastest of ``repeats`` timed square products.

    Measured in the calling process, with its thread settings and in the precision training computes in
    (bfloat16 for an autocast run), so the fraction it is the denominator of compares like with like. The
    fastest repeat is the peak: a slower one was disturbed, and on a shared machine many short repeats catch a
    quiet moment more surely than a few long ones. The repeats stop after about a second (bfloat16 emulated on a
    CPU without bfloat16 units takes seconds a product). On the CPU a repeat is one
    1024 x 1024 product (as fast per FLOP as 2048 here: 38 vs 33 GFLOP/s on two cores); on a GPU it is ten
    4096 x 4096 products between synchronisations, since a kernel launch returns before the product is done.

    Under torchrun (``place`` of a world > 1) every process times at once and the rates are summed: the
    processes share the machine as they did in training, one core or GPU each, so the sum is the peak of what
    the run used (a process timed alone would have the whole CPU and overstate its share).
    """
    device = torch.device(device)
    size, products = _peak_products(device)
    done = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    g = torch.Generator(device=device).manual_seed(0)  # its own: the training's random streams stay untouched
    a, b = (torch.randn(size, size, device=device, generator=g).to(dtype) for _ in range(2))
    a @ b  # warm-up: thread pool start and the library's first-call set-up
    done()
    barrier(place)
    best, began = float("inf"), time.perf_counter()
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(products):
            a @ b
        done()
        best = min(best, time.perf_counter() - start)
        if time.perf_counter() - began > PEAK_SECONDS:  # emulated bfloat16 takes seconds a product
            break
    rate = 2.0 * size**3 * products / best
    return all_sum(rate, place)


def machine_peak(device: torch.device | str, dtype: torch.dtype, place: Place = ALONE) -> tuple[float, str]:
    """The peak a run computing in ``dtype`` is measured against, and how it was found, in words.

    In ``dtype``, and for a lower precision also in float32, the faster of the two: a CPU without bfloat16
    units emulates bfloat16 products far below its float32 rate (0.8 against 100 GFLOP/s on two Zen 3 cores), and
    a fraction of that peak passed 100% for a small model whose products took other kernels. Where the lower
    precision is the faster, as it is where the hardware computes in it, the figure is the one it was.
    """
    rates = {kind: measure_peak_matmul(device, kind, place) for kind in dict.fromkeys((dtype, torch.float32))}
    fastest = max(rates, key=rates.__getitem__)
    basis = peak_basis(device, fastest, place.world)
    if fastest != dtype:
        name = str(dtype).removeprefix("torch.")
        basis += f" (faster than the {name} products training computes in: {rates[dtype] / 1e9:.1f} GFLOP/s)"
    return rates[fastest], basis


def peak_basis(device: torch.device | str, dtype: torch.dtype, world: int) -> str:
    """How :func:`measure_peak_matmul` measured, in words for the report."""
    device = torch.device(device)
    size, products = _peak_products(device)
    what = f"{products} " if products > 1 else ""
    where = "the GPU" if device.type == "cuda" else "the CPU"
    return (f"fastest of up to {PEAK_REPEATS} timings of {what}{size}x{size} {str(dtype).removeprefix('torch.')} "
            f"matmuls on {where}, " + (f"summed over the {world} processes timing at once" if world > 1
                                       else "in this process before training"))
