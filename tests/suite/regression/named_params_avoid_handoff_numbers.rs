//! Parameter names get ids in order of first appearance, skipping every
//! number the file uses (docs/workload-format.md): the numbers a `hand_off`
//! gives count too, so a named parameter never takes a handoff's number.

use std::collections::HashSet;

use replay_arena::{ParamId, RunnerId, Workload};

#[test]
fn a_named_parameter_skips_the_numbers_handoffs_use() {
    let text = r#"{"name": "params", "runners": [
        {"name": "a", "requests": [{"domain": "device", "dtype": "f32", "elements": 8, "param": 2}],
         "hand_off": [
            {"domain": "device", "dtype": "bf16", "elements": 16, "param": 0},
            {"domain": "device", "dtype": "bf16", "elements": 16, "param": 1}]},
        {"name": "b", "requests": [
            {"domain": "device", "dtype": "f32", "elements": 8, "param": "w"},
            {"domain": "device", "dtype": "f32", "elements": 8, "param": "v"}],
         "receive": [0, 1]}
    ]}"#;
    let discovery = Workload::from_json_str(text)
        .unwrap()
        .to_discovering()
        .unwrap_or_else(|e| panic!("{e}"));
    let named: Vec<ParamId> = discovery
        .requests(RunnerId(1))
        .unwrap()
        .iter()
        .map(|q| q.param.unwrap())
        .collect();
    // 0 and 1 are the handoffs', 2 the request's: the names get 3 and 4.
    assert_eq!(named, [ParamId(3), ParamId(4)]);
    let numbered: HashSet<ParamId> = discovery
        .handoffs()
        .map(|(_, q, _, _)| q.param.unwrap())
        .chain(
            discovery
                .requests(RunnerId(0))
                .unwrap()
                .iter()
                .map(|q| q.param.unwrap()),
        )
        .collect();
    assert!(named.iter().all(|p| !numbered.contains(p)), "{named:?}");
}
