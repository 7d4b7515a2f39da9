//! The workload format (feature `serde`): reading, checking, saving
//! discovery and loading it back, and the bundled workload files.

use std::collections::{BTreeSet, HashSet};

use proptest::prelude::*;
use replay_arena::{
    DType, Discovering, Domain, DomainSpec, GroupId, GroupSpec, Key, Optimum, ParamId, ParamRef,
    PlanConfig, Policy, Purpose, Request, RequestSpec, RunnerId, RunnerSpec, Workload,
};

/// A small hand-written workload: three runners (one empty), two groups,
/// one parameter written three times.
const TINY: &str = include_str!("../../support/tiny-workload.json");

/// TINY with `from` replaced by `to` (which must occur exactly once).
fn tiny_with(from: &str, to: &str) -> String {
    assert_eq!(TINY.matches(from).count(), 1, "{from}");
    TINY.replacen(from, to, 1)
}

fn load(text: &str) -> Discovering {
    Workload::from_json_str(text)
        .and_then(|w| w.to_discovering())
        .unwrap_or_else(|e| panic!("{e}"))
}

/// The error reading or checking `text` gives.
fn error_of(text: &str) -> String {
    match Workload::from_json_str(text).map(|w| w.to_discovering()) {
        Ok(Ok(_)) => panic!("should not load: {text}"),
        Ok(Err(e)) | Err(e) => e.to_string(),
    }
}

fn requests(d: &Discovering, runner: u32) -> &[Request] {
    d.requests(RunnerId(runner)).unwrap()
}

// ---- reading and checking ----------------------------------------------------

#[test]
fn groups_and_params_are_numbered_by_first_appearance() {
    let d = load(TINY);
    let groups: Vec<(GroupId, &str)> = d.config().groups().collect();
    assert_eq!(
        groups,
        vec![(GroupId(0), "gtp"), (GroupId(1), "expert-gtp")]
    );
    let first = requests(&d, 0);
    assert_eq!(first[0].domain, Domain::Symmetric(GroupId(0)));
    assert_eq!(first[0].param, Some(ParamId(0)));
    assert_eq!(first[2].domain, Domain::Symmetric(GroupId(1)));
    assert_eq!(first[2].param, Some(ParamId(1)));
    assert_eq!(requests(&d, 2)[1].param, Some(ParamId(0)));
}

#[test]
fn purpose_defaults_to_other_and_param_to_none() {
    let d = load(TINY);
    let r = requests(&d, 0)[1];
    assert_eq!(r, Request::new(Domain::Device, DType::F32, 100));
    assert_eq!(r.purpose, Purpose::Other);
    assert_eq!(r.param, None);
}

#[test]
fn runners_are_armed_in_file_order_with_their_names() {
    let d = load(TINY);
    let ids: Vec<RunnerId> = d.runners().collect();
    assert_eq!(ids, vec![RunnerId(0), RunnerId(1), RunnerId(2)]);
    assert_eq!(d.runner_name(RunnerId(2)), Some("layer0.mlp.bwd"));
    assert!(requests(&d, 1).is_empty());
    let planned = d.plan(Policy::Generations(2)).unwrap();
    assert_eq!(planned.generation_of(RunnerId(0)), Some(0));
    assert_eq!(planned.generation_of(RunnerId(1)), None);
    assert_eq!(planned.generation_of(RunnerId(2)), Some(1));
}

#[test]
fn ids_names_and_groups_may_be_given_explicitly() {
    let d = load(
        r#"{"name": "w", "groups": [{"id": 7, "name": "gtp"}, {"name": "unused"}],
            "runners": [
              {"id": 40, "requests": [{"domain": {"symmetric": "gtp"}, "dtype": "u8", "elements": 1}]},
              {"id": 3, "name": "b", "requests": []}]}"#,
    );
    let groups: Vec<(GroupId, &str)> = d.config().groups().collect();
    assert_eq!(groups, vec![(GroupId(7), "gtp"), (GroupId(1), "unused")]);
    assert_eq!(
        d.runners().collect::<Vec<_>>(),
        vec![RunnerId(40), RunnerId(3)]
    );
    assert_eq!(d.runner_name(RunnerId(40)), None);
    assert_eq!(requests(&d, 40)[0].domain, Domain::Symmetric(GroupId(7)));
}

#[test]
fn named_params_skip_the_ids_numbered_params_use() {
    let d = load(
        r#"{"name": "w", "runners": [{"requests": [
            {"domain": "device", "dtype": "u8", "elements": 1, "param": "a"},
            {"domain": "device", "dtype": "u8", "elements": 1, "param": 0},
            {"domain": "device", "dtype": "u8", "elements": 1, "param": 2},
            {"domain": "device", "dtype": "u8", "elements": 1, "param": "b"}]}]}"#,
    );
    let params: Vec<Option<ParamId>> = requests(&d, 0).iter().map(|q| q.param).collect();
    assert_eq!(
        params,
        vec![
            Some(ParamId(1)),
            Some(ParamId(0)),
            Some(ParamId(2)),
            Some(ParamId(3))
        ]
    );
}

#[test]
fn a_repeated_param_in_one_runner_gets_two_slices_and_two_ring_slots() {
    let report = load(TINY).plan(Policy::Generations(1)).unwrap().report();
    let gtp = report
        .keys
        .iter()
        .find(|k| k.name == "bf16 in symmetric(gtp)")
        .unwrap();
    // Runner 2 writes l1.fc1 twice: 2 x 8192 bytes (4096-aligned).
    assert_eq!(gtp.lower_bound, 2 * 8192);
    // Three writers of l1.fc1 of one size; the ring keeps min(2, 3) slots.
    assert_eq!(gtp.ring_bytes, 2 * 8192);
}

#[test]
fn a_byte_order_mark_is_skipped() {
    let d = load(&format!("\u{feff}{TINY}"));
    assert_eq!(d.runners().count(), 3);
    let read = Workload::from_reader(format!("\u{feff}{TINY}").as_bytes()).unwrap();
    assert_eq!(read, Workload::from_json_str(TINY).unwrap());
}

#[test]
fn duplicate_keys_are_errors() {
    let e = error_of(&tiny_with(
        r#""elements": 100"#,
        r#""elements": 64, "elements": 128"#,
    ));
    assert!(
        e.starts_with("runners[0].requests[1]: duplicate field `elements`"),
        "{e}"
    );
    let e = error_of(&tiny_with(
        r#""name": "tiny","#,
        r#""name": "a", "name": "b","#,
    ));
    assert!(e.starts_with("duplicate field `name`"), "{e}");
    let e = error_of(&tiny_with(
        r#"{"symmetric": "expert-gtp"}"#,
        r#"{"symmetric": "a", "symmetric": "b"}"#,
    ));
    assert!(
        e.starts_with("runners[0].requests[2].domain: duplicate field `symmetric`"),
        "{e}"
    );
}

#[test]
fn misspelt_fields_are_errors_not_silently_dropped() {
    let e = error_of(&tiny_with(
        r#""elements": 100"#,
        r#""elements": 100, "purpse": "other""#,
    ));
    assert!(
        e.starts_with(
            "runners[0].requests[1].purpse: unknown field `purpse`, expected one of \
             `domain`, `dtype`, `elements`, `purpose`, `param`"
        ),
        "{e}"
    );
    let e = error_of(&tiny_with(r#""source""#, r#""sauce""#));
    assert!(e.starts_with("sauce: unknown field"), "{e}");
}

#[test]
fn unknown_names_say_what_is_known() {
    let e = error_of(&tiny_with(r#""dtype": "f32""#, r#""dtype": "bf17""#));
    assert!(
        e.starts_with(
            "runners[0].requests[1].dtype: unknown dtype \"bf17\" (expected one of: f64, f32, \
             f16, bf16, f8e4m3, f8e5m2, i64, i32, i8, u8)"
        ),
        "{e}"
    );
    let e = error_of(&tiny_with(
        r#""param": "l1.experts""#,
        r#""param": "l1.experts", "purpose": "wgrad""#,
    ));
    // A duplicate `purpose` is caught first.
    assert!(
        e.starts_with("runners[0].requests[2]: duplicate field `purpose`"),
        "{e}"
    );
    let e = error_of(&tiny_with(
        r#""elements": 100"#,
        r#""elements": 100, "purpose": "wgrad""#,
    ));
    assert!(
        e.starts_with("runners[0].requests[1].purpose: unknown purpose \"wgrad\""),
        "{e}"
    );
}

#[test]
fn bad_domains_name_their_path() {
    let e = error_of(&tiny_with(r#""domain": "device""#, r#""domain": "host""#));
    assert!(
        e.starts_with(
            r#"runners[0].requests[1].domain: unknown domain "host" (expected "device" or {"symmetric": GROUP})"#
        ),
        "{e}"
    );
    let e = error_of(&tiny_with(r#""domain": "device""#, r#""domain": 3"#));
    assert!(
        e.starts_with(
            r#"runners[0].requests[1].domain: invalid type: integer `3`, expected "device" or {"symmetric": GROUP}"#
        ),
        "{e}"
    );
}

#[test]
fn bad_symmetric_groups_name_their_path() {
    let at = |to: &str| error_of(&tiny_with(r#"{"symmetric": "expert-gtp"}"#, to));
    assert_eq!(
        at(r#"{"symmetric": ""}"#),
        "runners[0].requests[2].domain.symmetric: must not be empty"
    );
    assert!(at(r#"{"group": "x"}"#)
        .starts_with("runners[0].requests[2].domain.group: unknown field `group`"));
    assert!(at("{}").starts_with("runners[0].requests[2].domain: missing field `symmetric`"));
    let listed = tiny_with(
        r#""source": "hand-written","#,
        r#""groups": [{"name": "gtp"}],"#,
    );
    assert_eq!(
        error_of(&listed),
        "runners[0].requests[2].domain.symmetric: unknown group \"expert-gtp\" (groups: gtp)"
    );
}

#[test]
fn bad_element_counts_name_their_path() {
    let at = |v: &str| {
        error_of(&tiny_with(
            r#""elements": 100"#,
            &format!(r#""elements": {v}"#),
        ))
    };
    let path = "runners[0].requests[1].elements: ";
    assert!(
        at("0").starts_with(&format!("{path}must be at least 1, found 0 at line")),
        "{}",
        at("0")
    );
    assert!(
        at("-3").starts_with(&format!(
            "{path}expected a positive integer, found -3 at line"
        )),
        "{}",
        at("-3")
    );
    assert!(at("1.5").starts_with(&format!("{path}expected a positive integer, found 1.5 at")));
    assert!(at("\"100\"").starts_with(&format!(
        "{path}invalid type: string \"100\", expected a positive integer"
    )));
    // 2^64 is not printed as a float.
    assert!(at("18446744073709551616").starts_with(&format!(
        "{path}expected a positive integer, found a number of at least 2^64 (the most is \
         18446744073709551615)"
    )));
    assert_eq!(
        at("18446744073709551615"),
        "runners[0].requests[1]: request size of runner 0 for f32 in device overflows 64 bits \
         (18446744073709551615 elements of f32)"
    );
}

#[test]
fn capacity_overflow_names_the_request_that_tips_it() {
    // Each request alone fits in u64; their sum per key does not.
    let big = u64::MAX / 4 / 2 + 1;
    let text = format!(
        r#"{{"name": "big", "runners": [{{"name": "r", "requests": [
            {{"domain": "device", "dtype": "f32", "elements": {big}}},
            {{"domain": "device", "dtype": "f32", "elements": {big}}}]}}]}}"#
    );
    let e = error_of(&text);
    assert!(
        e.starts_with("runners[0].requests[1]: capacity of runner 0"),
        "{e}"
    );
}

#[test]
fn missing_and_mistyped_fields_name_their_path() {
    let e = error_of(&tiny_with(r#""name": "tiny","#, ""));
    assert!(e.starts_with("missing field `name`"), "{e}");
    let e = error_of(&tiny_with(r#""name": "tiny""#, r#""name": 7"#));
    assert!(
        e.starts_with("name: invalid type: integer `7`, expected a string"),
        "{e}"
    );
    let e = error_of(r#"{"name": "x", "runners": {}}"#);
    assert!(
        e.starts_with("runners: invalid type: map, expected a sequence"),
        "{e}"
    );
    assert_eq!(
        error_of(r#"{"name": "x", "runners": []}"#),
        "runners: must list at least one runner"
    );
    let e = error_of(r#"{"name": "x", "runners": [{"name": "a", "requests": 1}]}"#);
    assert!(
        e.starts_with("runners[0].requests: invalid type: integer `1`"),
        "{e}"
    );
    let e = error_of(r#"{"name": "x", "runners": [{"name": "a", "requests": [[]]}]}"#);
    assert!(
        e.starts_with("runners[0].requests[0]: invalid type: sequence, expected an object"),
        "{e}"
    );
    let e = error_of("[1, 2]");
    assert!(
        e.starts_with("invalid type: sequence, expected an object"),
        "{e}"
    );
    assert_eq!(
        error_of(r#"{"name": "x", "module_kinds": 0, "runners": [{"requests": []}]}"#),
        "module_kinds: must be at least 1"
    );
    assert_eq!(
        error_of(r#"{"name": "", "runners": [{"requests": []}]}"#),
        "name: must not be empty"
    );
}

#[test]
fn duplicate_runner_names_point_at_both() {
    let e = error_of(&tiny_with(r#""layer0.mlp.bwd""#, r#""layer1.mlp.bwd""#));
    assert_eq!(
        e,
        "runners[2].name: duplicate runner name \"layer1.mlp.bwd\" (also runners[0])"
    );
}

#[test]
fn duplicate_runner_ids_are_refused_by_discovery() {
    let e = error_of(r#"{"name": "x", "runners": [{"id": 1, "requests": []}, {"requests": []}]}"#);
    assert!(
        e.starts_with("runners[1]: runner 1 was armed twice for discovery"),
        "{e}"
    );
}

#[test]
fn invalid_json_says_where() {
    let e = error_of(r#"{"name": "x", "runners": [}"#);
    assert!(e.starts_with("invalid JSON: "), "{e}");
    assert!(e.contains("line 1 column"), "{e}");
    let e = error_of(r#"{"name": "x", "runners": [{"requests": []}]} trailing"#);
    assert!(e.starts_with("invalid JSON: trailing characters"), "{e}");
}

#[test]
fn a_hundred_thousand_distinct_params_load_in_linear_time() {
    // Interning by linear search took 25 s here; a hash map takes a blink.
    let n = 100_000;
    let runners: Vec<RunnerSpec> = (0..n)
        .map(|i| RunnerSpec {
            id: None,
            name: Some(format!("r{i}")),
            bucket: None,
            requests: vec![RequestSpec {
                domain: DomainSpec::Device,
                dtype: DType::BF16,
                elements: 1 + i % 7,
                purpose: Purpose::WgradRsInput,
                param: Some(ParamRef::Name(format!("p{i}"))),
            }],
            receive: Vec::new(),
            hand_off: Vec::new(),
        })
        .collect();
    let workload = Workload {
        name: "many".into(),
        source: None,
        module_kinds: None,
        groups: None,
        buckets: None,
        runners,
    };
    let text = workload.to_json().unwrap();
    let start = std::time::Instant::now();
    let d = Workload::from_json_str(&text)
        .unwrap()
        .to_discovering()
        .unwrap();
    let elapsed = start.elapsed();
    assert_eq!(requests(&d, n as u32 - 1)[0].param, Some(ParamId(n - 1)));
    assert!(elapsed.as_secs() < 10, "{elapsed:?}");
}

// ---- saving discovery and loading it back --------------------------------------

#[test]
fn saving_keeps_names_groups_purposes_and_params() {
    let mut d = Discovering::new(with_groups(&[(5, "expert-gtp"), (0, "gtp")]));
    d.arm_named(RunnerId(0), "layer1.mlp.bwd")
        .unwrap()
        .record(
            Request::new(Domain::Symmetric(GroupId(0)), DType::BF16, 4096)
                .purpose(Purpose::WgradRsInput)
                .param(ParamId(9)),
        )
        .unwrap();
    d.arm(RunnerId(7)).unwrap();
    let w = Workload::from_discovering("saved", &d).unwrap();
    assert_eq!(
        w.groups,
        Some(vec![
            GroupSpec {
                id: Some(5),
                name: "expert-gtp".into()
            },
            GroupSpec {
                id: Some(0),
                name: "gtp".into()
            },
        ])
    );
    assert_eq!(w.runners[0].id, None);
    assert_eq!(w.runners[0].name.as_deref(), Some("layer1.mlp.bwd"));
    assert_eq!(
        w.runners[0].requests,
        vec![RequestSpec {
            domain: DomainSpec::Symmetric("gtp".into()),
            dtype: DType::BF16,
            elements: 4096,
            purpose: Purpose::WgradRsInput,
            param: Some(ParamRef::Id(9)),
        }]
    );
    assert_eq!(
        (w.runners[1].id, w.runners[1].name.as_deref()),
        (Some(7), None)
    );
    let text = w.to_json().unwrap();
    assert!(
        text.contains(r#"{"domain":{"symmetric":"gtp"},"dtype":"bf16","elements":4096,"purpose":"wgrad_rs_input","param":9}"#),
        "{text}"
    );
    assert_eq!(load(&text), d);
}

#[test]
fn saving_refuses_names_a_file_cannot_tell_apart() {
    let mut d = Discovering::new(PlanConfig::new());
    d.arm_named(RunnerId(0), "layer").unwrap();
    d.arm_named(RunnerId(1), "layer").unwrap();
    let e = Workload::from_discovering("w", &d).unwrap_err().to_string();
    assert_eq!(
        e,
        "runner 0 and runner 1 are both named \"layer\"; a workload names runners uniquely"
    );
    let config = with_groups(&[(0, "gtp"), (1, "gtp")]);
    let e = Workload::from_discovering("w", &Discovering::new(config))
        .unwrap_err()
        .to_string();
    assert_eq!(
        e,
        "group 0 and group 1 are both registered as \"gtp\"; a workload names groups uniquely"
    );
}

/// Groups with distinct ids and names, in registration order.
fn groups() -> impl Strategy<Value = Vec<(u32, String)>> {
    (
        prop::collection::hash_set(0u32..6, 0..4),
        "[a-z\"\\\\é ]{0,4}",
    )
        .prop_map(|(ids, stem)| {
            ids.into_iter()
                .enumerate()
                .map(|(i, id)| (id, format!("{stem}{i}")))
                .collect()
        })
}

fn dtype() -> impl Strategy<Value = DType> {
    prop::sample::select(DType::ALL.to_vec())
}

fn purpose() -> impl Strategy<Value = Purpose> {
    prop::sample::select(vec![
        Purpose::WgradRsInput,
        Purpose::RsOutput,
        Purpose::Fp32RsScratch,
        Purpose::Fp32AccumScratch,
        Purpose::Other,
    ])
}

/// A request whose domain is device or one of `groups` groups (by index).
fn request() -> impl Strategy<
    Value = (
        Option<prop::sample::Index>,
        DType,
        u64,
        Purpose,
        Option<u64>,
    ),
> {
    (
        prop::option::of(any::<prop::sample::Index>()),
        dtype(),
        1u64..(1 << 40),
        purpose(),
        prop::option::of(any::<u64>()),
    )
}

/// A discovery as an eager run records it: random runner ids, names or none,
/// groups, and requests of every kind.
fn discovery() -> impl Strategy<Value = Discovering> {
    (
        groups(),
        prop::collection::hash_set(any::<u32>(), 1..8),
        prop::collection::vec(
            (
                prop::option::of("[a-z.\"\\\\ ]{0,6}"),
                prop::collection::vec(request(), 0..4),
            ),
            8,
        ),
    )
        .prop_map(|(groups, ids, runners)| {
            let groups: Vec<_> = groups
                .iter()
                .map(|(id, name)| (*id, name.as_str()))
                .collect();
            let mut d = Discovering::new(with_groups(&groups));
            for (i, (id, (name, requests))) in ids.into_iter().zip(runners).enumerate() {
                let mut armed = match name {
                    Some(stem) => d.arm_named(RunnerId(id), format!("{stem}#{i}")),
                    None => d.arm(RunnerId(id)),
                }
                .unwrap();
                for (group, dtype, elements, purpose, param) in requests {
                    let domain = match group {
                        Some(g) if !groups.is_empty() => {
                            Domain::Symmetric(GroupId(groups[g.index(groups.len())].0))
                        }
                        _ => Domain::Device,
                    };
                    let mut q = Request::new(domain, dtype, elements).purpose(purpose);
                    if let Some(p) = param {
                        q = q.param(ParamId(p));
                    }
                    armed.record(q).unwrap();
                }
            }
            d
        })
}

/// A workload as people write them: names for groups and params, or numbers.
fn workload() -> impl Strategy<Value = Workload> {
    let param = prop_oneof![
        any::<u64>().prop_map(ParamRef::Id),
        ".{0,5}".prop_map(ParamRef::Name)
    ];
    let request = (
        prop::option::of(".{0,4}"),
        dtype(),
        any::<u64>(),
        purpose(),
        prop::option::of(param),
    )
        .prop_map(|(group, dtype, elements, purpose, param)| RequestSpec {
            domain: group.map_or(DomainSpec::Device, DomainSpec::Symmetric),
            dtype,
            elements,
            purpose,
            param,
        });
    let runner = (
        prop::option::of(any::<u32>()),
        prop::option::of(".{0,6}"),
        prop::collection::vec(request, 0..3),
    )
        .prop_map(|(id, name, requests)| RunnerSpec {
            id,
            name,
            bucket: None,
            requests,
            receive: Vec::new(),
            hand_off: Vec::new(),
        });
    let group =
        (prop::option::of(any::<u32>()), ".{0,4}").prop_map(|(id, name)| GroupSpec { id, name });
    (
        ".{0,8}",
        prop::option::of(".{0,20}"),
        prop::option::of(any::<usize>()),
        prop::option::of(prop::collection::vec(group, 0..3)),
        prop::collection::vec(runner, 0..5),
    )
        .prop_map(|(name, source, module_kinds, groups, runners)| Workload {
            name,
            source,
            module_kinds,
            groups,
            buckets: None,
            runners,
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn discovery_saved_and_loaded_is_the_same_discovery(d in discovery()) {
        let saved = Workload::from_discovering("w", &d).unwrap();
        prop_assert_eq!(&saved.to_discovering().unwrap(), &d);
        let text = saved.to_json().unwrap();
        let read = Workload::from_json_str(&text).unwrap();
        prop_assert_eq!(&read, &saved);
        prop_assert_eq!(read.to_discovering().unwrap(), d);
    }

    #[test]
    fn a_loaded_discovery_plans_as_the_original(d in discovery(), g in 1usize..4) {
        let text = Workload::from_discovering("w", &d).unwrap().to_json().unwrap();
        let loaded = Workload::from_json_str(&text).unwrap().to_discovering().unwrap();
        let a = d.plan(Policy::Generations(g).packed()).unwrap();
        let b = loaded.plan(Policy::Generations(g).packed()).unwrap();
        prop_assert_eq!(a.fingerprint(), b.fingerprint());
        prop_assert_eq!(a.report(), b.report());
    }

    #[test]
    fn any_workload_survives_its_json(w in workload()) {
        // What would not load is not saved: the same error as loading.
        let text = match w.to_json() {
            Ok(text) => text,
            Err(e) => {
                prop_assert_eq!(e.to_string(), w.to_discovering().unwrap_err().to_string());
                return Ok(());
            }
        };
        prop_assert_eq!(Workload::from_json_str(&text).unwrap(), w.clone());
        // serde_json's own writer is read back the same too.
        let plain = serde_json::to_string(&w).unwrap();
        prop_assert_eq!(Workload::from_json_str(&plain).unwrap(), w);
    }
}

// ---- bundled workloads -------------------------------------------------------

struct Bundled {
    stem: String,
    workload: Workload,
    discovery: Discovering,
}

fn bundled() -> Vec<Bundled> {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/workloads");
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "json") {
            let file = std::fs::File::open(&path).unwrap();
            let workload =
                Workload::from_reader(file).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            let discovery = workload
                .to_discovering()
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            let stem = path.file_stem().unwrap().to_string_lossy().into_owned();
            out.push(Bundled {
                stem,
                workload,
                discovery,
            });
        }
    }
    out.sort_by(|a, b| a.stem.cmp(&b.stem));
    out
}

fn by_name<'w>(all: &'w [Bundled], name: &str) -> &'w Bundled {
    all.iter().find(|b| b.stem == name).unwrap()
}

fn all_requests(d: &Discovering) -> impl Iterator<Item = &Request> {
    d.runners().flat_map(|r| d.requests(r).unwrap())
}

#[test]
fn bundled_workloads_load_and_name_their_source() {
    let all = bundled();
    let names: Vec<&str> = all.iter().map(|b| b.stem.as_str()).collect();
    assert_eq!(
        names,
        vec![
            "deepseek-v3-mtp",
            "gpt3-175b-per-module",
            "gpt3-175b-whole-layer",
            "mixtral-8x7b-per-module",
            "tp-backward-mid"
        ]
    );
    let readme = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/workloads/README.md"
    ))
    .unwrap();
    for b in &all {
        let w = &b.workload;
        assert_eq!(w.name, b.stem);
        assert!(
            w.source.as_ref().is_some_and(|s| s.len() > 40),
            "{}",
            b.stem
        );
        assert!(w.module_kinds.is_some(), "{}", b.stem);
        assert!(
            readme.contains(&format!("{}.json", b.stem)),
            "README misses {}",
            b.stem
        );
    }
}

#[test]
fn bundled_workloads_survive_saving() {
    for b in bundled() {
        let saved = Workload::from_discovering(b.stem.as_str(), &b.discovery).unwrap();
        let text = saved.to_json().unwrap();
        let loaded = Workload::from_json_str(&text)
            .unwrap()
            .to_discovering()
            .unwrap();
        assert_eq!(loaded, b.discovery, "{}", b.stem);
    }
}

#[test]
fn bundled_model_workloads_mix_every_purpose() {
    for b in bundled() {
        let purposes: BTreeSet<Purpose> = all_requests(&b.discovery).map(|q| q.purpose).collect();
        // The example's own requests: workspaces, wgrads and their
        // reduce-scatter outputs (it accumulates into main grads outside
        // the plan).
        let expected: &[Purpose] = if b.stem == "tp-backward-mid" {
            &[Purpose::Other, Purpose::WgradRsInput, Purpose::RsOutput]
        } else {
            &[
                Purpose::WgradRsInput,
                Purpose::RsOutput,
                Purpose::Fp32RsScratch,
                Purpose::Fp32AccumScratch,
            ]
        };
        for &p in expected {
            assert!(purposes.contains(&p), "{} has no {p}", b.stem);
        }
    }
}

#[test]
fn tp_backward_mid_hands_every_input_gradient_to_the_next_module_and_plans_at_its_bound() {
    let all = bundled();
    let b = by_name(&all, "tp-backward-mid");
    let handoffs: Vec<_> = b.discovery.handoffs().collect();
    assert_eq!(handoffs.len(), 15);
    for (i, (_, request, writer, readers)) in handoffs.iter().enumerate() {
        assert_eq!(request.aligned_bytes(), Some(16 << 20));
        assert_eq!(*writer, RunnerId(i as u32));
        assert_eq!(readers, &vec![RunnerId(i as u32 + 1)]);
    }
    for strategy in [
        Policy::OverlapDepth(2).round_robin(),
        Policy::OverlapDepth(2).packed(),
    ] {
        let report = b.discovery.clone().plan(strategy).unwrap().report();
        // Two runners' bytes (an MLP and an attention module: 512 + 64 MiB
        // of wgrads and shards, 2 x 32 MiB of workspaces) and three input
        // gradients live at once: while module m + 1 still reads module
        // m's gradient, module m + 2 writes its own.
        assert_eq!(report.lower_bound, (576 + 64 + 3 * 16) << 20);
        assert_eq!(report.plan_bytes, report.lower_bound, "{strategy:?}");
    }
}

#[test]
fn gpt_whole_layer_and_per_module_request_the_same_bytes() {
    let all = bundled();
    let total =
        |d: &Discovering| -> u64 { all_requests(d).map(|q| q.aligned_bytes().unwrap()).sum() };
    let whole = by_name(&all, "gpt3-175b-whole-layer");
    let per_module = by_name(&all, "gpt3-175b-per-module");
    assert_eq!(total(&whole.discovery), total(&per_module.discovery));
    assert_eq!(
        per_module.workload.runners.len(),
        2 * whole.workload.runners.len()
    );
    assert_eq!(whole.workload.module_kinds, Some(1));
    assert_eq!(per_module.workload.module_kinds, Some(2));
}

/// `layer12.mlp.bwd` -> `layer#.mlp.bwd`.
fn mask_digits(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for c in name.chars() {
        if !c.is_ascii_digit() {
            out.push(c);
        } else if !out.ends_with('#') {
            out.push('#');
        }
    }
    out
}

#[test]
fn moe_workload_has_period_three_and_two_groups() {
    let all = bundled();
    let b = by_name(&all, "mixtral-8x7b-per-module");
    let groups: Vec<&str> = b.discovery.config().groups().map(|(_, n)| n).collect();
    assert_eq!(groups, vec!["expert-gtp", "gtp"]);
    let names: Vec<&str> = b
        .discovery
        .runners()
        .map(|r| b.discovery.runner_name(r).unwrap())
        .collect();
    let kinds: Vec<String> = names.iter().map(|n| mask_digits(n)).collect();
    for (i, k) in kinds.iter().enumerate().skip(3) {
        assert_eq!(k, &kinds[i - 3]);
    }
    assert_eq!(kinds.iter().collect::<BTreeSet<_>>().len(), 3);
    // Expert wgrads go to the expert group only.
    for (r, name) in b.discovery.runners().zip(&names) {
        if name.contains("experts") {
            for q in b.discovery.requests(r).unwrap() {
                if q.purpose == Purpose::WgradRsInput {
                    assert_eq!(q.domain, Domain::Symmetric(GroupId(0)), "{name}");
                }
            }
        }
    }
}

#[test]
fn mtp_workload_repeats_a_param_in_one_runner() {
    let all = bundled();
    let d = &by_name(&all, "deepseek-v3-mtp").discovery;
    let first = d.requests(d.runners().next().unwrap()).unwrap();
    let wgrads: Vec<ParamId> = first
        .iter()
        .filter(|q| q.purpose == Purpose::WgradRsInput)
        .filter_map(|q| q.param)
        .collect();
    let distinct: HashSet<ParamId> = wgrads.iter().copied().collect();
    assert!(distinct.len() < wgrads.len(), "no repeated wgrad param");
}

/// The policies the explorer compares: G = 1, 2, 3 and the module-kinds rule.
fn compared(w: &Workload) -> [Policy; 4] {
    [
        Policy::Generations(1),
        Policy::Generations(2),
        Policy::Generations(3),
        Policy::ModuleKinds(w.module_kinds.unwrap()),
    ]
}

#[test]
fn packed_is_within_five_percent_of_the_lower_bound_or_proved_optimal_where_that_is_unreachable() {
    for b in bundled() {
        for policy in compared(&b.workload) {
            let report = b.discovery.clone().plan(policy).unwrap().report();
            let stem = &b.stem;
            for k in &report.keys {
                if k.packed_bytes == k.lower_bound {
                    assert_eq!(k.optimum, Optimum::LowerBound, "{stem} {policy} {}", k.name);
                    continue;
                }
                // Where the lower bound is not reached (G = 3 over runners
                // alternating between capacities 2a and a), the report's
                // exhaustive search proves that no layout needs less.
                assert!(
                    matches!(k.optimum, Optimum::Proved { .. }),
                    "{stem} {policy} {}: {:?}",
                    k.name,
                    k.optimum
                );
                assert_eq!(k.best_bound, k.packed_bytes, "{stem} {policy} {}", k.name);
            }
            if report.packed_over_lower_bound() > 1.05 {
                assert_eq!(report.best_bound, report.packed_bytes, "{stem} {policy}");
            }
        }
    }
}

#[test]
fn bundled_plans_keep_lower_bound_le_packed_le_round_robin() {
    for b in bundled() {
        for policy in compared(&b.workload) {
            let stem = &b.stem;
            let round_robin = b.discovery.clone().plan(policy).unwrap();
            let packed = b.discovery.clone().plan(policy.packed()).unwrap();
            let report = round_robin.report();
            assert!(report.lower_bound <= report.packed_bytes, "{stem} {policy}");
            assert!(
                report.packed_bytes <= report.round_robin_bytes,
                "{stem} {policy}"
            );
            // The report's figures are what each placement allocates.
            assert_eq!(report.packed_bytes, packed.total_bytes(), "{stem} {policy}");
            assert_eq!(
                report.round_robin_bytes,
                round_robin.total_bytes(),
                "{stem} {policy}"
            );
        }
    }
}

#[test]
fn saving_refuses_what_loading_would_refuse_with_the_same_error() {
    use replay_arena::{Discovering, PlanConfig, RunnerId};
    let empty = Discovering::new(PlanConfig::new());
    let saved = Workload::from_discovering("empty", &empty).unwrap_err();
    let one = Discovering::from_runners(PlanConfig::new(), [(RunnerId(0), Vec::new())]).unwrap();
    let mut loaded = Workload::from_discovering("one", &one).unwrap();
    loaded.runners.clear();
    assert_eq!(
        saved.to_string(),
        loaded.to_discovering().unwrap_err().to_string()
    );
    assert_eq!(saved.to_string(), loaded.to_json().unwrap_err().to_string());
    let unnamed = Workload::from_discovering("", &one).unwrap_err();
    let mut named = Workload::from_discovering("x", &one).unwrap();
    named.name.clear();
    assert_eq!(
        unnamed.to_string(),
        named.to_discovering().unwrap_err().to_string()
    );
    // What saves, loads.
    let ok = Workload::from_discovering("one", &one).unwrap();
    Workload::from_json_str(&ok.to_json().unwrap())
        .unwrap()
        .to_discovering()
        .unwrap();
}

#[test]
fn handoffs_are_saved_and_loaded_with_their_readers() {
    let grad = Request::new(Domain::Device, DType::BF16, 4096);
    let mut d = Discovering::new(PlanConfig::new());
    let h0 = d.arm(RunnerId(0)).unwrap().hand_off(grad).unwrap();
    {
        let mut armed = d.arm(RunnerId(1)).unwrap();
        armed
            .record(Request::new(Domain::Device, DType::F32, 8))
            .unwrap();
        armed.receive(h0).unwrap();
        armed.hand_off(grad).unwrap();
    }
    {
        let mut armed = d.arm(RunnerId(2)).unwrap();
        armed.receive(h0).unwrap();
        armed.receive(replay_arena::HandoffId(1)).unwrap();
    }
    let text = Workload::from_discovering("handoffs", &d)
        .unwrap()
        .to_json()
        .unwrap();
    assert!(text.contains("\"receive\": [0,1]"), "{text}");
    let back = Workload::from_json_str(&text)
        .unwrap()
        .to_discovering()
        .unwrap();
    assert_eq!(back, d);
    // A receive of a handoff never declared is refused with its path.
    let bad = text.replace("\"receive\": [0,1]", "\"receive\": [0,5]");
    let e = error_of(&bad);
    assert!(e.contains("runners[2].receive[1]"), "{e}");
}

// ---- each cause prints once ---------------------------------------------------

/// Asserts that no message in `err`'s `source()` chain repeats a cause
/// printed after it (as `anyhow`'s `{:#}` would show it twice).
#[track_caller]
fn assert_each_cause_once(err: &(dyn std::error::Error + 'static)) {
    let mut messages = vec![err.to_string()];
    let mut next = err.source();
    while let Some(e) = next {
        messages.push(e.to_string());
        next = e.source();
    }
    for (i, m) in messages.iter().enumerate() {
        for later in &messages[i + 1..] {
            assert!(!m.contains(later.as_str()), "{m:?} repeats {later:?}");
        }
    }
}

#[test]
fn workload_errors_print_each_cause_once() {
    let refused = Workload::from_json_str(&tiny_with("\"elements\": 100", "\"elements\": 0"))
        .and_then(|w| w.to_discovering())
        .unwrap_err();
    assert!(refused.to_string().contains("at least 1"), "{refused}");
    assert_each_cause_once(&refused);

    struct Broken;
    impl std::io::Read for Broken {
        fn read(&mut self, _: &mut [u8]) -> std::io::Result<usize> {
            Err(std::io::Error::other("the disk is gone"))
        }
    }
    let unread = Workload::from_reader(Broken).unwrap_err();
    assert!(unread.to_string().contains("the disk is gone"), "{unread}");
    assert_each_cause_once(&unread);
}

/// A config with each of `groups` (id, name) registered, in order.
fn with_groups(groups: &[(u32, &str)]) -> PlanConfig {
    groups
        .iter()
        .fold(PlanConfig::new(), |config, &(id, name)| {
            config.with_group(GroupId(id), name).unwrap()
        })
}

/// Every dtype and purpose, on the device and in two groups (ids 0 and 3),
/// one request per runner.
fn every_name() -> Discovering {
    let mut d = Discovering::new(with_groups(&[(0, "gtp"), (3, "expert-gtp")]));
    for (i, &dtype) in DType::ALL.iter().enumerate() {
        let domain = match i % 3 {
            0 => Domain::Device,
            1 => Domain::Symmetric(GroupId(0)),
            _ => Domain::Symmetric(GroupId(3)),
        };
        let purpose = Purpose::ALL[i % Purpose::ALL.len()];
        d.arm(RunnerId(i as u32))
            .unwrap()
            .record(Request::new(domain, dtype, 64).purpose(purpose))
            .unwrap();
    }
    d
}

#[test]
fn the_vocabulary_serializes_with_the_names_workload_files_use() {
    let d = every_name();
    let saved: serde_json::Value = serde_json::from_str(
        &Workload::from_discovering("all", &d)
            .unwrap()
            .to_json()
            .unwrap(),
    )
    .unwrap();
    for (i, runner) in saved["runners"].as_array().unwrap().iter().enumerate() {
        let recorded = d.requests(RunnerId(i as u32)).unwrap()[0];
        let request = serde_json::to_value(recorded).unwrap();
        let spec = &runner["requests"][0];
        assert_eq!(request["dtype"], recorded.dtype.name());
        assert_eq!(spec["dtype"], request["dtype"]);
        assert_eq!(request["purpose"], recorded.purpose.name());
        let other = serde_json::json!("other");
        assert_eq!(spec.get("purpose").unwrap_or(&other), &request["purpose"]);
        match recorded.domain {
            Domain::Device => {
                assert_eq!(request["domain"], "device");
                assert_eq!(spec["domain"], request["domain"]);
            }
            Domain::Symmetric(group) => {
                assert_eq!(request["domain"], serde_json::json!({"symmetric": group.0}));
                let name = d.config().group_name(group).unwrap();
                assert_eq!(spec["domain"], serde_json::json!({ "symmetric": name }));
            }
        }
        let back: Request = serde_json::from_value(request).unwrap();
        assert_eq!(back, recorded);
    }
}

#[test]
fn report_json_round_trips_through_the_workload_names() {
    let d = every_name();
    let report = d
        .clone()
        .plan(Policy::Generations(2).packed())
        .unwrap()
        .report();
    let json = serde_json::to_value(&report).unwrap();
    assert_eq!(
        json["placed_policy"],
        serde_json::json!({"policy": "generations(2)", "placement": "packed"})
    );
    assert_eq!(json["fingerprint"], format!("{:016x}", report.fingerprint));
    // A workload file whose requests take their dtype and domain from the
    // report's JSON as they are, the group ids turned into their names.
    let group_name = |id: &serde_json::Value| {
        let id = GroupId(u32::try_from(id.as_u64().unwrap()).unwrap());
        d.config().group_name(id).unwrap().to_string()
    };
    let requests: Vec<serde_json::Value> = json["keys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| {
            let domain = match &k["key"]["domain"] {
                serde_json::Value::Object(o) => {
                    serde_json::json!({ "symmetric": group_name(&o["symmetric"]) })
                }
                device => device.clone(),
            };
            serde_json::json!({"domain": domain, "dtype": k["key"]["dtype"], "elements": 64})
        })
        .collect();
    let groups: Vec<serde_json::Value> = d
        .config()
        .groups()
        .map(|(id, name)| serde_json::json!({"id": id.0, "name": name}))
        .collect();
    let file = serde_json::json!({
        "name": "from-report",
        "groups": groups,
        "runners": [{"requests": requests}],
    });
    let again = load(&file.to_string())
        .plan(Policy::Generations(1))
        .unwrap()
        .report();
    let keys = |r: &replay_arena::PlanReport| -> Vec<(Key, String)> {
        r.keys.iter().map(|k| (k.key, k.name.clone())).collect()
    };
    assert_eq!(keys(&again), keys(&report));
    // And the report's JSON reads back into the same report.
    let back: replay_arena::PlanReport = serde_json::from_value(json).unwrap();
    assert_eq!(back, report);
}

#[test]
fn policies_and_placements_serialize_as_they_display() {
    for policy in [
        Policy::Generations(2),
        Policy::ModuleKinds(3),
        Policy::OverlapDepth(4),
    ] {
        let json = serde_json::to_value(policy).unwrap();
        assert_eq!(json, policy.to_string());
        assert_eq!(Policy::from_name(&policy.to_string()), Some(policy));
        assert_eq!(serde_json::from_value::<Policy>(json).unwrap(), policy);
    }
    for placement in replay_arena::Placement::ALL {
        let json = serde_json::to_value(placement).unwrap();
        assert_eq!(json, placement.to_string());
        assert_eq!(
            serde_json::from_value::<replay_arena::Placement>(json).unwrap(),
            placement
        );
    }
    let e = serde_json::from_str::<Policy>(r#""generations(two)""#).unwrap_err();
    assert!(
        e.to_string().starts_with(
            "unknown policy \"generations(two)\" (expected one of: generations(N), \
             module_kinds(N), overlap_depth(N))"
        ),
        "{e}"
    );
}

/// Shape buckets survive the file: the bucket list, each runner's bucket
/// by name, and the plan made from the loaded discovery.
#[test]
fn buckets_round_trip_through_the_file_and_plan_alike() {
    let q = |n| Request::new(Domain::Device, DType::F32, n);
    let mut d = Discovering::new(PlanConfig::new());
    for (b, n) in [(0u32, 64u64), (1, 256), (2, 1024)] {
        d.bucket(format!("bs={n}")).unwrap();
        d.arm(RunnerId(2 * b)).unwrap().record(q(n)).unwrap();
        let mut armed = d.arm(RunnerId(2 * b + 1)).unwrap();
        armed.record(q(2 * n)).unwrap();
        armed.record(q(n).purpose(Purpose::Input)).unwrap();
    }
    let w = Workload::from_discovering("decode", &d).unwrap();
    let text = w.to_json().unwrap();
    assert!(text.contains("\"buckets\""), "{text}");
    assert!(text.contains("\"bucket\":\"bs=256\"") || text.contains("\"bucket\": \"bs=256\""));
    assert!(text.contains("\"input\""));
    let loaded = Workload::from_json_str(&text)
        .unwrap()
        .to_discovering()
        .unwrap();
    assert_eq!(loaded, d);
    let (a, b) = (
        d.clone().plan(Policy::Generations(2)).unwrap(),
        loaded.plan(Policy::Generations(2)).unwrap(),
    );
    assert_eq!(a.fingerprint(), b.fingerprint());
    assert_eq!(a.report().buckets.len(), 3);
    // The report's buckets are in its JSON too.
    let json = serde_json::to_string(&a.report()).unwrap();
    assert!(json.contains("\"separate_bytes\""));
    // A workload without buckets writes none.
    let plain = Discovering::from_runners(PlanConfig::new(), [(RunnerId(0), [q(8)])]).unwrap();
    let text = Workload::from_discovering("plain", &plain)
        .unwrap()
        .to_json()
        .unwrap();
    assert!(!text.contains("bucket"), "{text}");
}

#[test]
fn a_runner_naming_an_unlisted_bucket_is_an_error_at_its_path() {
    let run = |buckets: &str, bucket: &str| {
        let text = format!(
            r#"{{"name": "w", {buckets} "runners": [{{"requests": []}}, {{{bucket} "requests": []}}]}}"#
        );
        Workload::from_json_str(&text).unwrap().to_discovering()
    };
    let err = run(r#""buckets": ["a"],"#, r#""bucket": "b","#).unwrap_err();
    assert!(err.to_string().contains("runners[0]"), "{err}");
    let err = run(r#""buckets": ["a", "b"],"#, r#""bucket": "c","#).unwrap_err();
    assert!(err.to_string().contains("runners[0]"), "{err}");
    let err = run("", r#""bucket": "a","#).unwrap_err();
    assert!(err.to_string().contains("runners[1].bucket"), "{err}");
    let err = run(r#""buckets": ["a", "a"],"#, "").unwrap_err();
    assert!(err.to_string().contains("buckets[1]"), "{err}");
}
