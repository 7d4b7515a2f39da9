"""PyTorch capturing the start-up of benches/gpu_startup.rs, for comparison.

67 batch sizes (vLLM's default capture sizes: 1, 2, 4, then 8 to 512 by 8)
of the same layer stack: LAYERS layers of h = tanh(h * w + b) on a
batch x HIDDEN float32 activation (three kernels a layer), each size
warmed up once eagerly and captured as one torch.cuda.CUDAGraph, all graphs
sharing one memory pool (torch.cuda.graph_pool_handle()), largest size
first (as vLLM captures). Timed from the first warm-up to the last graph
captured; then the caching allocator's reserved bytes against before (the
pool the graphs keep), and the driver's graph memory (PyTorch's graphs
allocate from the caching allocator, not graph memory nodes). Each graph is
replayed once and its output compared with the eager run, bitwise.

Run on a machine with a GPU: python3 benches/torch_startup.py
"""

import time

import torch

LAYERS = 4
HIDDEN = 1024


def sizes():
    return [1, 2, 4] + [8 * k for k in range(1, 65)]


def stack(h, ws, bs):
    for w, b in zip(ws, bs):
        h = torch.tanh(h * w + b)
    return h


def main():
    assert torch.cuda.is_available(), "needs a CUDA GPU"
    dev = torch.device("cuda")
    ws = [0.9 + 0.05 * l for l in range(LAYERS)]
    bs = [0.01 * l - 0.02 for l in range(LAYERS)]
    biggest = max(sizes())
    x = ((torch.arange(biggest * HIDDEN, device=dev) % 97).float() / 97.0 - 0.5).view(
        biggest, HIDDEN
    )
    torch.cuda.synchronize()
    reserved_before = torch.cuda.memory_reserved()

    pool = torch.cuda.graph_pool_handle()
    graphs = {}
    stream = torch.cuda.Stream()
    t0 = time.perf_counter()
    expected = {}
    for batch in sorted(sizes(), reverse=True):
        inp = x[:batch]
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            expected[batch] = stack(inp, ws, bs).clone()  # the warm-up
        torch.cuda.current_stream().wait_stream(stream)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=pool, stream=stream):
            out = stack(inp, ws, bs)
        graphs[batch] = (g, out)
    torch.cuda.synchronize()
    started = time.perf_counter() - t0
    reserved_after = torch.cuda.memory_reserved()

    equal = 0
    for batch, (g, out) in graphs.items():
        g.replay()
        torch.cuda.synchronize()
        same = out.view(torch.int32).eq(expected[batch].view(torch.int32)).all().item()
        equal += int(same)
    mib = 1 << 20
    print(f"## torch start-up: {len(sizes())} sizes x {LAYERS} layers (hidden {HIDDEN})")
    print(f"torch first warm-up to every graph captured, ms | {started * 1e3:.1f}")
    print(
        "torch caching allocator reserved, MiB (before, after) | "
        f"{reserved_before / mib:.1f}, {reserved_after / mib:.1f}"
    )
    print(f"torch graphs bitwise equal to eager | {equal} of {len(graphs)}")


if __name__ == "__main__":
    main()
