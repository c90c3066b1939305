//! Unit tests of the log append plan and UTF-8 cuts.

use super::*;

const CAP: u64 = 100;

fn length(received: u64, stored: u64, truncated: bool) -> LogLength {
    LogLength { received, stored, truncated }
}

#[test]
fn an_append_at_the_end_is_stored_whole() {
    let plan = plan_append(length(10, 10, false), 10, &[b'x'; 5], CAP).unwrap();
    assert_eq!(plan, AppendPlan { keep: 0..5, marker: None, after: length(15, 15, false) });
}

#[test]
fn a_retried_append_stores_only_what_is_new() {
    let plan = plan_append(length(10, 10, false), 6, &[b'x'; 8], CAP).unwrap();
    assert_eq!((plan.keep, plan.after), (4..8, length(14, 14, false)));
    let duplicate = plan_append(length(10, 10, false), 2, &[b'x'; 8], CAP).unwrap();
    assert_eq!((duplicate.keep.len(), duplicate.after), (0, length(10, 10, false)));
}

#[test]
fn a_gap_is_refused_with_where_to_resume() {
    let gap = plan_append(length(10, 10, false), 12, b"x", CAP).unwrap_err();
    assert!(gap.contains("resend from byte 10"), "{gap}");
}

#[test]
fn bytes_past_the_cap_are_dropped_behind_one_marker_and_still_acked() {
    let plan = plan_append(length(90, 90, false), 90, &[b'x'; 30], CAP).unwrap();
    let marker = plan.marker.clone().unwrap();
    assert_eq!(marker, "\n[app: log truncated at 100 bytes]\n");
    assert_eq!(plan.keep, 0..10);
    assert_eq!(plan.after, length(120, 100 + marker.len() as u64, true));
    let later = plan_append(plan.after, 120, &[b'x'; 50], CAP).unwrap();
    assert_eq!((later.keep.len(), later.marker, later.after.received), (0, None, 170));
    // A kept part that ends a line needs no extra newline before the marker.
    let lines = plan_append(length(90, 90, false), 90, b"123456789\nmore", CAP).unwrap();
    assert_eq!(lines.marker.as_deref(), Some("[app: log truncated at 100 bytes]\n"));
}

#[test]
fn a_character_cut_at_the_end_waits_for_its_other_bytes() {
    let text = "añ€😀".as_bytes();
    assert_eq!(complete_utf8_len(text), text.len());
    for cut in 1..text.len() {
        let kept = complete_utf8_len(&text[..cut]);
        assert!(std::str::from_utf8(&text[..kept]).is_ok(), "cut at {cut} kept {kept}");
        assert!(cut - kept < 4);
    }
}
