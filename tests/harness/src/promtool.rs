//! `promtool check metrics` on a `/metrics` page, the one way tests lint exposition text.

use std::io::Write;
use std::process::{Command, Stdio};

/// Families whose names break promtool's naming lint on purpose: they are kafka_exporter's
/// (`kafka_consumergroup_lag_sum`) and Burrow's (`burrow_kafka_consumer_lag_total`, a gauge)
/// names, kept unchanged so existing dashboards and alerts work (nimbus's lag evaluator).
pub const FOREIGN_NAMES: &[&str] = &["kafka_consumergroup_lag_sum", "burrow_kafka_consumer_lag_total"];

/// Runs `promtool check metrics` on `page`; `Err` carries every problem it reports except the
/// naming lint on [`FOREIGN_NAMES`].
pub fn check_metrics(page: &str) -> Result<(), String> {
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run promtool: {e}"))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin.write_all(page.as_bytes()).map_err(|e| format!("cannot write to promtool: {e}"))?;
    }
    let out = child.wait_with_output().map_err(|e| format!("promtool: {e}"))?;
    if out.status.success() {
        return Ok(());
    }
    let report = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    let problems: Vec<&str> = report
        .lines()
        .filter(|line| !line.trim().is_empty())
        .filter(|line| !FOREIGN_NAMES.iter().any(|name| line.starts_with(&format!("{name} "))))
        .collect();
    if problems.is_empty() { Ok(()) } else { Err(problems.join("\n")) }
}
