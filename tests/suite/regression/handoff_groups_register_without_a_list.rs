//! A workload file without a `groups` list registers every group its
//! requests name on first appearance; a group that only a `hand_off` names
//! (a handoff in symmetric memory no plain request uses) is registered too,
//! in the order discovery records it, instead of being refused as an
//! unknown group.

use replay_arena::{Domain, GroupId, RunnerId, Workload};

#[test]
fn a_group_only_a_handoff_names_is_registered() {
    let text = r#"{"name": "handoff-group", "runners": [
        {"name": "fc2.bwd", "requests": [
            {"domain": {"symmetric": "gtp"}, "dtype": "bf16", "elements": 64}],
         "hand_off": [{"domain": {"symmetric": "handoff-tp"}, "dtype": "bf16", "elements": 4096}]},
        {"name": "fc1.bwd", "requests": [
            {"domain": {"symmetric": "late"}, "dtype": "f32", "elements": 8}],
         "receive": [0]}
    ]}"#;
    let discovery = Workload::from_json_str(text)
        .unwrap()
        .to_discovering()
        .unwrap_or_else(|e| panic!("{e}"));
    // Registered in recording order: runner 0's request, its handoff, then
    // runner 1's request.
    let groups: Vec<(GroupId, String)> = discovery
        .config()
        .groups()
        .map(|(id, name)| (id, name.to_string()))
        .collect();
    assert_eq!(
        groups,
        [
            (GroupId(0), "gtp".to_string()),
            (GroupId(1), "handoff-tp".to_string()),
            (GroupId(2), "late".to_string()),
        ]
    );
    let handoffs: Vec<_> = discovery.handoffs().collect();
    assert_eq!(handoffs.len(), 1);
    let (_, request, writer, readers) = &handoffs[0];
    assert_eq!(request.domain, Domain::Symmetric(GroupId(1)));
    assert_eq!(*writer, RunnerId(0));
    assert_eq!(readers.as_slice(), [RunnerId(1)]);
}

#[test]
fn an_empty_group_name_in_a_handoff_names_its_path() {
    let text = r#"{"name": "w", "runners": [
        {"requests": [], "hand_off": [{"domain": {"symmetric": ""}, "dtype": "bf16", "elements": 4}]},
        {"requests": [], "receive": [0]}
    ]}"#;
    let e = Workload::from_json_str(text)
        .unwrap()
        .to_discovering()
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "runners[0].hand_off[0].domain.symmetric: must not be empty"
    );
}
