//! The plan report: a table people can read (a legend, runner names, packed
//! offsets, one verdict, aligned columns) built in time and memory
//! near-linear in runners and arenas, however many keys or generations.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use replay_arena::{
    human_bytes, DType, Discovering, Domain, GroupId, ParamId, PlacedPolicy, PlanConfig,
    PlanReport, Planned, Policy, Purpose, Request, RunnerId,
};

/// Counts the bytes this thread allocates, so a test can bound what one
/// call allocates.
struct Counting;

thread_local! {
    static ALLOCATED: Cell<u64> = const { Cell::new(0) };
}

fn count(bytes: usize) {
    let _ = ALLOCATED.try_with(|a| a.set(a.get() + bytes as u64));
}

// SAFETY: every call is forwarded to the system allocator unchanged.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count(layout.size());
        // SAFETY: forwarded with the caller's layout.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count(layout.size());
        // SAFETY: forwarded with the caller's layout.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count(new_size);
        // SAFETY: forwarded with the caller's pointer, layout and size.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded with the caller's pointer and layout.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static COUNTING: Counting = Counting;

/// The plan's report and the bytes building it allocated on this thread.
fn report_allocating(planned: &Planned) -> (PlanReport, u64) {
    let before = ALLOCATED.with(Cell::get);
    let report = planned.report();
    (report, ALLOCATED.with(Cell::get) - before)
}

const MIB: u64 = 1 << 20;

fn bf16_mib(mib: u64) -> Request {
    Request::new(Domain::Device, DType::BF16, mib * MIB / 2)
}

/// Runners of `sizes[k]` MiB of bf16 each, named `layer{k}.bwd`, and one
/// runner (id 99) that requests nothing.
fn named_runners(sizes: &[u64], config: PlanConfig) -> Discovering {
    let mut d = Discovering::new(config);
    for (k, &mib) in sizes.iter().enumerate() {
        d.arm_named(RunnerId(k as u32), format!("layer{k}.bwd"))
            .unwrap()
            .record(bf16_mib(mib))
            .unwrap();
    }
    d.arm(RunnerId(99)).unwrap();
    d
}

fn table(d: &Discovering, strategy: impl Into<PlacedPolicy>) -> (PlanReport, String) {
    let report = d.clone().plan(strategy).unwrap().report();
    let text = report.to_string();
    (report, text)
}

/// The numeric columns of the keys' table (at `G = 2`).
const KEY_COLUMNS: [&str; 7] = [
    "plan",
    "lower bound",
    "round-robin",
    "packed",
    "ring(2)",
    "plan/lb",
    "waits",
];

/// `G = generations`, placed round-robin and packed.
fn round_robin_and_packed(generations: usize) -> [PlacedPolicy; 2] {
    [
        Policy::Generations(generations).into(),
        Policy::Generations(generations).packed(),
    ]
}

/// The block of lines that starts with the line starting with `header`.
fn block<'a>(text: &'a str, header: &str) -> Vec<&'a str> {
    text.lines()
        .skip_while(|l| !l.starts_with(header))
        .take_while(|l| !l.is_empty())
        .collect()
}

/// Panics unless, in every row of `rows`, each right-aligned column named in
/// `columns` ends exactly where its header ends.
fn assert_right_aligned(rows: &[&str], columns: &[&str]) {
    let header = rows[0];
    for &column in columns {
        let end = header
            .find(&format!(" {column}"))
            .map(|i| i + 1 + column.len())
            .unwrap_or_else(|| panic!("no column {column} in {header:?}"));
        for row in &rows[1..] {
            let chars: Vec<char> = row.chars().collect();
            let last = chars.get(end - 1).copied().unwrap_or(' ');
            if row.starts_with(' ') {
                // A continuation row (a runner's next key, or a wrapped
                // name) leaves the runner's columns blank.
                continue;
            }
            assert!(
                last != ' ' && chars.get(end).is_none_or(|c| *c == ' '),
                "column {column} does not end at {end} in {row:?}\n{}",
                rows.join("\n")
            );
        }
    }
}

#[test]
fn the_table_has_a_legend_for_every_abbreviated_column() {
    let d = named_runners(&[10, 1, 20], PlanConfig::new());
    for strategy in round_robin_and_packed(2) {
        let (report, _) = table(&d, strategy);
        let text = format!("{report:#}");
        let legend = block(&text, "legend:");
        for term in ["G"].into_iter().chain(KEY_COLUMNS) {
            assert!(
                legend.iter().any(|l| l.starts_with(&format!("{term} "))),
                "no legend for {term}:\n{text}"
            );
        }
    }
    let round_robin = table(&d, Policy::Generations(2)).0.legend();
    assert!(block(&round_robin, "legend:")
        .iter()
        .any(|l| l.starts_with("gen ")));
    let packed = table(&d, Policy::Generations(2).packed()).0.legend();
    assert!(block(&packed, "legend:")
        .iter()
        .any(|l| l.starts_with("offset, end ")));
}

#[test]
fn runner_names_from_discovery_are_in_the_data_and_the_table() {
    let d = named_runners(&[10, 1, 20], PlanConfig::new());
    let (report, text) = table(&d, Policy::Generations(2));
    let names: Vec<Option<&str>> = report.runners.iter().map(|r| r.name.as_deref()).collect();
    assert_eq!(
        names,
        vec![
            Some("layer0.bwd"),
            Some("layer1.bwd"),
            Some("layer2.bwd"),
            None
        ]
    );
    let runners = block(&text, "runner ");
    assert!(runners[0].ends_with(" name"), "{text}");
    for k in 0..3 {
        assert!(
            runners[k + 1].starts_with(&format!("runner {k} "))
                && runners[k + 1].ends_with(&format!(" layer{k}.bwd")),
            "{text}"
        );
    }
}

#[test]
fn a_table_without_names_has_no_name_column() {
    let mut d = Discovering::new(PlanConfig::new());
    d.arm(RunnerId(0)).unwrap().record(bf16_mib(1)).unwrap();
    let (_, text) = table(&d, Policy::Generations(1));
    assert!(!block(&text, "runner ")[0].ends_with(" name"), "{text}");
}

#[test]
fn a_runner_without_buffers_has_no_generation_rather_than_a_dash() {
    let d = named_runners(&[10, 1, 20], PlanConfig::new());
    let (_, text) = table(&d, Policy::Generations(2));
    let empty = block(&text, "runner ")
        .into_iter()
        .find(|l| l.starts_with("runner 99 "))
        .unwrap();
    assert!(empty.ends_with(" none  -"), "{empty:?}");
    let (_, packed) = table(&d, Policy::Generations(2).packed());
    let empty = block(&packed, "runner ")
        .into_iter()
        .find(|l| l.starts_with("runner 99 "))
        .unwrap();
    assert!(empty.contains(" none "), "{empty:?}");
}

#[test]
fn a_packed_table_shows_every_runner_offset_and_end() {
    let d = named_runners(&[10, 1, 20, 10, 1, 20], PlanConfig::new());
    let (report, text) = table(&d, Policy::Generations(2).packed());
    let rows = block(&text, "runner ");
    for r in report.runners.iter().filter(|r| !r.extents.is_empty()) {
        let row = rows
            .iter()
            .find(|l| l.starts_with(&format!("{} ", r.runner)))
            .unwrap();
        let s = r.extents[0];
        let cells: Vec<&str> = row.split("  ").map(str::trim).collect();
        assert!(
            cells.contains(&human_bytes(s.offset).as_str())
                && cells.contains(&human_bytes(s.offset + s.bytes).as_str()),
            "{} at {} in {row:?}",
            r.runner,
            s.offset
        );
        // The bar, then the runner's name.
        let bar = row.rsplit(' ').nth(2).unwrap();
        assert_eq!(bar.chars().count(), 20, "{row:?}");
        assert!(bar.chars().all(|c| c == '#' || c == '.'), "{row:?}");
    }
    // Runner 2 (20 MiB) and runner 1 (1 MiB, in flight with it) never
    // share a byte: their bars may touch but their ranges do not overlap.
    assert_eq!(report.plan_bytes, report.lower_bound);
}

#[test]
fn the_verdict_says_what_packing_saves_over_round_robin() {
    // Per window of two: 30 MiB at most; round-robin needs 20 + 20.
    let d = named_runners(&[10, 1, 20, 10, 1, 20, 10, 1, 20], PlanConfig::new());
    let (report, text) = table(&d, Policy::Generations(2));
    assert_eq!(
        (report.round_robin_bytes, report.packed_bytes),
        (40 * MIB, 30 * MIB)
    );
    assert_eq!(
        report.verdict(),
        "packed at G = 2 saves 10.00 MiB (25.0%) over round-robin; this plan is round_robin, 1.333x the lower bound"
    );
    assert_eq!(
        text.lines().filter(|l| l.starts_with("verdict:")).count(),
        1
    );
    assert!(
        text.contains(
            "verdict: packed at G = 2 saves 10.00 MiB (25.0%) over round-robin\n\
             this plan is round_robin, 1.333x the lower bound"
        ),
        "{text}"
    );
    let (_, packed) = table(&d, Policy::Generations(2).packed());
    assert!(packed.contains(
        "verdict: packed at G = 2 saves 10.00 MiB (25.0%) over round-robin\n\
         this plan is packed, 1.000x the lower bound"
    ));
}

#[test]
fn the_verdict_says_when_packing_saves_nothing() {
    let d = named_runners(&[4, 4, 4, 4], PlanConfig::new());
    let (_, text) = table(&d, Policy::Generations(2));
    assert!(
        text.contains(
            "verdict: packed at G = 2 saves nothing over round-robin (both 8.00 MiB)\n\
             this plan is round_robin, 1.000x the lower bound"
        ),
        "{text}"
    );
}

#[test]
fn the_verdict_of_a_plan_without_buffers_says_so() {
    let mut d = Discovering::new(PlanConfig::new());
    d.arm(RunnerId(0)).unwrap();
    let (_, text) = table(&d, Policy::Generations(2));
    assert!(
        text.contains("verdict: no runner uses buffers: nothing to place"),
        "{text}"
    );
}

#[test]
fn a_long_key_name_keeps_the_key_columns_aligned() {
    let config = PlanConfig::new()
        .with_group(GroupId(3), "expert-tensor-parallel-group-of-the-mtp-head")
        .unwrap();
    let mut d = named_runners(&[10, 1, 20], config);
    let long = Request::new(Domain::Symmetric(GroupId(3)), DType::F32, 1 << 20);
    d.arm_named(RunnerId(7), "mtp.head.bwd.with.a.long.name")
        .unwrap()
        .record(long)
        .unwrap();
    for strategy in round_robin_and_packed(2) {
        let (_, text) = table(&d, strategy);
        assert!(text.contains("expert-tensor-parallel-group-of-the-mtp-head"));
        let keys = block(&text, "key ");
        assert_eq!(keys.len(), 4, "{text}"); // header, two keys, total
        assert_right_aligned(&keys, &KEY_COLUMNS);
        let runners = block(&text, "runner ");
        assert_right_aligned(&runners, &["requests", "bytes", "waits"]);
    }
}

#[test]
fn many_arenas_of_one_key_are_summarized_on_one_line() {
    let d = named_runners(&[1; 20], PlanConfig::new());
    let (_, text) = table(&d, Policy::Generations(20));
    let keys = block(&text, "# ");
    assert!(
        keys[1].ends_with("20 arenas, 1.00 MiB to 1.00 MiB"),
        "{}",
        keys[1]
    );
}

/// `n` runners of one bf16 wgrad buffer each; runner `k` also uses the
/// symmetric group `k % groups`, so each group's key has few users.
fn sparse_groups(n: u32, groups: u32) -> Discovering {
    let mut config = PlanConfig::new();
    for g in 0..groups {
        config = config.with_group(GroupId(g), format!("ep{g}")).unwrap();
    }
    let mut d = Discovering::new(config);
    for k in 0..n {
        let mut armed = d.arm(RunnerId(k)).unwrap();
        armed
            .record(
                Request::new(Domain::Device, DType::BF16, 4096 + u64::from(k % 7))
                    .purpose(Purpose::WgradRsInput)
                    .param(ParamId(u64::from(k % 5))),
            )
            .unwrap();
        armed
            .record(
                Request::new(
                    Domain::Symmetric(GroupId(k % groups)),
                    DType::BF16,
                    8192 * (1 + u64::from(k % 3)),
                )
                .purpose(Purpose::WgradRsInput),
            )
            .unwrap();
    }
    d
}

#[test]
fn a_report_of_many_sparse_keys_allocates_in_proportion_to_its_runners() {
    // 2,000 symmetric groups of one runner each. A report that laid out
    // every key over every runner (or reran the packed search over them)
    // allocated about 2,000 x 2,000 x 8 bytes per pass: hundreds of MiB.
    let n = 2_000;
    for strategy in round_robin_and_packed(3) {
        let planned = sparse_groups(n, n).plan(strategy).unwrap();
        let (report, allocated) = report_allocating(&planned);
        assert_eq!(report.keys.len(), n as usize + 1);
        let items = u64::from(n) + planned.arenas().len() as u64;
        assert!(
            allocated <= 4096 * items,
            "{strategy:?}: {allocated} bytes allocated for {items} runners and arenas"
        );
    }
}

#[test]
fn a_report_at_as_many_generations_as_runners_is_linear() {
    // G = 100,000 round-robin generations of one arena each. Finding each
    // (key, generation) arena by a scan of all arenas took G x arenas steps
    // (1e10 here); one pass over the arenas takes 1e5.
    let n = 100_000;
    let mut d = Discovering::new(PlanConfig::new());
    for k in 0..n {
        d.arm(RunnerId(k))
            .unwrap()
            .record(Request::new(Domain::Device, DType::F32, 64))
            .unwrap();
    }
    let planned = d.plan(Policy::Generations(n as usize)).unwrap();
    assert_eq!(planned.generations(), n as usize);
    let (report, allocated) = report_allocating(&planned);
    assert_eq!(report.keys[0].arenas.len(), n as usize);
    assert_eq!(report.plan_bytes, report.lower_bound);
    assert_eq!(report.packed_bytes, report.plan_bytes);
    let items = u64::from(n) + planned.arenas().len() as u64;
    assert!(
        allocated <= 4096 * items,
        "{allocated} bytes allocated for {items} runners and arenas"
    );
}

/// `n` runners, runner `k` recording one request of its own symmetric group.
fn one_group_each(n: u32) -> Discovering {
    let mut config = PlanConfig::new();
    for k in 0..n {
        config = config.with_group(GroupId(k), format!("g{k}")).unwrap();
    }
    let mut d = Discovering::new(config);
    for k in 0..n {
        d.arm(RunnerId(k))
            .unwrap()
            .record(Request::new(Domain::Symmetric(GroupId(k)), DType::BF16, 64))
            .unwrap();
    }
    d
}

#[test]
fn many_single_runner_groups_at_as_many_generations_plan_and_report_in_linear_memory() {
    // 4,000 keys at G = 4,000. Round-robin planning kept G arena sizes per
    // key (keys x G = 16e6 entries) and the report G more; packed planning
    // G slots per key for its round-robin candidate. Only generations with
    // users get an arena now, and nothing has G entries per key.
    let n = 4_000u32;
    for strategy in round_robin_and_packed(n as usize) {
        let d = one_group_each(n);
        let before = ALLOCATED.with(Cell::get);
        let planned = d.plan(strategy).unwrap();
        let (report, _) = report_allocating(&planned);
        let allocated = ALLOCATED.with(Cell::get) - before;
        assert_eq!(planned.generations(), n as usize);
        assert_eq!(planned.arenas().len(), n as usize);
        assert!(report.keys.iter().all(|k| k.arenas.len() == 1));
        assert_eq!(report.plan_bytes, report.lower_bound);
        assert!(
            allocated <= 4096 * u64::from(n),
            "{strategy:?}: {allocated} bytes allocated for {n} runners and keys"
        );
    }
}

#[test]
fn round_robin_key_figures_list_only_generations_with_users() {
    // Two keys at G = 4: the device key is used by every runner, the
    // symmetric key only by runners 1 and 3 (generations 1 and 3).
    let config = PlanConfig::new().with_group(GroupId(0), "gtp").unwrap();
    let mut d = Discovering::new(config);
    for k in 0..4u32 {
        let mut armed = d.arm(RunnerId(k)).unwrap();
        armed.record(bf16_mib(u64::from(k) + 1)).unwrap();
        if k % 2 == 1 {
            armed
                .record(Request::new(
                    Domain::Symmetric(GroupId(0)),
                    DType::BF16,
                    2048 * u64::from(k),
                ))
                .unwrap();
        }
    }
    let planned = d.plan(Policy::Generations(4)).unwrap();
    let report = planned.report();
    assert_eq!(report.keys.len(), 2);
    let symmetric = report
        .keys
        .iter()
        .find(|k| k.key.domain == Domain::Symmetric(GroupId(0)))
        .unwrap();
    assert_eq!(symmetric.arenas, vec![4096, 12288]);
    let device = report
        .keys
        .iter()
        .find(|k| k.key.domain == Domain::Device)
        .unwrap();
    assert_eq!(device.arenas, vec![MIB, 2 * MIB, 3 * MIB, 4 * MIB]);
    let generations: Vec<Option<usize>> = planned
        .arenas()
        .iter()
        .filter(|a| a.key == symmetric.key)
        .map(|a| a.generation)
        .collect();
    assert_eq!(generations, vec![Some(1), Some(3)]);
}

#[test]
fn a_lower_bound_no_layout_reaches_is_reported_with_the_runners_whose_search_proves_it() {
    // MLP (2a) and attention (a) modules, G = 3: windows weigh 5a, but no
    // layout of nine or more of these runners fits in less than 6a.
    let d = named_runners(&[2, 1, 2, 1, 2, 1, 2, 1, 2, 1], PlanConfig::new());
    let (report, text) = table(&d, Policy::Generations(3).packed());
    let key = &report.keys[0];
    assert_eq!(key.lower_bound, 5 * MIB);
    assert_eq!((key.packed_bytes, key.best_bound), (6 * MIB, 6 * MIB));
    let replay_arena::Optimum::Proved { first, last } = key.optimum else {
        panic!("{:?}\n{text}", key.optimum);
    };
    assert!(first < last, "{first} {last}");
    assert_eq!(report.best_bound, 6 * MIB);
    let bounds = block(&text, "bounds:")[1..].join(" ");
    let bounds = bounds.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(
        bounds.contains("and that is optimal") && bounds.contains("exhaustive search"),
        "{text}"
    );
    assert!(
        block(&text, "key ").iter().any(|l| l.contains(" proved ")),
        "{text}"
    );
}

#[test]
fn a_plan_at_its_lower_bound_says_so_and_adds_no_bound_notes() {
    let d = named_runners(&[10, 1, 20, 10, 1, 20], PlanConfig::new());
    let (report, text) = table(&d, Policy::Generations(2).packed());
    assert_eq!(report.keys[0].optimum, replay_arena::Optimum::LowerBound);
    assert_eq!(report.best_bound, report.lower_bound);
    assert!(block(&text, "bounds:").is_empty(), "{text}");
}

/// Lines of `text` wider than 100 characters.
fn too_wide(text: &str) -> Vec<&str> {
    text.lines().filter(|l| l.chars().count() > 100).collect()
}

/// A plan with a long group name, long runner names, a handoff-free packed
/// and round-robin placement: the reports a program prints.
fn long_names() -> Discovering {
    let config = PlanConfig::new()
        .with_group(GroupId(3), "expert-tensor-parallel-group-of-the-mtp-head")
        .unwrap();
    let mut d = named_runners(&[10, 1, 20, 10, 1, 20, 10, 1, 20, 10, 1, 20], config);
    let long = Request::new(Domain::Symmetric(GroupId(3)), DType::F32, 1 << 20);
    d.arm_named(
        RunnerId(70),
        "model.decoder.layers.11.mlp.experts.local_experts.7.linear_fc2.weight.backward",
    )
    .unwrap()
    .record(long)
    .unwrap();
    d
}

#[test]
fn the_default_form_fits_100_columns_without_cutting_anything() {
    for strategy in [
        Policy::Generations(3).into(),
        Policy::Generations(3).packed(),
        Policy::Generations(20).into(),
    ] {
        let (report, text) = table(&long_names(), strategy);
        assert!(too_wide(&text).is_empty(), "{:#?}", too_wide(&text));
        // Wrapped, not cut: every word of the long names is there.
        let words: Vec<&str> = text.split_whitespace().collect();
        let joined = words.concat();
        assert!(joined.contains(
            "model.decoder.layers.11.mlp.experts.local_experts.7.linear_fc2.weight.backward"
        ));
        assert!(text.contains(&format!("{:016x}", report.fingerprint)));
        // The legend too, in the alternate form.
        let full = format!("{report:#}");
        assert!(too_wide(&full).is_empty(), "{:#?}", too_wide(&full));
    }
}

#[test]
fn the_legend_is_printed_once_and_only_on_request() {
    let d = named_runners(&[10, 1, 20], PlanConfig::new());
    let (report, text) = table(&d, Policy::Generations(2));
    assert!(!text.contains("legend:"), "{text}");
    assert!(text.contains("`{:#}` or PlanReport::legend"), "{text}");
    let full = format!("{report:#}");
    assert_eq!(full.matches("legend:").count(), 1, "{full}");
    assert!(full.ends_with(&report.legend()), "{full}");
    // Everything else is the same.
    let (head, _) = full.split_once("legend:").unwrap();
    let (plain, _) = text.split_once("columns: ").unwrap();
    assert_eq!(head, plain);
}

#[test]
fn the_legend_of_a_packed_plan_does_not_describe_generations_it_has_not() {
    let d = named_runners(&[10, 1, 20], PlanConfig::new());
    // The legend's entry for G, its wrapped lines joined.
    let entry = |legend: &str| -> String {
        let at = legend.find("\nG ").unwrap() + 1;
        let end = legend[at..].find("\nkey ").unwrap() + at;
        legend[at..end]
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
    };
    let packed = entry(&table(&d, Policy::Generations(2).packed()).0.legend());
    assert!(!packed.contains("% G"), "{packed}");
    assert!(packed.contains("disjoint offsets"), "{packed}");
    let round_robin = entry(&table(&d, Policy::Generations(2)).0.legend());
    assert!(round_robin.contains("k % G"), "{round_robin}");
}

#[test]
fn the_header_explains_its_terms_where_they_appear() {
    let d = named_runners(&[10, 1, 20], PlanConfig::new());
    for strategy in round_robin_and_packed(2) {
        let (_, text) = table(&d, strategy);
        let verdict = text.find("verdict:").unwrap();
        // Both placements are said before the verdict compares them.
        let before = &text[..verdict];
        assert!(
            before.contains("round-robin") && before.contains("packed"),
            "{text}"
        );
        assert!(before.contains("k % G"), "{text}");
        let fingerprint = text
            .lines()
            .find(|l| l.starts_with("fingerprint: "))
            .unwrap();
        assert!(fingerprint.contains("a hash of the layout"), "{text}");
        assert!(
            text.contains("the fewest bytes any placement needs"),
            "{text}"
        );
    }
}
