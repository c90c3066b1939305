//! Every hostile sweep file up to the server's 4 MiB body limit is refused while it is read,
//! before anything is built (issue 10, item 3: 100,000 levels of `[` took 83 s before).
//! Bounds are generous (1 s optimised, 8 s in the unoptimised test build); the release figures
//! (under 0.1 s each) come from `app-bench search --hostile` and are in
//! docs/decisions/0025-one-bounded-streaming-yaml-pass.md.

use std::time::{Duration, Instant};

use shared::sweep::{ExpandOptions, Sweep, SweepError};

const BODY_LIMIT: usize = 4 << 20;

fn bound() -> Duration {
    Duration::from_secs(if cfg!(debug_assertions) { 8 } else { 1 })
}

/// Parses `text` and returns the refusal's message, checking the time.
fn refused(label: &str, text: &str) -> String {
    assert!(text.len() <= BODY_LIMIT, "{label}: {} bytes", text.len());
    let started = Instant::now();
    let result = Sweep::parse(text, &ExpandOptions::default());
    let elapsed = started.elapsed();
    eprintln!("{label}: {} bytes refused in {elapsed:?}", text.len());
    assert!(elapsed < bound(), "{label}: took {elapsed:?}");
    match result {
        Err(error @ (SweepError::Invalid { .. } | SweepError::Syntax { .. })) => error.to_string(),
        Err(other) => panic!("{label}: unexpected {other:?}"),
        Ok(sweep) => panic!("{label}: accepted with {} jobs", sweep.count()),
    }
}

#[test]
fn deep_flow_nesting_is_refused_while_scanning() {
    for (open, close) in [("[", "]"), ("{a: ", "}")] {
        let levels = 100_000;
        let text = format!("a: {}1{}", open.repeat(levels), close.repeat(levels));
        let message = refused(&format!("{levels} levels of {open}"), &text);
        assert!(message.contains("nested more than 64 levels deep"), "{message}");
        // Up to the body limit.
        let levels = (BODY_LIMIT - 8) / (open.len() + close.len());
        let text = format!("a: {}1{}", open.repeat(levels), close.repeat(levels));
        assert!(refused(&format!("{levels} levels of {open}"), &text).contains("levels deep"));
    }
}

#[test]
fn deep_block_nesting_is_refused() {
    let text = format!("a:\n{}x\n", "- ".repeat(100_000));
    assert!(refused("100000 levels of block -", &text).contains("levels deep"));
    let text: String = (0..2_800).map(|depth| format!("{}k:\n", " ".repeat(depth))).collect();
    assert!(refused("2800 levels of indentation", &text).contains("levels deep"));
}

#[test]
fn long_sequences_are_refused_by_the_node_budget() {
    let flow = format!("a: [{}]\n", vec!["1"; BODY_LIMIT / 2 - 8].join(","));
    assert!(refused("flow sequence of 2M items", &flow).contains("200000 YAML nodes"));
    let block = format!("a:\n{}", "- 1\n".repeat(BODY_LIMIT / 4 - 8));
    assert!(refused("block sequence of 1M items", &block).contains("200000 YAML nodes"));
}

#[test]
fn alias_bombs_are_refused() {
    let zeros = vec!["0"; 6000].join(",");
    let aliases = vec!["*a"; (BODY_LIMIT - zeros.len()) / 3 - 16].join(",");
    let text = format!("command: run\nx: &a [{zeros}]\ny: [{aliases}]\n");
    assert!(refused("alias fan-out to the body limit", &text).contains("YAML nodes"));
    let mut laughs = String::from("a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n");
    for level in b'b'..=b'i' {
        let items = vec![format!("*{}", (level - 1) as char); 9].join(", ");
        laughs.push_str(&format!("{0}: &{0} [{items}]\n", level as char));
    }
    assert!(refused("billion laughs", &laughs).contains("YAML nodes"));
}
