//! Storm's multilang wire format (`docs/Multilang-protocol.md`): JSON messages, each followed
//! by a line `end`, over the subprocess's stdin and stdout.
//!
//! To the subprocess: the handshake (`conf`, `context`, `pidDir`), bolt tuples (`id`, `comp`,
//! `stream`, `task`, `tuple`; heartbeats are tuples on `__heartbeat` from task -1), spout
//! commands (`next`, `ack`, `fail`, `activate`, `deactivate`) and task-id lists (the answer to
//! an `emit` that did not say `"need_task_ids": false`). From it: `{"pid": N}` once, then
//! commands: `emit`, `ack`, `fail`, `sync`, `log`, `error`, `metrics`. Unknown fields are
//! ignored (implementations add their own), an unknown command is an error.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value as Json;

use crate::tuple::Value;

/// Storm's stream of heartbeat tuples to shell bolts.
pub const HEARTBEAT_STREAM: &str = "__heartbeat";
/// The task id Storm gives the system component (tick and heartbeat tuples).
pub const SYSTEM_TASK_ID: i64 = -1;

/// The first message to the subprocess.
#[derive(Debug, Serialize)]
pub(crate) struct Handshake<'a> {
    pub(crate) conf: &'a serde_json::Map<String, Json>,
    pub(crate) context: Context<'a>,
    #[serde(rename = "pidDir")]
    pub(crate) pid_dir: &'a str,
}

/// The task's place in the topology, with Storm's keys (pystorm reads `taskid`,
/// `componentid` and `task->component`).
#[derive(Debug, Serialize)]
pub(crate) struct Context<'a> {
    #[serde(rename = "task->component")]
    pub(crate) task_component: BTreeMap<String, &'a str>,
    pub(crate) taskid: u32,
    pub(crate) componentid: &'a str,
    /// The component's declared output streams.
    pub(crate) streams: Vec<&'a str>,
    #[serde(rename = "stream->outputfields")]
    pub(crate) stream_outputfields: BTreeMap<&'a str, &'a [String]>,
}

/// The subprocess's answer to the handshake.
#[derive(Debug, Deserialize)]
pub(crate) struct PidReply {
    pub(crate) pid: u32,
}

/// A tuple for a shell bolt.
#[derive(Debug, Serialize)]
pub(crate) struct BoltTuple<'a> {
    pub(crate) id: &'a str,
    pub(crate) comp: Option<&'a str>,
    pub(crate) stream: &'a str,
    pub(crate) task: i64,
    pub(crate) tuple: JsonValues<'a>,
}

/// A command for a shell spout.
#[derive(Debug, Serialize)]
pub(crate) struct SpoutCommand<'a> {
    pub(crate) command: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) id: Option<&'a Json>,
}

/// A message from the subprocess (after the handshake).
#[derive(Debug, Deserialize)]
#[serde(tag = "command", rename_all = "lowercase")]
pub(crate) enum ShellMsg {
    Emit(Emit),
    Ack {
        id: Json,
    },
    Fail {
        id: Json,
    },
    Sync,
    Log {
        #[serde(default)]
        msg: Json,
        #[serde(default)]
        level: Option<i64>,
    },
    Error {
        #[serde(default)]
        msg: Json,
    },
    Metrics {
        #[serde(default)]
        name: String,
        #[serde(default)]
        params: Json,
    },
}

/// An `emit` command.
#[derive(Debug, Deserialize)]
pub(crate) struct Emit {
    pub(crate) tuple: Vec<Json>,
    #[serde(default)]
    pub(crate) stream: Option<String>,
    /// Bolts: ids of the input tuples the new tuple is anchored to.
    #[serde(default)]
    pub(crate) anchors: Option<Vec<Json>>,
    /// Spouts: the message id (a reliable emit); absent or null for an unreliable one.
    #[serde(default)]
    pub(crate) id: Option<Json>,
    /// A direct emit's task (0 or absent: not direct, as in Storm).
    #[serde(default)]
    pub(crate) task: Option<i64>,
    /// Storm answers every emit with its task ids unless this is false.
    #[serde(default)]
    pub(crate) need_task_ids: Option<bool>,
}

impl Emit {
    pub(crate) fn wants_task_ids(&self) -> bool {
        self.need_task_ids.unwrap_or(true)
    }

    /// The direct task, if any.
    pub(crate) fn direct_task(&self) -> Result<Option<u32>, String> {
        match self.task {
            None | Some(0) => Ok(None),
            Some(t) => {
                u32::try_from(t).map(Some).map_err(|_| format!("emit to task {t}, which is no task id"))
            }
        }
    }
}

/// A message id or anchor as the subprocess sent it, as text: Storm's ids are strings, some
/// implementations send numbers.
pub(crate) fn id_text(id: &Json) -> Option<std::borrow::Cow<'_, str>> {
    match id {
        Json::String(s) => Some(std::borrow::Cow::Borrowed(s)),
        Json::Number(n) => Some(std::borrow::Cow::Owned(n.to_string())),
        _ => None,
    }
}

/// Tuple values written as a JSON array without building a `serde_json::Value`.
#[derive(Debug)]
pub(crate) struct JsonValues<'a>(pub(crate) &'a [Value]);

impl Serialize for JsonValues<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeSeq;
        let mut seq = s.serialize_seq(Some(self.0.len()))?;
        for v in self.0 {
            match v {
                Value::Null => seq.serialize_element(&())?,
                Value::Bool(b) => seq.serialize_element(b)?,
                Value::Int(i) => seq.serialize_element(i)?,
                Value::Float(f) => seq.serialize_element(f)?,
                Value::Str(t) => seq.serialize_element(t.as_str())?,
                // JSON has no bytes: UTF-8 (a Kafka message's text) goes as a string, anything
                // else as the list of byte values.
                Value::Bytes(b) => match std::str::from_utf8(b) {
                    Ok(text) => seq.serialize_element(text)?,
                    Err(_) => seq.serialize_element(&b[..])?,
                },
            }
        }
        seq.end()
    }
}

/// A JSON value from the subprocess as a tuple value. Lists and maps, which Squall's values do
/// not have, travel as their JSON text; integers beyond `i64` as floats.
pub(crate) fn value_of(json: Json) -> Value {
    match json {
        Json::Null => Value::Null,
        Json::Bool(b) => Value::Bool(b),
        Json::Number(n) => match n.as_i64() {
            Some(i) => Value::Int(i),
            None => Value::Float(n.as_f64().unwrap_or(f64::NAN)),
        },
        Json::String(s) => Value::from(s),
        other @ (Json::Array(_) | Json::Object(_)) => Value::from(other.to_string()),
    }
}

/// Appends `message` and Storm's `end` line to `out`.
pub(crate) fn frame(out: &mut Vec<u8>, message: &impl Serialize) -> Result<(), serde_json::Error> {
    serde_json::to_writer(&mut *out, message)?;
    out.extend_from_slice(b"\nend\n");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_parse_with_storm_defaults_and_unknown_fields() {
        let m: ShellMsg = serde_json::from_str(r#"{"command":"emit","tuple":["a",1],"extra":true}"#).unwrap();
        let ShellMsg::Emit(e) = m else { panic!("{m:?}") };
        assert!(e.wants_task_ids());
        assert_eq!(e.direct_task(), Ok(None));
        let m: ShellMsg = serde_json::from_str(
            r#"{"command":"emit","tuple":[],"anchors":["7"],"stream":"s","task":4,"need_task_ids":false}"#,
        )
        .unwrap();
        let ShellMsg::Emit(e) = m else { panic!("{m:?}") };
        assert!(!e.wants_task_ids());
        assert_eq!(e.direct_task(), Ok(Some(4)));
        assert!(matches!(serde_json::from_str(r#"{"command":"sync"}"#), Ok(ShellMsg::Sync)));
        assert!(matches!(serde_json::from_str(r#"{"command":"ack","id":"12"}"#), Ok(ShellMsg::Ack { .. })));
        assert!(serde_json::from_str::<ShellMsg>(r#"{"command":"launch"}"#).is_err());
        assert!(serde_json::from_str::<ShellMsg>(r#"{"pid":12}"#).is_err());
        assert!(serde_json::from_str::<ShellMsg>(r#"{"command":"emit"}"#).is_err());
    }

    #[test]
    fn values_round_trip_through_json() {
        let values = [
            Value::Null,
            Value::Bool(true),
            Value::Int(-3),
            Value::Float(1.5),
            Value::from("word"),
            Value::Bytes(bytes::Bytes::from_static(b"text")),
            Value::Bytes(bytes::Bytes::from_static(&[0xff, 0])),
        ];
        let text = serde_json::to_string(&JsonValues(&values)).unwrap();
        assert_eq!(text, r#"[null,true,-3,1.5,"word","text",[255,0]]"#);
        let back: Vec<Json> = serde_json::from_str(&text).unwrap();
        let back: Vec<Value> = back.into_iter().map(value_of).collect();
        assert_eq!(back[..5], values[..5]);
        assert_eq!(back[5], Value::from("text"));
        assert_eq!(back[6], Value::from("[255,0]"));
        assert_eq!(value_of(serde_json::json!({"a": 1})), Value::from(r#"{"a":1}"#));
    }

    #[test]
    fn frames_end_with_storms_end_line() {
        let mut out = Vec::new();
        frame(&mut out, &SpoutCommand { command: "next", id: None }).unwrap();
        assert_eq!(out, b"{\"command\":\"next\"}\nend\n");
        let id = Json::from("9");
        out.clear();
        frame(&mut out, &SpoutCommand { command: "ack", id: Some(&id) }).unwrap();
        assert_eq!(out, b"{\"command\":\"ack\",\"id\":\"9\"}\nend\n");
    }
}
