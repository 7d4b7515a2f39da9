"""The PyTorch path users have today, for comparison with benches/gpu_replay.rs.

Host time per replay of the same small one-kernel graph (a 256-element
fill-and-scale), 20,000 replays after a warm-up, three ways:

  plain     torch.cuda.CUDAGraph.replay() on one stream
  fenced    two streams, two generation events: wait_event(gen) + replay()
            + record_event(gen), alternating streams and generations, as a
            framework fencing persistent buffers by hand would
  same      the fenced pattern with every replay on one stream

Prints one line per mode: `torch <mode> <ns per replay>` (median of 5 runs).
Run on the GPU machine: python3 benches/torch_replay.py
"""

import statistics
import time

import torch

REPLAYS = 20_000
RUNS = 5


def main():
    assert torch.cuda.is_available(), "needs a CUDA GPU"
    dev = torch.device("cuda")
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    events = [torch.cuda.Event(), torch.cuda.Event()]
    x = torch.zeros(256, device=dev)

    capture_stream = torch.cuda.Stream()
    capture_stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(capture_stream):
        for _ in range(3):
            x.fill_(1.0).mul_(1.0)
    torch.cuda.current_stream().wait_stream(capture_stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=capture_stream):
        x.fill_(1.0).mul_(1.0)
    torch.cuda.synchronize()

    def plain():
        s = streams[0]
        with torch.cuda.stream(s):
            for _ in range(REPLAYS):
                graph.replay()

    def fenced(n_streams):
        for i in range(REPLAYS):
            s = streams[i % n_streams]
            e = events[i % 2]
            with torch.cuda.stream(s):
                s.wait_event(e)
                graph.replay()
                e.record(s)

    modes = {
        "plain": plain,
        "fenced": lambda: fenced(2),
        "same": lambda: fenced(1),
    }
    for name, fn in modes.items():
        fn()  # warm-up
        torch.cuda.synchronize()
        samples = []
        for _ in range(RUNS):
            t0 = time.perf_counter_ns()
            fn()
            t1 = time.perf_counter_ns()
            torch.cuda.synchronize()
            samples.append((t1 - t0) / REPLAYS)
        print(f"torch {name} {statistics.median(samples):.0f}")


if __name__ == "__main__":
    main()
