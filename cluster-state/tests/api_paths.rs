//! Nimbus's API paths are spelled in one place, `cluster-state/src/api`: every other crate builds
//! them with `Route::path` (and tests of hostile paths from `API_PREFIX`), so a route cannot
//! drift between nimbus, its clients and their tests (issue 13).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};

use cluster_state::api::API_PREFIX;

/// Lines outside `cluster-state/src` that may spell the prefix, each with its reason: the same
/// prefix belongs to other HTTP APIs too.
const ALLOWED: &[(&str, &str, &str)] = &[(
    "tests/harness/src/prometheus.rs",
    "pub const PROMETHEUS_API: &str =",
    "Prometheus's own HTTP API, which tests query",
)];

/// Every `*.rs` file below `dir`, skipping build output and hidden directories.
fn rust_files(dir: &Path, found: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        if path.is_dir() {
            if name != "target" && !name.starts_with('.') {
                rust_files(&path, found);
            }
        } else if name.ends_with(".rs") {
            found.push(path);
        }
    }
}

#[test]
fn no_crate_but_cluster_state_spells_an_api_path() {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let mut files = Vec::new();
    rust_files(workspace, &mut files);
    let mut checked = 0;
    let mut spelled = Vec::new();
    for path in files {
        let relative = path.strip_prefix(workspace).unwrap().to_string_lossy().replace('\\', "/");
        if relative.starts_with("cluster-state/src/") {
            continue;
        }
        checked += 1;
        let text = std::fs::read_to_string(&path).unwrap();
        for (number, line) in text.lines().enumerate() {
            let code = line.trim_start();
            // Docs may name a route; code may not spell one.
            if code.starts_with("//") || !code.contains(API_PREFIX) {
                continue;
            }
            let allowed = ALLOWED.iter().any(|(file, start, _)| relative == *file && code.starts_with(start));
            if !allowed {
                spelled.push(format!("{relative}:{}: {}", number + 1, code));
            }
        }
    }
    assert!(checked >= 100, "found only {checked} Rust files under {}", workspace.display());
    assert!(
        spelled.is_empty(),
        "API paths spelled outside cluster-state/src (use Route::path, or API_PREFIX for a path no \
         route makes):\n{}",
        spelled.join("\n")
    );
}
