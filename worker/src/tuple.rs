//! Tuples: named fields, dynamically typed values, and the ids that tie a tuple into its
//! spout tuple's tree.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use cluster_state::ids::{ComponentId, TaskId};

/// Storm's default stream id.
pub const DEFAULT_STREAM: &str = "default";
/// The stream of tick tuples (Storm's `__tick`).
pub const TICK_STREAM: &str = "__tick";
/// The component tick tuples come from (Storm's `__system`).
pub const SYSTEM_COMPONENT: &str = "__system";

/// One dynamically typed value of a tuple.
///
/// Its tag is a whole word (`repr(u64)`): a value is then copied as aligned words. With a
/// one-byte tag the compiler copied bytes 1..32 of a value just built, loads that straddled the
/// stores writing it (a store-forwarding stall: a fifth of the split bolt's time, measured).
#[derive(Debug, Clone, PartialEq)]
#[repr(u64)]
pub enum Value {
    Null,
    Bool(bool),
    Int(i64),
    Float(f64),
    /// Text: up to 23 bytes inline (no allocation: most words, keys and ids), longer text in
    /// one shared buffer that clones share.
    Str(Text),
    /// Raw bytes; cloning shares the buffer.
    Bytes(Bytes),
}

impl Value {
    /// The text, if this is a [`Value::Str`].
    #[inline]
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }

    /// The integer, if this is a [`Value::Int`].
    #[inline]
    pub fn as_int(&self) -> Option<i64> {
        match self {
            Value::Int(i) => Some(*i),
            _ => None,
        }
    }

    /// The float, if this is a [`Value::Float`] (or an [`Value::Int`], widened).
    #[inline]
    pub fn as_float(&self) -> Option<f64> {
        match self {
            Value::Float(f) => Some(*f),
            Value::Int(i) => Some(*i as f64),
            _ => None,
        }
    }

    /// The bytes, if this is a [`Value::Bytes`].
    #[inline]
    pub fn as_bytes(&self) -> Option<&Bytes> {
        match self {
            Value::Bytes(b) => Some(b),
            _ => None,
        }
    }

    /// A hash that is the same in every process and Squall version (FNV-1a over a type tag and
    /// the value's bytes): fields grouping must send equal keys to the same task whichever
    /// worker emits them.
    pub fn stable_hash(&self, mut h: u64) -> u64 {
        fn mix(mut h: u64, bytes: &[u8]) -> u64 {
            for b in bytes {
                h ^= u64::from(*b);
                h = h.wrapping_mul(0x0000_0100_0000_01b3);
            }
            h
        }
        match self {
            Value::Null => mix(h, &[0]),
            Value::Bool(b) => mix(h, &[1, u8::from(*b)]),
            Value::Int(i) => {
                h = mix(h, &[2]);
                mix(h, &i.to_le_bytes())
            }
            Value::Float(f) => {
                h = mix(h, &[3]);
                mix(h, &f.to_bits().to_le_bytes())
            }
            Value::Str(s) => {
                h = mix(h, &[4]);
                mix(h, s.as_bytes())
            }
            Value::Bytes(b) => {
                h = mix(h, &[5]);
                mix(h, b)
            }
        }
    }
}

/// FNV-1a's offset basis, the seed of [`Value::stable_hash`].
pub const HASH_SEED: u64 = 0xcbf2_9ce4_8422_2325;

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::Null => f.write_str("null"),
            Value::Bool(b) => b.fmt(f),
            Value::Int(i) => i.fmt(f),
            Value::Float(x) => x.fmt(f),
            Value::Str(s) => f.write_str(s),
            Value::Bytes(b) => write!(f, "<{} bytes>", b.len()),
        }
    }
}

impl From<&str> for Value {
    fn from(s: &str) -> Self {
        Value::Str(Text::new(s))
    }
}
impl From<String> for Value {
    fn from(s: String) -> Self {
        Value::Str(Text::from(s))
    }
}
impl From<Arc<str>> for Value {
    fn from(s: Arc<str>) -> Self {
        Value::Str(Text::from(s))
    }
}
impl From<Text> for Value {
    fn from(s: Text) -> Self {
        Value::Str(s)
    }
}
impl From<i64> for Value {
    fn from(i: i64) -> Self {
        Value::Int(i)
    }
}
impl From<u32> for Value {
    fn from(i: u32) -> Self {
        Value::Int(i64::from(i))
    }
}
impl From<i32> for Value {
    fn from(i: i32) -> Self {
        Value::Int(i64::from(i))
    }
}
impl From<f64> for Value {
    fn from(f: f64) -> Self {
        Value::Float(f)
    }
}
impl From<bool> for Value {
    fn from(b: bool) -> Self {
        Value::Bool(b)
    }
}
impl From<Bytes> for Value {
    fn from(b: Bytes) -> Self {
        Value::Bytes(b)
    }
}

/// Immutable text of a [`Value::Str`]: a `&str` by deref; up to 23 bytes are stored inline,
/// longer text is shared by clones (`Text::new`, or `From` a `&str`, `String`, `Arc<str>`).
pub type Text = smol_str::SmolStr;

/// The longest text a [`Text`] holds inline.
const INLINE_TEXT_MAX: usize = 23;

/// The hasher of text keys in a task's own maps (words, counts): FxHash, which takes a short
/// text eight bytes at a time (byte-by-byte FNV-1a was ~10% of a counting bolt). SipHash's DoS
/// resistance is not needed for a task's maps of its topology's data.
pub(crate) type TextHasher = std::hash::BuildHasherDefault<rustc_hash::FxHasher>;

/// A `&str` looked up in a map or set keyed by [`Text`] (`hashbrown`'s, with [`TextHasher`]):
/// hashed as the `Text` is, compared by [`same_bytes`]. `str`'s own equality calls `memcmp` for
/// every key it compares: on word count that call was ~7% of the split bolt's thread and ~6%
/// of the counting bolt's.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TextRef<'a>(pub(crate) &'a str);

impl std::hash::Hash for TextRef<'_> {
    #[inline]
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        // As `Text`'s `Hash` does: the text as a `str`.
        self.0.hash(state);
    }
}

impl hashbrown::Equivalent<Text> for TextRef<'_> {
    #[inline]
    fn equivalent(&self, key: &Text) -> bool {
        same_bytes(self.0.as_bytes(), key.as_bytes())
    }
}

/// `a == b`; up to 16 bytes (most words and keys) by two overlapping loads of each side instead
/// of a call to `memcmp`.
#[inline]
fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let four = |s: &[u8]| {
        (
            s.first_chunk::<4>().map(|c| u32::from_ne_bytes(*c)),
            s.last_chunk::<4>().map(|c| u32::from_ne_bytes(*c)),
        )
    };
    let eight = |s: &[u8]| {
        (
            s.first_chunk::<8>().map(|c| u64::from_ne_bytes(*c)),
            s.last_chunk::<8>().map(|c| u64::from_ne_bytes(*c)),
        )
    };
    match a.len() {
        0 => true,
        // The first, middle and last byte are every byte of 1 to 3 (a loop here became a call
        // to `memcmp` once inlined).
        1..4 => {
            let (n, m) = (a.len() - 1, a.len() / 2);
            a[0] == b[0] && a[m] == b[m] && a[n] == b[n]
        }
        4..=8 => four(a) == four(b),
        9..=16 => eight(a) == eight(b),
        _ => a == b,
    }
}

/// Short texts built once, handed out as copies: the split bolt's words, a transport
/// connection's decoded texts. Building a short text in place and moving it at once stalls on
/// the stores that wrote it (a quarter of the split bolt's time; with the moves after it, a
/// third of the receiving thread on word count); copying a built one does not.
///
/// A text has one bucket of [`WAYS`] slots, picked by [`slot_hash`]; a lookup is a hash of at
/// most three machine words and a comparison per slot tried, usually one (a hash set's probe
/// took word count ~100 instructions per word, a third of the split bolt's). A miss builds
/// the text and keeps it in the bucket's first free slot; a full bucket, or half the slots
/// held, doubles the buckets instead while below `max` slots, so a vocabulary of thousands of
/// words settles with every word kept. Only inline texts are kept (a longer one lives in a
/// shared buffer whose reference count every thread dropping a copy would touch: built per
/// use). At `max` slots a miss in a full bucket replaces its last text, and a cache that has
/// replaced `max` texts with fewer hits meanwhile (ids, say) stops looking.
#[derive(Debug)]
pub(crate) struct TextCache {
    /// None before the first miss.
    buckets: Buckets<Text>,
    /// The most slots (a power of two, at least `WAYS`).
    max: usize,
    /// Lookups that hit since the cache has `max` slots.
    full_hits: usize,
    /// Texts replaced by another (only ever at `max` slots).
    evictions: usize,
    off: bool,
}

/// Slots per bucket of a [`TextCache`].
const WAYS: usize = 4;

/// The most slots per text a [`TextCache`] grows to for a text that is not first in its bucket.
const SPARSE: usize = 64;

/// The buckets a cache takes at its first miss.
const FIRST_BUCKETS: usize = 16;

/// The slot hash of a text of at most [`INLINE_TEXT_MAX`] bytes (longer ones are never kept):
/// its first, second and last eight bytes (those it has; overlapping loads for the shorter),
/// with its length, mixed by one multiplication.
#[inline(always)]
fn slot_hash(b: &[u8]) -> u64 {
    let n = b.len();
    let x = if let (Some(f), Some(l)) = (b.first_chunk::<8>(), b.last_chunk::<8>()) {
        let second = match b.get(8..).and_then(<[u8]>::first_chunk::<8>) {
            Some(s) if n > 16 => u64::from_le_bytes(*s),
            _ => 0,
        };
        u64::from_le_bytes(*f) ^ u64::from_le_bytes(*l).rotate_left(29) ^ second.rotate_left(43)
    } else if let (Some(f), Some(l)) = (b.first_chunk::<4>(), b.last_chunk::<4>()) {
        u64::from(u32::from_le_bytes(*f)) | (u64::from(u32::from_le_bytes(*l)) << 32)
    } else if let (Some(f), Some(l)) = (b.first(), b.last()) {
        u64::from(*f) | (u64::from(b[n / 2]) << 8) | (u64::from(*l) << 16)
    } else {
        0
    };
    // A folded multiply: each half of the 128-bit product depends on every bit of the input.
    let product = u128::from(x ^ ((n as u64) << 56)) * 0x9E37_79B9_7F4A_7C15;
    (product as u64) ^ ((product >> 64) as u64)
}

impl TextCache {
    pub(crate) fn new(max: usize) -> Self {
        TextCache {
            buckets: Buckets::new(),
            max: max.next_power_of_two().max(WAYS),
            full_hits: 0,
            evictions: 0,
            off: false,
        }
    }

    fn full(&self) -> bool {
        self.buckets.slots() >= self.max
    }

    /// `s` as a [`Text`], a copy of the built one when there is one.
    #[inline(always)]
    pub(crate) fn get(&mut self, s: &str) -> Text {
        if let Some([Some(first), rest @ ..]) = self.buckets.get(self.buckets.bucket_of(s.as_bytes())) {
            // Most hits are a bucket's first text: it is tried before the loop.
            let hit = if same_bytes(first.as_bytes(), s.as_bytes()) {
                Some(first)
            } else {
                rest.iter().map_while(Option::as_ref).find(|t| same_bytes(t.as_bytes(), s.as_bytes()))
            };
            if let Some(t) = hit {
                if self.full() {
                    self.full_hits += 1;
                }
                return t.clone();
            }
        }
        self.miss(s)
    }

    /// `get` without a built copy of `s`: builds it, and keeps it (see [`TextCache`]).
    #[inline(never)]
    fn miss(&mut self, s: &str) -> Text {
        let text = Text::new(s);
        if self.off || s.len() > INLINE_TEXT_MAX {
            return text;
        }
        if !self.full() && self.wants_room(s.as_bytes()) {
            self.grow();
        }
        if self.keep(text.clone()) {
            self.evictions += 1;
            if self.evictions >= self.max && self.full_hits < self.evictions {
                self.off = true;
                self.buckets = Buckets::new();
            }
        }
        text
    }

    /// Whether to grow before keeping `s` (below `max` slots): when half the slots are held,
    /// when its bucket is full, or when its bucket's first slot is taken and the slots are
    /// fewer than [`SPARSE`] per text held. A hit beyond a bucket's first slot costs a
    /// comparison more and a branch the processor mispredicts (spread only to an eighth of
    /// the slots held, a word count did ~8% fewer words per CPU-s than with a slot per word);
    /// so a small vocabulary is spread until nearly every word is first in its bucket, and a
    /// large one fills the buckets.
    fn wants_room(&self, s: &[u8]) -> bool {
        self.buckets.wants_room(self.buckets.bucket_of(s), true, true)
    }

    /// Puts `text` in its bucket's first free slot, or in place of its last text: whether it
    /// evicted one.
    fn keep(&mut self, text: Text) -> bool {
        let b = self.buckets.bucket_of(text.as_bytes());
        match self.buckets.put(b, text) {
            Ok(()) => false,
            Err(text) => match self.buckets.get_mut(b) {
                Some(bucket) => {
                    bucket[WAYS - 1] = Some(text);
                    true
                }
                None => false,
            },
        }
    }

    /// Doubles the buckets (`FIRST_BUCKETS` when there are none, at most `max` slots), moving
    /// each text.
    fn grow(&mut self) {
        let len = (self.buckets.len() * 2).clamp(FIRST_BUCKETS.min(self.max / WAYS), self.max / WAYS);
        for t in self.buckets.resize(len) {
            self.keep(t);
        }
    }

    #[cfg(test)]
    pub(crate) fn iter(&self) -> impl Iterator<Item = &Text> {
        self.buckets.iter()
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.buckets.held
    }
}

/// Buckets of [`WAYS`] slots, a bucket picked by the top bits of a text's [`slot_hash`] and
/// filled from its first slot: the table under [`TextCache`] and [`TextCounts`].
#[derive(Debug)]
struct Buckets<T> {
    /// A power of two of buckets (none at first).
    buckets: Vec<[Option<T>; WAYS]>,
    /// `64 - log2(buckets.len())`: the hash's top bits pick the bucket.
    shift: u32,
    /// Slots holding an entry.
    held: usize,
}

impl<T: Clone> Buckets<T> {
    fn new() -> Self {
        Buckets { buckets: Vec::new(), shift: 64, held: 0 }
    }

    /// The bucket of `s` (0 while there is at most one).
    #[inline(always)]
    fn bucket_of(&self, s: &[u8]) -> usize {
        slot_hash(s).checked_shr(self.shift).unwrap_or(0) as usize
    }

    #[inline(always)]
    fn get(&self, b: usize) -> Option<&[Option<T>; WAYS]> {
        self.buckets.get(b)
    }

    #[inline(always)]
    fn get_mut(&mut self, b: usize) -> Option<&mut [Option<T>; WAYS]> {
        self.buckets.get_mut(b)
    }

    /// How many buckets.
    fn len(&self) -> usize {
        self.buckets.len()
    }

    #[cfg(test)]
    fn is_empty(&self) -> bool {
        self.buckets.is_empty()
    }

    fn slots(&self) -> usize {
        self.buckets.len() * WAYS
    }

    /// Puts `entry` in bucket `b`'s first free slot, or gives it back (the bucket is full, or
    /// there are no buckets yet).
    fn put(&mut self, b: usize, entry: T) -> Result<(), T> {
        let Some(bucket) = self.buckets.get_mut(b) else { return Err(entry) };
        match bucket.iter_mut().find(|slot| slot.is_none()) {
            Some(free) => {
                *free = Some(entry);
                self.held += 1;
                Ok(())
            }
            None => Err(entry),
        }
    }

    /// Makes `len` (a power of two) empty buckets; returns the entries they held, to be put
    /// back by their new bucket.
    fn resize(&mut self, len: usize) -> impl Iterator<Item = T> + use<T> {
        let old = std::mem::replace(&mut self.buckets, vec![Default::default(); len]);
        self.shift = 64 - len.trailing_zeros();
        self.held = 0;
        old.into_iter().flatten().flatten()
    }

    /// Whether to double before a new entry is put in bucket `b`: when there are no buckets,
    /// when half the slots are held, when the bucket is full (if `full_grows`), or when its
    /// first slot is taken and the slots are fewer than [`SPARSE`] per entry (if `spread`).
    fn wants_room(&self, b: usize, full_grows: bool, spread: bool) -> bool {
        let slots = self.slots();
        match self.buckets.get(b) {
            None => true,
            Some(bucket) => {
                self.held * 2 >= slots
                    || (full_grows && bucket[WAYS - 1].is_some())
                    || (spread && bucket[0].is_some() && slots < SPARSE * self.held)
            }
        }
    }

    #[cfg(test)]
    fn iter(&self) -> impl Iterator<Item = &T> {
        self.buckets.iter().flatten().flatten()
    }
}

/// A count per text (the word count's), looked up as a [`TextCache`] is: a bucket of [`WAYS`]
/// slots picked by [`slot_hash`], where a word is usually first, then one comparison. A
/// `hashbrown` map took the counting bolt ~110 instructions per word (FxHash, a probe of
/// control bytes, `SmolStr`'s comparison), a fifth of a word count's; this takes about a third
/// of that. Unlike the cache nothing is ever dropped: texts longer than inline, and texts
/// whose bucket is full while the buckets are sparse (a hash that clusters them), are counted
/// in `rest`, and a text is in `rest` only when it is long or its bucket is full, so a bucket
/// with a free slot answers for its texts alone.
#[derive(Debug)]
pub(crate) struct TextCounts {
    /// None before the first text.
    buckets: Buckets<(Text, i64)>,
    /// Up to how many slots a new text not first in its bucket doubles the buckets (then only
    /// half the slots held, or a full bucket while at least an eighth are held, does).
    spread_max: usize,
    rest: hashbrown::HashMap<Text, i64, TextHasher>,
}

/// [`TextCounts::spread_max`]: 2 MB of slots.
const COUNTS_SPREAD_MAX: usize = 65_536;

const _: () = assert!(std::mem::size_of::<Option<(Text, i64)>>() == 32, "a count's slot is 32 bytes");

impl Default for TextCounts {
    fn default() -> Self {
        TextCounts::with_spread_max(COUNTS_SPREAD_MAX)
    }
}

impl TextCounts {
    fn with_spread_max(spread_max: usize) -> Self {
        TextCounts { buckets: Buckets::new(), spread_max, rest: hashbrown::HashMap::default() }
    }

    /// Adds one to the count of `text` (kept as a copy of it when new); returns the new count.
    #[inline(always)]
    pub(crate) fn add_one(&mut self, text: &Text) -> i64 {
        let s = text.as_bytes();
        let b = self.buckets.bucket_of(s);
        if let Some(bucket) = self.buckets.get_mut(b) {
            for slot in bucket.iter_mut() {
                match slot {
                    Some((t, count)) if same_bytes(t.as_bytes(), s) => {
                        *count += 1;
                        return *count;
                    }
                    Some(_) => {}
                    None => break,
                }
            }
        }
        self.add_one_elsewhere(text, b)
    }

    /// `add_one` for a text its bucket (`b`) does not hold: counted in `rest`, or new.
    #[inline(never)]
    fn add_one_elsewhere(&mut self, text: &Text, b: usize) -> i64 {
        let s = text.as_bytes();
        let bucket_full = self.buckets.get(b).is_some_and(|bucket| bucket[WAYS - 1].is_some());
        if s.len() > INLINE_TEXT_MAX || bucket_full {
            if let Some(count) = self.rest.get_mut(&TextRef(text.as_str())) {
                *count += 1;
                return *count;
            }
            if s.len() > INLINE_TEXT_MAX {
                self.rest.insert(text.clone(), 1);
                return 1;
            }
        }
        // New, and inline.
        if self.wants_room(s) {
            self.grow();
        }
        if let Err((text, count)) = self.keep(text.clone(), 1) {
            self.rest.insert(text, count);
        }
        1
    }

    /// Whether to double the buckets before keeping new text `s`: when there are none, when
    /// half the slots are held, when its bucket is full and at least an eighth are held, or
    /// when its bucket's first slot is taken and the slots are fewer than [`SPARSE`] per text
    /// and at most `spread_max` (as [`TextCache`] spreads a vocabulary).
    fn wants_room(&self, s: &[u8]) -> bool {
        let slots = self.buckets.slots();
        let full_grows = self.buckets.held * 8 >= slots;
        self.buckets.wants_room(self.buckets.bucket_of(s), full_grows, slots < self.spread_max)
    }

    /// Puts `text` in its bucket's first free slot, or gives it back (its bucket is full).
    fn keep(&mut self, text: Text, count: i64) -> Result<(), (Text, i64)> {
        self.buckets.put(self.buckets.bucket_of(text.as_bytes()), (text, count))
    }

    /// Doubles the buckets ([`FIRST_BUCKETS`] when there are none), moving each count; inline
    /// texts counted in `rest` move into the buckets where their bucket has room now.
    fn grow(&mut self) {
        let len = (self.buckets.len() * 2).max(FIRST_BUCKETS);
        for (text, count) in self.buckets.resize(len) {
            // A bucket's texts split between two buckets of the doubled table: all fit.
            if let Err((text, count)) = self.keep(text, count) {
                self.rest.insert(text, count);
            }
        }
        let rest = std::mem::take(&mut self.rest);
        for (text, count) in rest {
            let kept = if text.len() > INLINE_TEXT_MAX { Err((text, count)) } else { self.keep(text, count) };
            if let Err((text, count)) = kept {
                self.rest.insert(text, count);
            }
        }
    }

    /// The count of `s` so far.
    pub(crate) fn get(&self, s: &str) -> i64 {
        let in_bucket = self.buckets.get(self.buckets.bucket_of(s.as_bytes())).and_then(|bucket| {
            bucket.iter().map_while(Option::as_ref).find(|(t, _)| same_bytes(t.as_bytes(), s.as_bytes()))
        });
        match in_bucket {
            Some((_, count)) => *count,
            None => self.rest.get(&TextRef(s)).copied().unwrap_or(0),
        }
    }

    /// Texts counted.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.buckets.held + self.rest.len()
    }
}

/// The values of one tuple, in the order of its stream's fields. One value is stored inline
/// (most tuples: a sentence, a word, a message), so emitting allocates nothing and the executor
/// that drops a tuple does not free memory another thread allocated. Collectors take anything
/// `Into<Values>`: [`values!`](crate::values), a `Vec<Value>` or an array such as `[value]`.
pub type Values = smallvec::SmallVec<[Value; 1]>;

/// Builds [`Values`] from expressions convertible into [`Value`]: `values!["word", 1i64]`.
#[macro_export]
macro_rules! values {
    ($($v:expr),* $(,)?) => {{
        let values: $crate::Values = ::core::iter::IntoIterator::into_iter([$($crate::Value::from($v)),*]).collect();
        values
    }};
}

/// The declared field names of a stream.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Fields(Vec<String>);

impl Fields {
    /// Fields with these names, in order.
    pub fn new<I, S>(names: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Fields(names.into_iter().map(Into::into).collect())
    }

    /// The position of `name`.
    pub fn index_of(&self, name: &str) -> Option<usize> {
        self.0.iter().position(|f| f == name)
    }

    /// The names, in order.
    pub fn names(&self) -> &[String] {
        &self.0
    }

    /// How many fields.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there are no fields.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// What every tuple of one stream shares: where it comes from and its field names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamMeta {
    /// The emitting component.
    pub component: ComponentId,
    /// The stream id.
    pub stream: String,
    /// The declared fields.
    pub fields: Fields,
    /// The stream's index in the topology's stream table (the same in every worker).
    pub(crate) index: u32,
}

/// A spout tuple tree this tuple belongs to: the tree's root id and this tuple's edge id in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Anchor {
    pub root: u64,
    pub edge: u64,
}

/// A tuple's anchors, inline for the usual zero or one tree (no allocation per tuple).
///
/// Two or more trees (a tuple anchored to inputs of different spout tuples) are a boxed `Vec`:
/// its one pointer fits beside the tag as `One`'s 16 bytes do, so `Anchors` is 24 bytes, not
/// 32 as with the `Vec` inline, and every envelope on every queue 8 bytes smaller (a word count
/// writes one per word). A `Vec`, not a boxed slice, so that anchoring to many trees adds each
/// in amortised constant time.
// The box around the `Vec` is the point (a pointer beside the tag, see above).
#[allow(clippy::box_collection)]
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) enum Anchors {
    #[default]
    None,
    One(Anchor),
    Many(Box<Vec<Anchor>>),
}

const _: () = assert!(std::mem::size_of::<Anchors>() == 24, "anchors stay three words");

impl Anchors {
    pub(crate) fn as_slice(&self) -> &[Anchor] {
        match self {
            Anchors::None => &[],
            Anchors::One(a) => std::slice::from_ref(a),
            Anchors::Many(v) => v,
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.as_slice().is_empty()
    }

    /// XORs `edge` into the entry for `root`, adding the entry if missing.
    pub(crate) fn xor_edge(&mut self, root: u64, edge: u64) {
        match self {
            Anchors::None => *self = Anchors::One(Anchor { root, edge }),
            Anchors::One(a) if a.root == root => a.edge ^= edge,
            Anchors::One(a) => *self = Anchors::Many(Box::new(vec![*a, Anchor { root, edge }])),
            Anchors::Many(v) => match v.iter_mut().find(|a| a.root == root) {
                Some(a) => a.edge ^= edge,
                None => v.push(Anchor { root, edge }),
            },
        }
    }
}

impl FromIterator<Anchor> for Anchors {
    fn from_iter<I: IntoIterator<Item = Anchor>>(iter: I) -> Self {
        let mut out = Anchors::None;
        for a in iter {
            out = match out {
                Anchors::None => Anchors::One(a),
                Anchors::One(first) => Anchors::Many(Box::new(vec![first, a])),
                Anchors::Many(mut v) => {
                    v.push(a);
                    Anchors::Many(v)
                }
            };
        }
        out
    }
}

/// A tuple as a bolt receives it.
#[derive(Debug, Clone)]
pub struct Tuple {
    pub(crate) values: Values,
    pub(crate) meta: Arc<StreamMeta>,
    pub(crate) source_task: TaskId,
    /// Empty for an unanchored tuple; otherwise one entry per spout tree it belongs to.
    pub(crate) anchors: Anchors,
    /// XOR of the edge ids of tuples anchored to this one (Storm's `ackVal`).
    pub(crate) ack_val: AckVal,
}

/// The XOR of edges anchored to a received tuple. Atomic only so that a `Tuple` stays `Sync`;
/// it is touched by one executor thread.
#[derive(Debug, Default)]
pub(crate) struct AckVal(AtomicU64);

impl AckVal {
    /// A load and a store, not a `fetch_xor`: only the executor thread that holds the
    /// collector emits anchored to a tuple (the collector is `&mut`), and a locked
    /// read-modify-write per anchored emit cost its bolt ~20 cycles a tuple.
    pub(crate) fn xor(&self, edge: u64) {
        self.0.store(self.0.load(Ordering::Relaxed) ^ edge, Ordering::Relaxed);
    }

    pub(crate) fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

impl Clone for AckVal {
    fn clone(&self) -> Self {
        AckVal(AtomicU64::new(self.get()))
    }
}

impl From<u64> for AckVal {
    fn from(v: u64) -> Self {
        AckVal(AtomicU64::new(v))
    }
}

// The small accessors below are `#[inline]` so that bolts in other crates can inline them
// (a plain function is not inlined across crates without LTO).
impl Tuple {
    /// The values, in field order.
    #[inline]
    pub fn values(&self) -> &[Value] {
        &self.values
    }

    /// The value at `index`.
    #[inline]
    pub fn get(&self, index: usize) -> Option<&Value> {
        self.values.get(index)
    }

    /// The value of field `name`.
    pub fn get_by_field(&self, name: &str) -> Option<&Value> {
        self.meta.fields.index_of(name).and_then(|i| self.values.get(i))
    }

    /// The text at `index`, if it is text.
    #[inline]
    pub fn get_str(&self, index: usize) -> Option<&str> {
        self.get(index).and_then(Value::as_str)
    }

    /// The integer at `index`, if it is one.
    #[inline]
    pub fn get_int(&self, index: usize) -> Option<i64> {
        self.get(index).and_then(Value::as_int)
    }

    /// The stream's fields.
    pub fn fields(&self) -> &Fields {
        &self.meta.fields
    }

    /// The emitting component.
    pub fn source_component(&self) -> &ComponentId {
        &self.meta.component
    }

    /// The stream the tuple came on.
    pub fn source_stream(&self) -> &str {
        &self.meta.stream
    }

    /// The emitting task.
    #[inline]
    pub fn source_task(&self) -> TaskId {
        self.source_task
    }

    /// Whether this is a tick tuple (Storm's `TupleUtils.isTick`).
    #[inline]
    pub fn is_tick(&self) -> bool {
        self.meta.stream == TICK_STREAM && self.meta.component.as_str() == SYSTEM_COMPONENT
    }

    /// The spout trees this tuple is part of (empty when unanchored or acking is off).
    pub fn anchors(&self) -> &[Anchor] {
        self.anchors.as_slice()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAX: usize = 4096;

    #[test]
    fn the_text_cache_gives_equal_values_and_stops_looking_when_texts_keep_missing() {
        let mut cache = TextCache::new(MAX);
        assert_eq!(Value::Str(cache.get("word")), Value::from("word"));
        assert_eq!(Value::Str(cache.get("word")), Value::from("word"));
        let long = "a text longer than twenty-three bytes";
        assert_eq!(Value::Str(cache.get(long)), Value::from(long));
        assert_eq!(cache.len(), 1, "only short text is kept");
        // Distinct ids fill its buckets, then replace texts: it gives up after `MAX` of those.
        let (mut n, mut most) = (0, 0);
        while !cache.off && n < 4 * MAX {
            let id = format!("id{n}");
            assert_eq!(Value::Str(cache.get(&id)), Value::from(id.as_str()));
            most = most.max(cache.len());
            n += 1;
        }
        assert!(cache.off, "still looking after {n} distinct ids");
        assert!((MAX / 2..=MAX).contains(&most), "held at most {most} texts in {MAX} slots");
        // `most` counts "word", kept before the ids.
        assert!(n + 1 >= MAX + most, "gave up after {n} ids, holding {most}");
        assert!(cache.len() == 0 && cache.buckets.is_empty(), "a cache that only misses is dropped");
        assert_eq!(Value::Str(cache.get("word")), Value::from("word"));
    }

    /// A vocabulary (here 2,000 words of every inline length, differing anywhere) settles in
    /// a split bolt's cache: after one pass each lookup hits, and gives the text looked up.
    #[test]
    fn the_text_cache_grows_until_a_vocabulary_hits() {
        let mut cache = TextCache::new(65_536);
        let words: Vec<String> = (0..2000u32)
            .map(|i| {
                let len = 1 + (i as usize % INLINE_TEXT_MAX);
                let mut w: Vec<u8> = (0..len).map(|k| b'a' + (k % 26) as u8).collect();
                // Differ in one byte, at the start, the middle or the end by turns.
                let at = [0, len / 2, len - 1][i as usize % 3];
                w[at] = b'A' + (i / 69 % 26) as u8;
                if len > 2 {
                    w[(at + 1) % len] = b'0' + (i % 10) as u8;
                }
                String::from_utf8(w).expect("ascii")
            })
            .collect();
        let distinct: std::collections::HashSet<&String> = words.iter().collect();
        for w in &words {
            assert_eq!(cache.get(w).as_str(), w);
        }
        assert_eq!(cache.len(), distinct.len(), "every word kept");
        assert_eq!(cache.evictions, 0, "none replaced");
        for w in &words {
            let t = cache.get(w);
            assert_eq!(t.as_str(), w);
            let bucket = cache.buckets.get(cache.buckets.bucket_of(w.as_bytes())).expect("a bucket");
            assert!(bucket.contains(&Some(t)), "{w} kept in its bucket");
        }
        assert_eq!(cache.len(), distinct.len());
        assert_eq!(cache.evictions, 0);
    }

    /// `same_bytes` agrees with `==` for every length up to 40 bytes, on equal texts and on
    /// texts differing in any one byte or in length; a `TextRef` finds the `Text` of every
    /// such length in a set (it hashes as the `Text` does) and not a text one byte off.
    #[test]
    fn short_texts_compare_and_are_found_by_a_str_at_every_length() {
        let base: Vec<u8> = (0..40u8).map(|i| b'a' + i % 26).collect();
        let mut set = hashbrown::HashSet::<Text, TextHasher>::default();
        for n in 0..=base.len() {
            let a = &base[..n];
            assert!(same_bytes(a, &base[..n]), "equal, {n} bytes");
            if n > 0 {
                assert!(!same_bytes(a, &base[..n - 1]), "one byte shorter, {n} bytes");
            }
            for i in 0..n {
                let mut b = a.to_vec();
                b[i] ^= 0x20;
                assert!(!same_bytes(a, &b), "byte {i} of {n} differs");
            }
            let text = std::str::from_utf8(a).expect("ascii");
            set.insert(Text::new(text));
            assert!(set.get(&TextRef(text)).is_some_and(|t| t.as_str() == text), "{n} bytes found");
            let mut off = a.to_vec();
            if let Some(last) = off.last_mut() {
                *last = b'-';
                assert!(set.get(&TextRef(std::str::from_utf8(&off).expect("ascii"))).is_none());
            }
        }
    }

    /// Anchors keep one entry per tree: an edge for a tree already there is XORed into it,
    /// a new tree is added, from none through one (inline) to many (on the heap).
    #[test]
    fn anchors_keep_one_entry_per_tree_as_they_grow() {
        let mut anchors = Anchors::None;
        for root in 0..100u64 {
            anchors.xor_edge(root, root << 8);
            anchors.xor_edge(root, 1);
        }
        let entries = anchors.as_slice();
        assert_eq!(entries.len(), 100);
        assert!(entries.iter().enumerate().all(|(i, a)| a.root == i as u64 && a.edge == (a.root << 8) ^ 1));
        assert!(matches!(anchors, Anchors::Many(_)));
        let mut one = Anchors::None;
        one.xor_edge(7, 1);
        one.xor_edge(7, 3);
        assert_eq!(one, Anchors::One(Anchor { root: 7, edge: 2 }));
        let collected: Anchors = entries.iter().copied().collect();
        assert_eq!(collected, anchors);
        assert_eq!(std::iter::once(Anchor { root: 7, edge: 2 }).collect::<Anchors>(), one);
        assert_eq!(std::iter::empty().collect::<Anchors>(), Anchors::None);
    }

    /// A text counted in `rest` is long, or its bucket is full (else a lookup that stops at a
    /// free slot would miss it).
    fn assert_rest_only_where_buckets_are_full(counts: &TextCounts) {
        for text in counts.rest.keys() {
            if text.len() <= INLINE_TEXT_MAX {
                let bucket = counts.buckets.get(counts.buckets.bucket_of(text.as_bytes())).expect("a bucket");
                assert!(bucket.iter().all(Option::is_some), "{text:?} in rest beside a free slot");
            }
        }
    }

    /// Counts agree with a map's, text by text, over 300,000 additions of 30,000 texts of 0 to
    /// 40 bytes (inline and long), through every doubling of the buckets.
    #[test]
    fn text_counts_agree_with_a_map_for_short_and_long_texts() {
        let mut counts = TextCounts::default();
        let mut expected = std::collections::HashMap::<String, i64>::new();
        let mut x = 0x2545_f491_4f6c_dd1d_u64;
        for _ in 0..300_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let id = x % 30_000;
            let text = format!("{id:x}{}", "-".repeat((id % 37) as usize));
            let want = expected.entry(text.clone()).or_default();
            *want += 1;
            assert_eq!(counts.add_one(&Text::new(&text)), *want, "{text}");
        }
        assert_eq!(counts.len(), expected.len());
        for (text, n) in &expected {
            assert_eq!(counts.get(text), *n, "{text}");
        }
        assert_eq!(counts.get("never added"), 0);
        assert_rest_only_where_buckets_are_full(&counts);
    }

    /// A text whose bucket is full while the buckets are sparse is counted in `rest`, found
    /// there, and moved into the buckets when they double and its bucket has room.
    #[test]
    fn a_text_whose_bucket_is_full_is_counted_in_rest_until_the_buckets_double() {
        // No spreading: only half the slots held, or a full bucket with an eighth held, grows.
        let mut counts = TextCounts::with_spread_max(0);
        counts.add_one(&Text::new("first"));
        assert_eq!(counts.buckets.len(), FIRST_BUCKETS);
        // Five more texts of one bucket: the fifth finds it full with 5 of 64 slots held.
        let target = counts.buckets.bucket_of(b"first");
        let same: Vec<Text> = (0..)
            .map(|i| Text::new(format!("w{i}")))
            .filter(|t| counts.buckets.bucket_of(t.as_bytes()) == target)
            .take(4)
            .collect();
        for t in &same[..3] {
            assert_eq!(counts.add_one(t), 1);
        }
        assert!(counts.rest.is_empty());
        assert_eq!(counts.add_one(&same[3]), 1);
        assert_eq!(counts.add_one(&same[3]), 2, "found in rest");
        assert_eq!(counts.rest.get(&TextRef(same[3].as_str())), Some(&2));
        assert_eq!(counts.buckets.len(), FIRST_BUCKETS, "sparse: not grown");
        assert_rest_only_where_buckets_are_full(&counts);
        // Other texts until the buckets double (half the slots held).
        let mut i = 0;
        while counts.buckets.len() == FIRST_BUCKETS {
            counts.add_one(&Text::new(format!("other{i}")));
            i += 1;
        }
        assert_rest_only_where_buckets_are_full(&counts);
        assert_eq!(counts.get(same[3].as_str()), 2);
        assert_eq!(counts.add_one(&same[3]), 3);
        for t in &same[..3] {
            assert_eq!(counts.get(t.as_str()), 1);
        }
        assert_eq!(counts.len(), 5 + i);
    }

    #[test]
    fn a_full_cache_that_keeps_hitting_stays() {
        let mut cache = TextCache::new(MAX);
        let mut i = 0;
        while !cache.full() {
            cache.get(&format!("w{i}"));
            i += 1;
        }
        for i in 0..3 * MAX {
            cache.get(&format!("w{}", i % 100));
            if i % 2 == 0 {
                cache.get(&format!("new{i}"));
            }
        }
        assert!(!cache.off, "hits outnumber misses");
    }
}
