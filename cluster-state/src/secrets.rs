//! Secrets in topology files, and keeping them out of everything Squall shows.
//!
//! A topology's params may hold credentials (a Kafka spout's `librdkafka: {sasl.password: ..}`).
//! A param is a secret when its key ends in `password`, `secret` or `token` (any case: Kafka's
//! `sasl.password`, `ssl.key.password`, an `api_token`), or when the topology's
//! `config: {topology.secret.keys: [..]}` lists it. [`Redactor::from_flux`] collects the values
//! of those params; [`Redactor::redact`] replaces every occurrence of one in a text by
//! [`REDACTED`].
//!
//! Where it applies: the topology file itself is only served to holders of nimbus's token; every
//! other text that can carry a param's value (API error answers, errors reported to ZooKeeper
//! and shown by `squall errors`, log lines) goes through the process's known secrets
//! ([`remember`], [`redact_known`], [`RedactingWriter`] for the log). The set is process-wide on
//! purpose: the log subscriber is process-wide, and a value redacted in a text that did not need
//! it costs nothing.
//!
//! Values shorter than [`MIN_SECRET_CHARS`] are not redacted: they would blank every occurrence
//! of a common short string in every log line, and are no secret worth the name (SECURITY.md).

use std::borrow::Cow;
use std::collections::BTreeSet;
use std::io;
use std::sync::{PoisonError, RwLock};

use serde_yaml_ng::Value;

/// What a redacted value is replaced by.
pub const REDACTED: &str = "<redacted>";
/// The topology config key listing further secret param keys (exact key names).
pub const SECRET_KEYS_KEY: &str = "topology.secret.keys";
/// Key endings that make a param a secret (compared case-insensitively).
pub const SECRET_KEY_SUFFIXES: [&str; 3] = ["password", "secret", "token"];
/// Shorter values are not redacted (see the module docs).
pub const MIN_SECRET_CHARS: usize = 4;

/// Whether a param named `key` holds a secret, given the topology's `topology.secret.keys`.
pub fn is_secret_key(key: &str, listed: &[String]) -> bool {
    let lower = key.to_ascii_lowercase();
    SECRET_KEY_SUFFIXES.iter().any(|suffix| lower.ends_with(suffix)) || listed.iter().any(|k| k == key)
}

/// A set of secret values to hide. `Debug` shows how many, never one.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Redactor {
    /// Longest first, so a value containing another is hidden whole.
    values: Vec<String>,
}

impl std::fmt::Debug for Redactor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Redactor").field("values", &self.values.len()).finish()
    }
}

impl Redactor {
    /// The secret values of a Flux topology file (see the module docs). A file that is not
    /// YAML is still scanned line by line for `key: value` pairs, so a submit refused for its
    /// syntax does not echo a secret either.
    pub fn from_flux(text: &str) -> Redactor {
        let mut found = BTreeSet::new();
        let mut listed = Vec::new();
        if let Ok(root) = serde_yaml_ng::from_str::<Value>(text) {
            listed = listed_keys(&root);
            collect(&root, &listed, false, &mut found);
        }
        scan_lines(text, &listed, &mut found);
        let mut redactor = Redactor::default();
        redactor.extend(found);
        redactor
    }

    /// Adds values (those too short to redact are skipped).
    pub fn extend(&mut self, values: impl IntoIterator<Item = String>) {
        let mut all: BTreeSet<String> = self.values.drain(..).collect();
        all.extend(values.into_iter().filter(|v| v.chars().count() >= MIN_SECRET_CHARS));
        self.values = all.into_iter().collect();
        self.values.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
    }

    /// Whether there is nothing to hide.
    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    /// `text` with every secret value replaced by [`REDACTED`].
    pub fn redact<'a>(&self, text: &'a str) -> Cow<'a, str> {
        if !self.values.iter().any(|v| text.contains(v.as_str())) {
            return Cow::Borrowed(text);
        }
        let mut out = text.to_owned();
        for value in &self.values {
            if out.contains(value.as_str()) {
                out = out.replace(value.as_str(), REDACTED);
            }
        }
        Cow::Owned(out)
    }
}

/// `topology.secret.keys` from the file's `config:` (a list of key names, or one name).
fn listed_keys(root: &Value) -> Vec<String> {
    match root.get("config").and_then(|c| c.get(SECRET_KEYS_KEY)) {
        Some(Value::Sequence(keys)) => keys.iter().filter_map(|k| k.as_str().map(str::to_owned)).collect(),
        Some(Value::String(key)) => vec![key.clone()],
        _ => Vec::new(),
    }
}

/// Every scalar under a secret key (or, with `secret`, under this value).
fn collect(value: &Value, listed: &[String], secret: bool, found: &mut BTreeSet<String>) {
    match value {
        Value::Mapping(map) => {
            for (key, value) in map {
                let key_is_secret =
                    key.as_str().is_some_and(|k| k != SECRET_KEYS_KEY && is_secret_key(k, listed));
                collect(value, listed, secret || key_is_secret, found);
            }
        }
        Value::Sequence(items) => items.iter().for_each(|item| collect(item, listed, secret, found)),
        Value::Tagged(tagged) => collect(&tagged.value, listed, secret, found),
        Value::String(s) if secret => {
            found.insert(s.clone());
        }
        Value::Number(n) if secret => {
            found.insert(n.to_string());
        }
        _ => {}
    }
}

/// `key: value` pairs in block or flow style, read without a YAML parser.
fn scan_lines(text: &str, listed: &[String], found: &mut BTreeSet<String>) {
    for line in text.lines() {
        for part in line.split(['{', '}', ',']) {
            let Some((key, value)) = part.split_once(':') else { continue };
            let key = key.trim().trim_start_matches('-').trim().trim_matches(['"', '\'']);
            let value = value.split(" #").next().unwrap_or_default().trim().trim_matches(['"', '\'']);
            if key != SECRET_KEYS_KEY && is_secret_key(key, listed) && !value.is_empty() {
                found.insert(value.to_owned());
            }
        }
    }
}

/// The secret values this process knows of (see the module docs).
static KNOWN: RwLock<Redactor> = RwLock::new(Redactor { values: Vec::new() });

/// Adds `redactor`'s values to the ones this process hides everywhere.
pub fn remember(redactor: &Redactor) {
    if redactor.is_empty() {
        return;
    }
    let mut known = KNOWN.write().unwrap_or_else(PoisonError::into_inner);
    known.extend(redactor.values.iter().cloned());
}

/// `text` without any secret value this process knows of.
pub fn redact_known(text: &str) -> Cow<'_, str> {
    let known = KNOWN.read().unwrap_or_else(PoisonError::into_inner);
    match known.redact(text) {
        Cow::Borrowed(_) => Cow::Borrowed(text),
        Cow::Owned(s) => Cow::Owned(s),
    }
}

/// A log writer that hides known secret values ([`redact_known`]) in what passes through it.
/// `tracing_subscriber`'s formatter writes each event in one call, so a value is never split
/// between two writes.
#[derive(Debug)]
pub struct RedactingWriter<W>(pub W);

impl<W: io::Write> io::Write for RedactingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match std::str::from_utf8(buf) {
            Ok(text) => match redact_known(text) {
                Cow::Borrowed(_) => self.0.write_all(buf)?,
                Cow::Owned(clean) => self.0.write_all(clean.as_bytes())?,
            },
            Err(_) => self.0.write_all(redact_known(&String::from_utf8_lossy(buf)).as_bytes())?,
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.0.flush()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    const FILE: &str = "name: t\nconfig:\n  topology.workers: 1\n  topology.secret.keys: [my.key]\n\
        spouts:\n  - id: k\n    className: kafka-spout\n    params:\n      librdkafka: {sasl.password: \"hunter2-pw\", sasl.username: alice}\n\
        \x20     my.key: custom-1234\n      api_token: 987654321\n      Ssl_Key_SECRET: ssl-s3cret\n      tok: ab\n\
        bolts: []\nstreams: []\n";

    #[test]
    fn keys_by_suffix_and_by_list() {
        for key in ["sasl.password", "ssl.key.password", "api_token", "client_SECRET", "Token"] {
            assert!(is_secret_key(key, &[]), "{key}");
        }
        for key in ["sasl.username", "tokens", "password_file", "my.key"] {
            assert!(!is_secret_key(key, &[]), "{key}");
        }
        assert!(is_secret_key("my.key", &["my.key".into()]));
    }

    #[test]
    fn values_of_secret_params_are_found_and_hidden() {
        let redactor = Redactor::from_flux(FILE);
        let text = "failed: hunter2-pw, custom-1234, 987654321, ssl-s3cret, alice, ab";
        assert_eq!(
            redactor.redact(text),
            "failed: <redacted>, <redacted>, <redacted>, <redacted>, alice, ab"
        );
        assert!(matches!(redactor.redact("nothing here"), Cow::Borrowed(_)));
        assert_eq!(format!("{redactor:?}"), "Redactor { values: 4 }");
    }

    #[test]
    fn a_file_that_is_not_yaml_is_scanned_by_line() {
        let broken = "spouts:\n  - id: k\n   params: {sasl.password: hunter2-pw\n  [";
        assert_eq!(Redactor::from_flux(broken).redact("x hunter2-pw"), "x <redacted>");
    }

    #[test]
    fn a_longer_value_containing_a_shorter_one_is_hidden_whole() {
        let mut redactor = Redactor::default();
        redactor.extend(["abcd".to_owned(), "abcdefgh".to_owned()]);
        assert_eq!(redactor.redact("abcdefgh abcd"), "<redacted> <redacted>");
    }

    #[test]
    fn the_log_writer_hides_remembered_values() {
        use std::io::Write;
        let mut redactor = Redactor::default();
        redactor.extend(["remembered-value-1".to_owned()]);
        remember(&redactor);
        let mut out = RedactingWriter(Vec::new());
        out.write_all(b"INFO config remembered-value-1 loaded\n").unwrap();
        assert_eq!(String::from_utf8(out.0).unwrap(), "INFO config <redacted> loaded\n");
    }
}
