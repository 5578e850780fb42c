//! The wire format of the transport (see the module doc of `transport`): frames, the hello, and
//! batches of envelopes encoded and decoded without intermediate copies; a corrupt frame is an
//! error naming the peer, never a panic.

use std::io::{Read, Write};

use bytes::Bytes;
use cluster_state::ids::TaskId;

use crate::acker::AckMsg;
use crate::collector::{Batch, Envelope, Sent};
use crate::error::{Error, Result};
use crate::executor::StreamTable;
use crate::tuple::{Anchor, Anchors, TextCache, Value};

pub(super) fn bad(peer: &str, reason: impl Into<String>) -> Error {
    Error::BadFrame { peer: peer.to_owned(), reason: reason.into() }
}

/// Appends the encoding of `batch` (count and envelopes) to `out`; the sender builds the same
/// layout with [`FrameBuf`].
#[cfg(test)]
pub(crate) fn encode_batch(batch: &[Envelope], out: &mut Vec<u8>) -> Result<()> {
    let count = u32::try_from(batch.len()).map_err(|_| Error::Unencodable {
        task: 0,
        reason: format!("a batch of {} envelopes", batch.len()),
    })?;
    out.extend_from_slice(&count.to_le_bytes());
    batch.iter().try_for_each(|env| encode_envelope(env, out))
}

/// Appends one envelope. Fixed-size parts are assembled on the stack and appended at once: a
/// call per field was a third of the sender thread. A count or length that does not fit its
/// field is an error (and `out` may hold part of the envelope: the caller truncates).
pub(super) fn encode_envelope(env: &Envelope, out: &mut Vec<u8>) -> Result<()> {
    match env {
        Envelope::Tuple { task, tuple } => {
            let too_many = |what: &str, n: usize| Error::Unencodable {
                task: task.0,
                reason: format!("{n} {what}, the wire format allows at most {}", u16::MAX),
            };
            let anchors = tuple.anchors.as_slice();
            let anchor_count =
                u16::try_from(anchors.len()).map_err(|_| too_many("anchors", anchors.len()))?;
            let value_count =
                u16::try_from(tuple.values.len()).map_err(|_| too_many("values", tuple.values.len()))?;
            let mut head = [0u8; 15];
            head[1..5].copy_from_slice(&task.0.to_le_bytes());
            head[5..9].copy_from_slice(&tuple.source_task.0.to_le_bytes());
            head[9..13].copy_from_slice(&tuple.stream.to_le_bytes());
            head[13..15].copy_from_slice(&anchor_count.to_le_bytes());
            out.extend_from_slice(&head);
            for a in anchors {
                let mut pair = [0u8; 16];
                pair[..8].copy_from_slice(&a.root.to_le_bytes());
                pair[8..].copy_from_slice(&a.edge.to_le_bytes());
                out.extend_from_slice(&pair);
            }
            out.extend_from_slice(&value_count.to_le_bytes());
            for (i, v) in tuple.values.iter().enumerate() {
                encode_value(v, out).map_err(|reason| Error::Unencodable {
                    task: task.0,
                    reason: format!("value {i}: {reason}"),
                })?;
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
    Ok(())
}

fn encode_value(v: &Value, out: &mut Vec<u8>) -> std::result::Result<(), String> {
    let mut fixed = [0u8; 9];
    let (tag, payload): (u8, &[u8]) = match v {
        Value::Null => (0, &[]),
        Value::Bool(b) => {
            fixed[1] = u8::from(*b);
            out.extend_from_slice(&[1, fixed[1]]);
            return Ok(());
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
            let len = u32::try_from(payload.len()).map_err(|_| {
                format!("{} bytes, the wire format allows at most {}", payload.len(), u32::MAX)
            })?;
            fixed[1..5].copy_from_slice(&len.to_le_bytes());
            out.extend_from_slice(&fixed[..5]);
            out.extend_from_slice(payload);
        }
    }
    Ok(())
}

/// Why [`FrameBuf::push`] failed.
#[derive(Debug)]
pub(super) enum PushError {
    /// The envelope cannot be sent (dropped; the frame is as before).
    Envelope(Error),
    /// Writing a finished frame failed (the frame is cleared).
    Io(std::io::Error),
}

/// One frame being built: length, count, envelopes. Frames are cut by envelopes and by bytes:
/// a frame is written once it holds `max_envelopes` envelopes or `target_bytes` of payload,
/// and never exceeds `limit` bytes of payload (the receiver's limit), so a batch larger than
/// that is split between envelopes; an envelope that alone exceeds it is refused.
#[derive(Debug)]
pub(super) struct FrameBuf {
    buf: Vec<u8>,
    count: usize,
    max_envelopes: usize,
    target_bytes: usize,
    limit: usize,
}

impl FrameBuf {
    pub(super) fn new(max_envelopes: usize, target_bytes: usize, limit: usize) -> Self {
        let mut buf = Vec::with_capacity(target_bytes.min(limit) + 4096);
        buf.extend_from_slice(&[0; 8]);
        FrameBuf { buf, count: 0, max_envelopes, target_bytes, limit }
    }

    /// Appends `env`; frames that are complete go to `write`, header and all.
    pub(super) fn push(
        &mut self,
        env: &Envelope,
        write: &mut impl FnMut(&[u8]) -> std::io::Result<()>,
    ) -> std::result::Result<(), PushError> {
        let mark = self.buf.len();
        if let Err(e) = encode_envelope(env, &mut self.buf) {
            self.buf.truncate(mark);
            return Err(PushError::Envelope(e));
        }
        let size = self.buf.len() - mark;
        // The payload of a frame holding this envelope alone: count and envelope.
        if 4 + size > self.limit {
            self.buf.truncate(mark);
            return Err(PushError::Envelope(Error::Unencodable {
                task: env.task().0,
                reason: format!("{size} bytes encoded, over the frame limit of {} bytes", self.limit),
            }));
        }
        if self.buf.len() - 4 > self.limit {
            // The frame so far goes first; this envelope starts the next one.
            let tail = self.buf.split_off(mark);
            let written = self.flush(write);
            self.buf.extend_from_slice(&tail);
            self.count = 1;
            written.map_err(PushError::Io)?;
        } else {
            self.count += 1;
        }
        if self.count >= self.max_envelopes || self.buf.len() - 8 >= self.target_bytes {
            self.flush(write).map_err(PushError::Io)?;
        }
        Ok(())
    }

    /// Writes the frame if it holds anything, and starts the next one.
    pub(super) fn flush(
        &mut self,
        write: &mut impl FnMut(&[u8]) -> std::io::Result<()>,
    ) -> std::io::Result<()> {
        if self.count == 0 {
            return Ok(());
        }
        // Both fit: the payload is at most `limit` (a u32 by construction of the caller's
        // limit), and the count is below the payload's length.
        let len = u32::try_from(self.buf.len() - 4).unwrap_or(u32::MAX);
        let count = u32::try_from(self.count).unwrap_or(u32::MAX);
        self.buf[..4].copy_from_slice(&len.to_be_bytes());
        self.buf[4..8].copy_from_slice(&count.to_le_bytes());
        let written = write(&self.buf);
        self.buf.truncate(8);
        self.count = 0;
        written
    }
}

/// A reader over a frame's payload: every read checks the length first, so a truncated or
/// corrupt frame is an error, never a panic. Reads from a plain slice (a `Buf` call per field
/// on `Bytes` checked the length twice and went through its chunk each time).
struct Cursor<'a> {
    rest: &'a [u8],
    peer: &'a str,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        if self.rest.len() < n {
            return Err(bad(self.peer, "truncated batch"));
        }
        let (head, rest) = self.rest.split_at(n);
        self.rest = rest;
        Ok(head)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N]> {
        let head = self.take(N)?;
        let mut a = [0u8; N];
        a.copy_from_slice(head);
        Ok(a)
    }

    fn u8(&mut self) -> Result<u8> {
        Ok(self.array::<1>()?[0])
    }

    fn u16(&mut self) -> Result<u16> {
        Ok(u16::from_le_bytes(self.array()?))
    }

    fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array()?))
    }
}

/// Short texts a connection keeps built (inline ones, at most 23 bytes: ~100 KB).
pub(crate) const CONNECTION_TEXTS: usize = 4096;

/// Where decoded envelopes go: the batch for a task's destination. A task with no destination
/// gets a batch that is thrown away (its envelopes are still decoded, to check the frame).
pub(crate) trait BatchSink {
    fn batch_for(&mut self, task: TaskId) -> &mut Batch;
}

/// Decodes one batch payload.
#[cfg(test)]
pub(crate) fn decode_batch(buf: Bytes, table: &StreamTable, peer: &str) -> Result<Batch> {
    struct All(Batch);
    impl BatchSink for All {
        fn batch_for(&mut self, _: TaskId) -> &mut Batch {
            &mut self.0
        }
    }
    let mut all = All(Vec::new());
    decode_each(buf, table, peer, &mut all, &mut TextCache::new(CONNECTION_TEXTS))?;
    Ok(all.0)
}

/// Decodes one batch payload into `sink`, each envelope straight into its destination's batch,
/// text values from `texts`. A tuple's envelope is pushed first and its values decoded into it:
/// no value or envelope is moved again after it is built (with the text cache, the receiving
/// thread's word count went from 4.16M to 4.4-4.5M words per CPU-s; either alone gained
/// nothing, the moves stalling on whatever was built last). On an error, envelopes before it
/// were handed over.
pub(crate) fn decode_each(
    frame: Bytes,
    table: &StreamTable,
    peer: &str,
    sink: &mut impl BatchSink,
    texts: &mut TextCache,
) -> Result<()> {
    let mut c = Cursor { rest: &frame, peer };
    let count = c.u32()? as usize;
    for _ in 0..count {
        let tag = c.u8()?;
        let task = TaskId(c.u32()?);
        match tag {
            0 => {
                let source_task = TaskId(c.u32()?);
                let index = c.u32()?;
                let meta = table
                    .metas
                    .get(index as usize)
                    .ok_or_else(|| bad(peer, format!("unknown stream index {index}")))?;
                let anchors = match c.u16()? {
                    0 => Anchors::None,
                    1 => Anchors::One(Anchor { root: c.u64()?, edge: c.u64()? }),
                    n => Anchors::Many(Box::new(
                        (0..n)
                            .map(|_| Ok(Anchor { root: c.u64()?, edge: c.u64()? }))
                            .collect::<Result<_>>()?,
                    )),
                };
                let n = c.u16()? as usize;
                if n != meta.fields.len() {
                    return Err(bad(
                        peer,
                        format!("{n} values for stream {:?} of {}", meta.stream, meta.component),
                    ));
                }
                let batch = sink.batch_for(task);
                batch.push(Envelope::Tuple {
                    task,
                    tuple: Sent { values: crate::tuple::Values::new(), stream: index, source_task, anchors },
                });
                let Some(Envelope::Tuple { tuple, .. }) = batch.last_mut() else {
                    return Err(bad(peer, "decoding lost its envelope"));
                };
                for _ in 0..n {
                    match decode_value(&mut c, &frame, texts) {
                        Ok(v) => tuple.values.push(v),
                        Err(e) => {
                            batch.pop();
                            return Err(e);
                        }
                    }
                }
            }
            1 => {
                let kind = c.u8()?;
                let root = c.u64()?;
                let val = c.u64()?;
                let extra = c.u32()?;
                let msg = match kind {
                    0 => AckMsg::Init { root, val, spout_task: TaskId(extra) },
                    1 => AckMsg::Ack { root, val },
                    2 => AckMsg::Fail { root },
                    3 => AckMsg::Done { root, ok: extra != 0 },
                    4 => AckMsg::TasksMoved,
                    k => return Err(bad(peer, format!("unknown ack kind {k}"))),
                };
                sink.batch_for(task).push(Envelope::Ack { task, msg });
            }
            t => return Err(bad(peer, format!("unknown envelope tag {t}"))),
        }
    }
    if !c.rest.is_empty() {
        return Err(bad(peer, "trailing bytes after batch"));
    }
    Ok(())
}

/// Decodes one value; a `Bytes` value is a slice of `frame`.
fn decode_value(c: &mut Cursor<'_>, frame: &Bytes, texts: &mut TextCache) -> Result<Value> {
    Ok(match c.u8()? {
        0 => Value::Null,
        1 => Value::Bool(c.u8()? != 0),
        2 => Value::Int(i64::from_le_bytes(c.array()?)),
        3 => Value::Float(f64::from_le_bytes(c.array()?)),
        4 => {
            let len = c.u32()? as usize;
            // Copied into its own value (inline up to 23 bytes): a `Bytes` slice of the frame
            // would only cost a reference count taken and dropped (two atomic operations a word).
            let text =
                std::str::from_utf8(c.take(len)?).map_err(|_| bad(c.peer, "string value is not UTF-8"))?;
            Value::Str(texts.get(text))
        }
        5 => {
            let len = c.u32()? as usize;
            let at = frame.len() - c.rest.len();
            c.take(len)?;
            Value::Bytes(frame.slice(at..at + len))
        }
        t => return Err(bad(c.peer, format!("unknown value tag {t}"))),
    })
}

pub(super) fn write_frame(w: &mut impl Write, payload: &[u8]) -> std::io::Result<()> {
    let len = u32::try_from(payload.len())
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidInput, "frame over 4 GiB"))?;
    w.write_all(&len.to_be_bytes())?;
    w.write_all(payload)
}

/// Reads one frame of at most `limit` bytes: `None` at a clean end of the stream. A frame of up
/// to [`READ_CHUNK`] bytes (every frame a sender builds from small tuples) is read into a buffer
/// of its size; a larger one's buffer grows as bytes arrive (a header alone allocates nothing
/// near its announced length).
pub(super) fn read_frame(r: &mut impl Read, peer: &str, limit: usize) -> Result<Option<Bytes>> {
    let mut len = [0u8; 4];
    match r.read_exact(&mut len) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(Error::io(format!("read from {peer}"), e)),
    }
    let len = u32::from_be_bytes(len) as usize;
    if len > limit {
        return Err(bad(peer, format!("frame of {len} bytes exceeds the limit of {limit} bytes")));
    }
    let mut buf = Vec::with_capacity(len.min(READ_CHUNK));
    r.take(len as u64).read_to_end(&mut buf).map_err(|e| Error::io(format!("read from {peer}"), e))?;
    if buf.len() < len {
        return Err(bad(peer, format!("connection ended inside a frame ({} of {len} bytes)", buf.len())));
    }
    Ok(Some(Bytes::from(buf)))
}

/// What a frame buffer starts at; it grows (doubling) only as bytes arrive. Above a sender's
/// [`FRAME_TARGET_BYTES`](super::FRAME_TARGET_BYTES) and one more envelope: frames of word
/// tuples are ~180 KB, and a 64 KB start copied each of them twice while it grew (~2% of the
/// receiving thread).
const READ_CHUNK: usize = 2 * 1024 * 1024;
