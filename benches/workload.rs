//! CPU benchmarks of the workload format at scale (`cargo bench --bench
//! workload --features serde`): one million runners, one million distinct
//! parameter names.
//!
//! The workload: runner `i` (`layer{i/3}.{experts,router,attn}.bwd`) requests
//! a wgrad reduce-scatter input of parameter `p{i}` (bf16, symmetric group
//! `gtp`, pseudo-random size up to 1 Mi elements); every second runner also
//! an f32 device scratch buffer. Its JSON text (from [`Workload::to_json`]) is
//! built once, outside the timed regions.
//!
//! - `workload/parse/1M`: [`Workload::from_json_str`] of that text.
//! - `workload/discover/1M`: [`Workload::to_discovering`] (every check,
//!   interning a million parameter names).
//! - `workload/plan/{round_robin,packed}_G2/1M`: `Discovering::plan` with
//!   `Policy::Generations(2)` (the discovery is cloned outside the timing).
//! - `workload/report/round_robin_G2/1M`: `Planned::report`.
//! - `workload/save/1M`: [`Workload::from_discovering`] then
//!   [`Workload::to_json`].

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion};
use replay_arena::{
    DType, DomainSpec, ParamRef, Policy, Purpose, RequestSpec, RunnerSpec, Workload,
};

const RUNNERS: u64 = 1_000_000;

/// xorshift64*: deterministic sizes without a dependency.
fn sizes() -> impl FnMut() -> u64 {
    let mut state = 0x2545_f491_4f6c_dd1du64;
    move || {
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        state.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

fn workload() -> Workload {
    let mut next = sizes();
    let kinds = ["experts", "router", "attn"];
    let runners = (0..RUNNERS)
        .map(|i| {
            let mut requests = vec![RequestSpec {
                domain: DomainSpec::Symmetric("gtp".into()),
                dtype: DType::BF16,
                elements: 1 + next() % (1 << 20),
                purpose: Purpose::WgradRsInput,
                param: Some(ParamRef::Name(format!("p{i}"))),
            }];
            if i % 2 == 0 {
                requests.push(RequestSpec {
                    domain: DomainSpec::Device,
                    dtype: DType::F32,
                    elements: 1 + next() % (1 << 16),
                    purpose: Purpose::Fp32AccumScratch,
                    param: None,
                });
            }
            RunnerSpec {
                id: None,
                name: Some(format!("layer{}.{}.bwd", i / 3, kinds[(i % 3) as usize])),
                requests,
            }
        })
        .collect();
    Workload {
        name: "one-million".into(),
        source: None,
        module_kinds: Some(3),
        groups: None,
        runners,
    }
}

fn bench(c: &mut Criterion) {
    let text = workload().to_json().expect("the workload writes");
    let parsed = Workload::from_json_str(&text).expect("the workload reads back");
    let discovery = parsed.to_discovering().expect("the workload is valid");
    let planned = discovery
        .clone()
        .plan(Policy::Generations(2))
        .expect("the workload plans");
    eprintln!(
        "workload: {} runners, {:.1} MB of JSON",
        RUNNERS,
        text.len() as f64 / 1e6
    );

    let mut group = c.benchmark_group("workload");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(10));
    group.bench_function("parse/1M", |b| {
        b.iter(|| Workload::from_json_str(black_box(&text)))
    });
    group.bench_function("discover/1M", |b| {
        b.iter(|| black_box(&parsed).to_discovering())
    });
    for (name, strategy) in [
        ("plan/round_robin_G2/1M", Policy::Generations(2).into()),
        ("plan/packed_G2/1M", Policy::Generations(2).packed()),
    ] {
        group.bench_function(name, |b| {
            b.iter_batched(
                || discovery.clone(),
                |d| d.plan(strategy),
                BatchSize::PerIteration,
            )
        });
    }
    group.bench_function("report/round_robin_G2/1M", |b| {
        b.iter(|| black_box(&planned).report())
    });
    group.bench_function("save/1M", |b| {
        b.iter(|| {
            Workload::from_discovering("one-million", black_box(&discovery))
                .and_then(|w| w.to_json())
        })
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
