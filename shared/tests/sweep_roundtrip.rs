//! The loader reads what serde_norway reads, and the config writer writes what both read back:
//! a CVLab config without lists is one job whose resolved config is the file's own document.

use proptest::prelude::*;
use serde_norway::Value;
use shared::sweep::{ExpandOptions, Sweep};

fn scalar() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<i64>().prop_map(|n| n.to_string()),
        any::<f64>().prop_filter("finite", |f| f.is_finite()).prop_map(|f| format!("{f:e}")),
        "[a-zA-Z_][a-zA-Z0-9_ ./-]{0,12}".prop_map(|text| format!("{text:?}")),
        Just("true".to_owned()),
        Just("null".to_owned()),
        Just("yes".to_owned()),
        Just("'007'".to_owned()),
        Just("0x1F".to_owned()),
        Just("!!python/tuple [0.9, 0.999]".to_owned()),
    ]
}

fn document() -> impl Strategy<Value = String> {
    let leaf = scalar();
    let nested = proptest::collection::btree_map("[a-z]{1,6}", scalar(), 1..4).prop_map(|entries| {
        format!("{{{}}}", entries.iter().map(|(k, v)| format!("{k}: {v}")).collect::<Vec<_>>().join(", "))
    });
    proptest::collection::vec(("[a-z]{1,8}", prop_oneof![leaf, nested]), 1..8).prop_map(|entries| {
        let mut seen = std::collections::HashSet::new();
        entries
            .into_iter()
            .filter(|(key, _)| seen.insert(key.clone()) && key != "device")
            .map(|(key, value)| format!("{key}: {value}\n"))
            .collect()
    })
}

proptest! {
    #[test]
    fn configs_read_back_as_their_source(text in document()) {
        let expected: Value = serde_norway::from_str(&text).unwrap();
        let sweep = Sweep::parse(&text, &ExpandOptions::default()).unwrap();
        prop_assert_eq!(sweep.count(), 1);
        let config = sweep.job(0).unwrap().config.unwrap();
        let written: Value = serde_norway::from_str(&config).unwrap();
        // serde_norway drops `!!` tags on reading; compare what it reads of both.
        prop_assert_eq!(written, expected, "{}\n---\n{}", text, config);
    }
}
