//! Every crate's `//!` doc describes what is there now: a doc that still says "not here yet",
//! "so far" or "will own" is a plan that went stale (issue 13 found three).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;

#[test]
fn crate_docs_describe_the_present() {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let mut checked = 0;
    let mut stale = Vec::new();
    for entry in std::fs::read_dir(workspace).unwrap().flatten() {
        for root in ["src/lib.rs", "src/main.rs"] {
            let path = entry.path().join(root);
            let Ok(text) = std::fs::read_to_string(&path) else { continue };
            checked += 1;
            let doc: String = text.lines().filter(|l| l.starts_with("//!")).collect::<Vec<_>>().join("\n");
            for phrase in ["not here yet", "so far", "will own"] {
                if doc.to_lowercase().contains(phrase) {
                    stale.push(format!("{}: {phrase:?}", path.display()));
                }
            }
        }
    }
    assert!(checked >= 8, "found only {checked} crate roots under {}", workspace.display());
    assert!(stale.is_empty(), "crate docs describing plans instead of the code: {stale:?}");
}
