"""The tensor-parallel backward of examples/tp_backward in PyTorch, for
comparison: the same shapes, modules and buffers, two ways, on one GPU or
on N (`--ranks N`: torch.distributed with NCCL, one process per GPU; each
rank computes the wgrads of its own rows of the batch, which are
reduce-scattered so that each rank keeps its Megatron shard: output rows of
fc1, input columns of fc2 and the attention projection, whose wgrads are
computed transposed so that the shard is contiguous).

  eager    every module on one stream: dgrad and wgrad GEMMs (bf16, FP32
           compute), the reduce-scatter (one rank: a copy of the wgrad into
           the shard standing in), the FP32 accumulation into the main grad;
           wgrad and shard from PyTorch's caching allocator
  graphed  one torch.cuda.CUDAGraph per module (dgrads, wgrads into a ring of
           two generations of wgrad/shard buffers, the copy), replayed on one
           compute stream with Megatron-style fences: the compute stream
           waits on the generation's event before each replay; after it, the
           side stream waits for the replay, accumulates the shard into the
           main grad and records the generation's event

Modes are interleaved round by round; step time is the median over rounds,
host time the first step of each round enqueued on an idle device. Memory:
the eager step's peak of its own buffers (caching allocator), and the ring
plus the graphs' private pools. Prints a table in the same units as the
example.

Run on a GPU machine:
  python3 benches/torch_tp_backward.py --preset small
  python3 benches/torch_tp_backward.py --preset mid
  python3 benches/torch_tp_backward.py --preset mid --ranks 2
"""

import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist

PRESETS = {
    "small": dict(hidden=512, ffn=2048, tokens=128, layers=8),
    "mid": dict(hidden=4096, ffn=16384, tokens=2048, layers=8),
}


def parse():
    p = argparse.ArgumentParser()
    p.add_argument("--preset", choices=PRESETS, default="small")
    for k in ("hidden", "ffn", "tokens", "layers"):
        p.add_argument(f"--{k}", type=int)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--ranks", type=int, default=1)
    a = p.parse_args()
    shape = dict(PRESETS[a.preset])
    for k in shape:
        if getattr(a, k) is not None:
            shape[k] = getattr(a, k)
    return a, shape


class Linear:
    def __init__(self, inputs, outputs, tokens, row, dev, gen):
        self.inputs, self.outputs, self.row = inputs, outputs, row
        scale = (3.0 / outputs) ** 0.5
        # Weights from the shared generator (equal on every rank), inputs
        # from this rank's own.
        self.weight = ((torch.rand(outputs, inputs, device=dev, generator=gen[0]) * 2 - 1) * scale).to(torch.bfloat16)
        self.input = (torch.rand(tokens, inputs, device=dev, generator=gen[1]) * 2 - 1).to(torch.bfloat16)
        self.dgrad = torch.empty(tokens, inputs, device=dev, dtype=torch.bfloat16)

    def wgrad(self, dy, out=None):
        """dW = dY^T X, [out, in] (column-parallel), or dW^T = X^T dY,
        [in, out] (row-parallel): a rank's shard is contiguous either way."""
        if self.row:
            return torch.matmul(self.input.t(), dy, out=out)
        return torch.matmul(dy.t(), self.input, out=out)


def build(shape, dev, rank):
    h, f, t = shape["hidden"], shape["ffn"], shape["tokens"]
    gen = [torch.Generator(device=dev), torch.Generator(device=dev)]
    gen[0].manual_seed(0)
    gen[1].manual_seed(1000 + rank)
    modules = []
    for _ in range(shape["layers"]):
        modules.append([Linear(h, f, t, False, dev, gen), Linear(f, h, t, True, dev, gen)])  # mlp: fc1, fc2
        modules.append([Linear(h, h, t, True, dev, gen)])  # attention projection
    loss_grad = (torch.rand(t, h, device=dev, generator=gen[1]) * 2 - 1).to(torch.bfloat16)
    return modules, loss_grad


def dgrads(module, dy):
    """dX = dY W for each linear, last first; returns each linear's dY."""
    dys = []
    for lin in reversed(module):
        dys.append(dy)
        torch.matmul(dy, lin.weight, out=lin.dgrad)
        dy = lin.dgrad
    return dys


def main():
    args, shape = parse()
    assert torch.cuda.is_available(), "needs a CUDA GPU"
    if args.ranks == 1:
        worker(0, args, shape)
        return
    assert torch.cuda.device_count() >= args.ranks, f"--ranks {args.ranks} needs as many GPUs"
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    torch.multiprocessing.spawn(worker, args=(args, shape), nprocs=args.ranks)


def worker(rank, args, shape):
    ranks = args.ranks
    torch.cuda.set_device(rank)
    dev = torch.device("cuda", rank)
    if ranks > 1:
        dist.init_process_group("nccl", rank=rank, world_size=ranks, device_id=dev)
    lead = rank == 0
    modules, loss_grad = build(shape, dev, rank)
    inputs = [loss_grad] + [m[0].dgrad for m in modules[:-1]]
    lin_order = [list(reversed(m)) for m in modules]
    flops = sum(4.0 * shape["tokens"] * l.inputs * l.outputs for m in modules for l in m)

    def mains():
        return [[torch.zeros(l.inputs * l.outputs // ranks, device=dev) for l in ls] for ls in lin_order]

    def reduce_scatter(shard, wgrad):
        if ranks == 1:
            shard.copy_(wgrad.view(-1))
        else:
            dist.reduce_scatter_tensor(shard, wgrad.view(-1))

    main_eager, main_graphed = mains(), mains()
    compute = torch.cuda.Stream()
    side = torch.cuda.Stream()

    def eager_step(main):
        for m, module in enumerate(modules):
            dys = dgrads(module, inputs[m])
            for j, (lin, dy) in enumerate(zip(lin_order[m], dys)):
                wgrad = lin.wgrad(dy)
                shard = torch.empty(wgrad.numel() // ranks, device=dev, dtype=torch.bfloat16)
                reduce_scatter(shard, wgrad)
                main[m][j].add_(shard)

    # Ring of two generations: module m uses generation m % 2.
    def ring_bytes(gen):
        return max(sum(l.inputs * l.outputs for l in modules[m]) for m in range(gen, len(modules), 2))

    ring = [(torch.empty(ring_bytes(g), device=dev, dtype=torch.bfloat16),
             torch.empty(ring_bytes(g) // ranks, device=dev, dtype=torch.bfloat16)) for g in range(2)]
    views = []
    for m, ls in enumerate(lin_order):
        w_ring, s_ring = ring[m % 2]
        off, v = 0, []
        for lin in ls:
            n = lin.inputs * lin.outputs
            dims = (lin.inputs, lin.outputs) if lin.row else (lin.outputs, lin.inputs)
            v.append((w_ring[off:off + n].view(*dims), s_ring[off // ranks:(off + n) // ranks]))
            off += n
        views.append(v)

    def graphed_body(m):
        dys = dgrads(modules[m], inputs[m])
        for lin, dy, (w, s) in zip(lin_order[m], dys, views[m]):
            lin.wgrad(dy, out=w)
            reduce_scatter(s, w)

    # Warm up on the capture stream (cuBLAS handles and workspaces), then
    # capture each module.
    with torch.cuda.stream(compute):
        for _ in range(2):
            for m in range(len(modules)):
                graphed_body(m)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    graphs = []
    for m in range(len(modules)):
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=compute):
            graphed_body(m)
        graphs.append(g)
    torch.cuda.synchronize()
    pools = torch.cuda.memory_allocated() - before
    gen_free = [torch.cuda.Event(), torch.cuda.Event()]
    done = [torch.cuda.Event() for _ in modules]
    for e in gen_free:
        e.record(side)

    def graphed_step(main):
        for m, g in enumerate(graphs):
            gen = m % 2
            compute.wait_event(gen_free[gen])
            with torch.cuda.stream(compute):
                g.replay()
            done[m].record(compute)
            side.wait_event(done[m])
            with torch.cuda.stream(side):
                for j, (_, s) in enumerate(views[m]):
                    main[m][j].add_(s)
            gen_free[gen].record(side)

    # Eager peak of its own buffers (one step, then the grads start over).
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    with torch.cuda.stream(compute):
        eager_step(main_eager)
    torch.cuda.synchronize()
    eager_peak = torch.cuda.max_memory_allocated() - base
    for g in main_eager:
        for t in g:
            t.zero_()

    per_round = args.steps // args.rounds
    modes = {
        "eager": lambda: eager_step(main_eager),
        "graphed, per-module CUDAGraph, fenced replay": lambda: graphed_step(main_graphed),
    }
    times = {k: ([], []) for k in modes}
    for rnd in range(args.rounds + 1):
        for name, step in modes.items():
            torch.cuda.synchronize()
            if ranks > 1:
                dist.barrier()
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            host = 0.0
            count = 1 if rnd == 0 else per_round
            with torch.cuda.stream(compute):
                for i in range(count):
                    step()
                    if i == 0:
                        host = time.perf_counter() - t0
            torch.cuda.synchronize()
            if rnd > 0:
                times[name][0].append((time.perf_counter() - t0) / per_round)
                times[name][1].append(host)

    same = all(torch.equal(a, b) for x, y in zip(main_eager, main_graphed) for a, b in zip(x, y))
    diff = max((a - b).abs().max().item() for x, y in zip(main_eager, main_graphed) for a, b in zip(x, y))
    if ranks > 1:
        print(f"rank {rank}: main grads, graphed vs eager: {'bitwise equal' if same else f'max |diff| {diff:e}'}")
        torch.cuda.synchronize()
        dist.barrier()
        # The graphs hold NCCL work: free them before the communicator.
        graphs.clear()
        torch.cuda.synchronize()
        dist.destroy_process_group()
    if not lead:
        return
    nccl = ".".join(map(str, torch.cuda.nccl.version())) if ranks > 1 else "-"
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}, NCCL {nccl}; {ranks} rank(s); "
          f"hidden {shape['hidden']}, ffn {shape['ffn']}, tokens {shape['tokens']} per rank, L = {shape['layers']}; "
          f"{per_round * args.rounds} steps per mode ({args.rounds} rounds of {per_round}, interleaved; rank 0's clock)")
    print("| mode | step time | host time per step | TFLOP/s |")
    print("|---|---:|---:|---:|")
    eager = statistics.median(times["eager"][0])
    for name, (step, host) in times.items():
        s, h = statistics.median(step), statistics.median(host)
        print(f"| torch {name} | {s * 1e3:.3f} ms ({eager / s:.2f}x eager) | {h * 1e6:.1f} us | {flops / s / 1e12:.1f} per rank |")
    mib = 1 << 20
    ring_total = sum(w.numel() * 2 + s.numel() * 2 for w, s in ring)
    print(f"memory: ring of 2 {ring_total / mib:.1f} MiB + graph private pools {pools / mib:.1f} MiB; "
          f"eager peak of its own buffers {eager_peak / mib:.1f} MiB")
    print(f"main grads, graphed vs eager: {'bitwise equal' if same else f'max |diff| {diff:e}'}")


if __name__ == "__main__":
    main()
