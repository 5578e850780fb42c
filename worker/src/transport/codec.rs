//! The wire format of the transport (see the module doc of `transport`): frames, the hello, and
//! batches of envelopes encoded and decoded without intermediate copies; a corrupt frame is an
//! error naming the peer, never a panic.

use std::io::{Read, Write};

use bytes::{Buf, Bytes};
use cluster_state::ids::TaskId;

use super::{FRAME_LIMIT, MAGIC};
use crate::acker::AckMsg;
use crate::collector::{Envelope, Sent};
use crate::error::{Error, Result};
use crate::executor::StreamTable;
use crate::tuple::{Anchor, Value};

pub(super) fn bad(peer: &str, reason: impl Into<String>) -> Error {
    Error::BadFrame { peer: peer.to_owned(), reason: reason.into() }
}

/// Appends the encoding of `batch` (count and envelopes) to `out`; the sender builds the same
/// layout incrementally, batch by batch.
#[cfg(test)]
pub(crate) fn encode_batch(batch: &[Envelope], out: &mut Vec<u8>) {
    out.extend_from_slice(&(batch.len() as u32).to_le_bytes());
    encode_envelopes(batch, out);
}

/// Appends the envelopes alone (the caller writes the count). Fixed-size parts are assembled on
/// the stack and appended at once: a call per field was a third of the sender thread.
pub(super) fn encode_envelopes(batch: &[Envelope], out: &mut Vec<u8>) {
    for env in batch {
        match env {
            Envelope::Tuple { task, tuple } => {
                let anchors = tuple.anchors.as_slice();
                let mut head = [0u8; 15];
                head[1..5].copy_from_slice(&task.0.to_le_bytes());
                head[5..9].copy_from_slice(&tuple.source_task.0.to_le_bytes());
                head[9..13].copy_from_slice(&tuple.stream.to_le_bytes());
                head[13..15].copy_from_slice(&(anchors.len() as u16).to_le_bytes());
                out.extend_from_slice(&head);
                for a in anchors {
                    let mut pair = [0u8; 16];
                    pair[..8].copy_from_slice(&a.root.to_le_bytes());
                    pair[8..].copy_from_slice(&a.edge.to_le_bytes());
                    out.extend_from_slice(&pair);
                }
                out.extend_from_slice(&(tuple.values.len() as u16).to_le_bytes());
                for v in &tuple.values {
                    encode_value(v, out);
                }
            }
            Envelope::Ack { task, msg } => {
                let (kind, root, val, extra) = match *msg {
                    AckMsg::Init { root, val, spout_task } => (0u8, root, val, spout_task.0),
                    AckMsg::Ack { root, val } => (1, root, val, 0),
                    AckMsg::Fail { root } => (2, root, 0, 0),
                    AckMsg::Done { root, ok } => (3, root, 0, u32::from(ok)),
                    // Sent only within a worker; encoded all the same, so every message has a form.
                    AckMsg::TasksMoved => (4, 0, 0, 0),
                };
                let mut ack = [0u8; 26];
                ack[0] = 1;
                ack[1..5].copy_from_slice(&task.0.to_le_bytes());
                ack[5] = kind;
                ack[6..14].copy_from_slice(&root.to_le_bytes());
                ack[14..22].copy_from_slice(&val.to_le_bytes());
                ack[22..26].copy_from_slice(&extra.to_le_bytes());
                out.extend_from_slice(&ack);
            }
        }
    }
}

pub(super) fn encode_value(v: &Value, out: &mut Vec<u8>) {
    let mut fixed = [0u8; 9];
    let (tag, payload): (u8, &[u8]) = match v {
        Value::Null => (0, &[]),
        Value::Bool(b) => {
            fixed[1] = u8::from(*b);
            out.extend_from_slice(&[1, fixed[1]]);
            return;
        }
        Value::Int(i) => {
            fixed[1..].copy_from_slice(&i.to_le_bytes());
            (2, &[])
        }
        Value::Float(f) => {
            fixed[1..].copy_from_slice(&f.to_le_bytes());
            (3, &[])
        }
        Value::Str(s) => (4, s.as_bytes()),
        Value::Bytes(b) => (5, b),
    };
    fixed[0] = tag;
    match tag {
        0 => out.push(0),
        2 | 3 => out.extend_from_slice(&fixed),
        _ => {
            fixed[1..5].copy_from_slice(&(payload.len() as u32).to_le_bytes());
            out.extend_from_slice(&fixed[..5]);
            out.extend_from_slice(payload);
        }
    }
}

/// Checks that `buf` holds `n` more bytes.
pub(super) fn need(buf: &Bytes, n: usize, peer: &str) -> Result<()> {
    if buf.remaining() < n { Err(bad(peer, "truncated batch")) } else { Ok(()) }
}

/// Decodes one batch payload.
#[cfg(test)]
pub(crate) fn decode_batch(buf: Bytes, table: &StreamTable, peer: &str) -> Result<crate::collector::Batch> {
    let mut out = Vec::new();
    decode_each(buf, table, peer, |env| out.push(env))?;
    Ok(out)
}

/// Decodes one batch payload, handing each envelope to `out` as it is read (the receiver puts
/// it straight into its destination's batch). On an error, envelopes before it were handed.
pub(crate) fn decode_each(
    mut buf: Bytes,
    table: &StreamTable,
    peer: &str,
    mut out: impl FnMut(Envelope),
) -> Result<()> {
    need(&buf, 4, peer)?;
    let count = buf.get_u32_le() as usize;
    for _ in 0..count {
        need(&buf, 5, peer)?;
        let tag = buf.get_u8();
        let task = TaskId(buf.get_u32_le());
        match tag {
            0 => {
                need(&buf, 10, peer)?;
                let source_task = TaskId(buf.get_u32_le());
                let index = buf.get_u32_le();
                let meta = table
                    .metas
                    .get(index as usize)
                    .ok_or_else(|| bad(peer, format!("unknown stream index {index}")))?;
                let n = buf.get_u16_le() as usize;
                need(&buf, n * 16 + 2, peer)?;
                let anchors =
                    (0..n).map(|_| Anchor { root: buf.get_u64_le(), edge: buf.get_u64_le() }).collect();
                let n = buf.get_u16_le() as usize;
                let mut values = crate::tuple::Values::with_capacity(n);
                for _ in 0..n {
                    need(&buf, 1, peer)?;
                    let v = match buf.get_u8() {
                        0 => Value::Null,
                        1 => {
                            need(&buf, 1, peer)?;
                            Value::Bool(buf.get_u8() != 0)
                        }
                        2 => {
                            need(&buf, 8, peer)?;
                            Value::Int(buf.get_i64_le())
                        }
                        3 => {
                            need(&buf, 8, peer)?;
                            Value::Float(buf.get_f64_le())
                        }
                        t @ (4 | 5) => {
                            need(&buf, 4, peer)?;
                            let len = buf.get_u32_le() as usize;
                            need(&buf, len, peer)?;
                            let bytes = buf.split_to(len);
                            if t == 4 {
                                let s = std::str::from_utf8(&bytes)
                                    .map_err(|_| bad(peer, "string value is not UTF-8"))?;
                                Value::from(s)
                            } else {
                                Value::Bytes(bytes)
                            }
                        }
                        t => return Err(bad(peer, format!("unknown value tag {t}"))),
                    };
                    values.push(v);
                }
                if values.len() != meta.fields.len() {
                    return Err(bad(
                        peer,
                        format!("{} values for stream {:?} of {}", values.len(), meta.stream, meta.component),
                    ));
                }
                out(Envelope::Tuple { task, tuple: Sent { values, stream: index, source_task, anchors } });
            }
            1 => {
                need(&buf, 21, peer)?;
                let kind = buf.get_u8();
                let root = buf.get_u64_le();
                let val = buf.get_u64_le();
                let extra = buf.get_u32_le();
                let msg = match kind {
                    0 => AckMsg::Init { root, val, spout_task: TaskId(extra) },
                    1 => AckMsg::Ack { root, val },
                    2 => AckMsg::Fail { root },
                    3 => AckMsg::Done { root, ok: extra != 0 },
                    4 => AckMsg::TasksMoved,
                    k => return Err(bad(peer, format!("unknown ack kind {k}"))),
                };
                out(Envelope::Ack { task, msg });
            }
            t => return Err(bad(peer, format!("unknown envelope tag {t}"))),
        }
    }
    if buf.has_remaining() {
        return Err(bad(peer, "trailing bytes after batch"));
    }
    Ok(())
}

pub(super) fn hello(topology_id: &str) -> Vec<u8> {
    let mut v = Vec::with_capacity(8 + topology_id.len());
    v.extend_from_slice(MAGIC);
    v.extend_from_slice(topology_id.as_bytes());
    v
}

pub(super) fn write_frame(w: &mut impl Write, payload: &[u8]) -> std::io::Result<()> {
    w.write_all(&(payload.len() as u32).to_be_bytes())?;
    w.write_all(payload)
}

pub(super) fn read_frame(r: &mut impl Read, peer: &str) -> Result<Option<Bytes>> {
    let mut len = [0u8; 4];
    match r.read_exact(&mut len) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(Error::io(format!("read from {peer}"), e)),
    }
    let len = u32::from_be_bytes(len) as usize;
    if len > FRAME_LIMIT {
        return Err(bad(peer, format!("frame of {len} bytes exceeds the limit")));
    }
    let mut buf = vec![0u8; len];
    r.read_exact(&mut buf).map_err(|e| Error::io(format!("read from {peer}"), e))?;
    Ok(Some(Bytes::from(buf)))
}
