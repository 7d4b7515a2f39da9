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
//! - `cli/*`: the `replay-arena-plan` command on 100,000 symmetric groups
//!   (with `--features cli`; see [`bench_cli`]).

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
                bucket: None,
                requests,
                receive: Vec::new(),
                hand_off: Vec::new(),
            }
        })
        .collect();
    Workload {
        name: "one-million".into(),
        source: None,
        module_kinds: Some(3),
        groups: None,
        buckets: None,
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

/// Symmetric groups in the command-line benchmarks.
const GROUPS: u64 = 100_000;

/// `GROUPS` symmetric groups spread over `runners` runners
/// (`layer{i}.bwd`), each group used by one runner with one wgrad input of
/// a pseudo-random size.
fn groups_workload(runners: u64) -> Workload {
    let mut next = sizes();
    let per = GROUPS / runners;
    let runners = (0..runners)
        .map(|i| RunnerSpec {
            id: None,
            name: Some(format!("layer{i}.bwd")),
            bucket: None,
            requests: (i * per..(i + 1) * per)
                .map(|g| RequestSpec {
                    domain: DomainSpec::Symmetric(format!("g{g}")),
                    dtype: DType::BF16,
                    elements: 1 + next() % (1 << 20),
                    purpose: Purpose::WgradRsInput,
                    param: None,
                })
                .collect(),
            receive: Vec::new(),
            hand_off: Vec::new(),
        })
        .collect();
    Workload {
        name: format!("groups-{GROUPS}"),
        source: None,
        module_kinds: None,
        groups: None,
        buckets: None,
        runners,
    }
}

/// `replay-arena-plan` on a workload of 100,000 symmetric groups, as a user
/// runs it (process start, reading the file, planning, the report and
/// writing it out), when the benchmark is built with `--features cli`:
///
/// - `cli/{text,json}/G100000/100k_groups`: 100,000 runners of one group
///   each, `-g 100000` and `-g 100000 --json`.
/// - `cli/json_svg/G2/100k_groups`: 4,000 runners of 25 groups each (`--svg`
///   draws at most 4,096 buffer-using runners), `-g 2 --packed --json --svg`:
///   100,000 panels.
fn bench_cli(c: &mut Criterion) {
    let Some(exe) = option_env!("CARGO_BIN_EXE_replay-arena-plan") else {
        eprintln!("cli benchmarks skipped: build with --features cli");
        return;
    };
    let dir = std::env::temp_dir().join(format!("replay-arena-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a scratch directory");
    let write = |name: &str, workload: Workload| {
        let path = dir.join(name);
        let text = workload.to_json().expect("the workload writes");
        std::fs::write(&path, text).expect("the workload is saved");
        path.to_string_lossy().into_owned()
    };
    let one_each = write("one-each.json", groups_workload(GROUPS));
    let drawn = write("drawn.json", groups_workload(4_000));
    let svg = dir.join("plan.svg").to_string_lossy().into_owned();
    let cases: [(&str, Vec<&str>); 3] = [
        ("text/G100000/100k_groups", vec![&one_each, "-g", "100000"]),
        (
            "json/G100000/100k_groups",
            vec![&one_each, "-g", "100000", "--json"],
        ),
        (
            "json_svg/G2/100k_groups",
            vec![&drawn, "-g", "2", "--packed", "--json", "--svg", &svg],
        ),
    ];
    let mut group = c.benchmark_group("cli");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(10));
    for (name, args) in &cases {
        group.bench_function(*name, |b| {
            b.iter(|| {
                let status = std::process::Command::new(exe)
                    .args(args)
                    .stdout(std::process::Stdio::null())
                    .status()
                    .expect("the command starts");
                assert!(status.success(), "{name}: {status}");
            })
        });
    }
    group.finish();
    let _ = std::fs::remove_dir_all(&dir);
}

criterion_group!(benches, bench, bench_cli);
criterion_main!(benches);
