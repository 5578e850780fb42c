//! Built-in components: the benchmark's sentence generator, word split, word count, a filter,
//! and log / stdout sinks. Registered under the names in [`crate::flux::Registry::with_builtins`].

use std::collections::VecDeque;
use std::io::Write;
use std::sync::OnceLock;
use std::time::Instant;

use serde::Deserialize;

use crate::collector::{BoltCollector, SpoutCollector};
use crate::component::{Bolt, ComponentError, OutputDeclarer, Spout, TopologyContext};
use crate::tuple::{Fields, Text, TextCache, TextCounts, Tuple, Value};

/// The reference corpus's 32 words, in order (BENCHMARKS.md).
pub const WORDS: [&str; 32] = [
    "the",
    "cow",
    "jumped",
    "over",
    "moon",
    "an",
    "apple",
    "a",
    "day",
    "keeps",
    "doctor",
    "away",
    "four",
    "score",
    "and",
    "seven",
    "years",
    "ago",
    "snow",
    "white",
    "dwarfs",
    "i",
    "am",
    "at",
    "two",
    "with",
    "nature",
    "stream",
    "processing",
    "storm",
    "squall",
    "tuple",
];
/// Sentences in the reference corpus.
pub const SENTENCE_COUNT: usize = 1024;
const LCG_A: u64 = 6364136223846793005;
const LCG_C: u64 = 1442695040888963407;
const MAX_SENTENCE_BYTES: usize = 100;
/// The most a rate-limited generator emits at once after a pause (a token bucket this deep).
pub const MAX_BURST: std::time::Duration = std::time::Duration::from_millis(2);

/// Reference sentence `k` (BENCHMARKS.md): a 64-bit LCG seeded with `k` picks words until the
/// next one would take the sentence past 100 bytes.
pub fn reference_sentence(k: u64) -> String {
    let mut x = k.wrapping_mul(LCG_A).wrapping_add(LCG_C);
    let mut s = String::with_capacity(MAX_SENTENCE_BYTES);
    loop {
        x = x.wrapping_mul(LCG_A).wrapping_add(LCG_C);
        let word = WORDS[((x >> 33) % 32) as usize];
        let extra = if s.is_empty() { word.len() } else { word.len() + 1 };
        if s.len() + extra > MAX_SENTENCE_BYTES {
            return s;
        }
        if !s.is_empty() {
            s.push(' ');
        }
        s.push_str(word);
    }
}

/// The 1024 reference sentences, built once for the process (~100 KB, never freed).
///
/// Each is static text, so a copy emitted and dropped touches no reference count: as shared
/// buffers, every sentence was a reference count incremented on the spout's core and
/// decremented on the split bolt's.
pub fn reference_corpus() -> &'static [Text] {
    static CORPUS: OnceLock<Vec<Text>> = OnceLock::new();
    CORPUS.get_or_init(|| {
        (0..SENTENCE_COUNT as u64)
            .map(|k| Text::new_static(Box::leak(reference_sentence(k).into_boxed_str())))
            .collect()
    })
}

/// Parameters of [`SentenceSpout`].
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SentenceParams {
    /// Sentences per second over all tasks; `null` for as fast as possible.
    pub rate_per_sec: Option<f64>,
    /// Sentences to emit over all tasks; `null` for unbounded.
    pub count: Option<u64>,
    /// Offset into the corpus: item `i` is sentence `(seed + i) % 1024`.
    pub seed: u64,
    /// Emit with message ids (tracked by acking, replayed on failure).
    pub reliable: bool,
}

impl Default for SentenceParams {
    fn default() -> Self {
        SentenceParams { rate_per_sec: None, count: None, seed: 0, reliable: true }
    }
}

/// Emits the reference corpus's stream items on field `sentence`; task `j` of `n` takes items
/// `j, j+n, ...`. With `reliable`, a failed item is replayed before new ones.
#[derive(Debug)]
pub struct SentenceSpout {
    params: SentenceParams,
    next_item: u64,
    step: u64,
    rate_per_task: Option<f64>,
    /// With a rate, from activation on.
    pacer: Option<TokenBucket>,
    replay: VecDeque<u64>,
}

/// A token bucket holding at most [`MAX_BURST`] worth of tokens at `rate` per second: a spout
/// that was not scheduled for a while does not flood the topology to catch up.
#[derive(Debug, Clone, Copy)]
struct TokenBucket {
    rate: f64,
    tokens: f64,
    /// When it was last refilled.
    last: Instant,
}

impl TokenBucket {
    fn new(rate: f64, now: Instant) -> Self {
        TokenBucket { rate, tokens: 0.0, last: now }
    }

    /// Takes a token if there is one. The bucket is refilled (`clock` read) only once it is
    /// empty, which gives the same tokens as refilling at every call (they only fall in
    /// between): one clock read per burst instead of one per sentence (at half load a pass of
    /// the spout's loop emits 3-4 sentences, and those reads were ~2% of its thread).
    fn take(&mut self, clock: impl FnOnce() -> Instant) -> bool {
        if self.tokens < 1.0 {
            let now = clock();
            let cap = (self.rate * MAX_BURST.as_secs_f64()).max(1.0);
            let earned = now.saturating_duration_since(self.last).as_secs_f64() * self.rate;
            self.tokens = (self.tokens + earned).min(cap);
            self.last = now;
            if self.tokens < 1.0 {
                return false;
            }
        }
        self.tokens -= 1.0;
        true
    }
}

impl SentenceSpout {
    /// A generator with these parameters.
    pub fn new(params: SentenceParams) -> Self {
        SentenceSpout {
            params,
            next_item: 0,
            step: 1,
            rate_per_task: None,
            pacer: None,
            replay: VecDeque::new(),
        }
    }
}

impl Spout for SentenceSpout {
    fn declare_outputs(&self, declarer: &mut OutputDeclarer) {
        declarer.declare(Fields::new(["sentence"]));
    }

    fn open(&mut self, context: &TopologyContext) -> Result<(), ComponentError> {
        let n = context.component_tasks.len().max(1) as u64;
        self.next_item = context.task_index() as u64;
        self.step = n;
        self.rate_per_task = self.params.rate_per_sec.map(|r| r / n as f64);
        Ok(())
    }

    fn activate(&mut self) {
        self.pacer = self.rate_per_task.map(|rate| TokenBucket::new(rate, Instant::now()));
    }

    fn next_tuple(&mut self, out: &mut SpoutCollector<'_>) -> Result<(), ComponentError> {
        if let Some(pacer) = self.pacer.as_mut()
            && !pacer.take(Instant::now)
        {
            return Ok(());
        }
        let item = match self.replay.pop_front() {
            Some(i) => i,
            None => {
                if self.params.count.is_some_and(|c| self.next_item >= c) {
                    return Ok(());
                }
                let i = self.next_item;
                self.next_item += self.step;
                i
            }
        };
        let corpus = reference_corpus();
        let sentence =
            corpus[((self.params.seed.wrapping_add(item)) % SENTENCE_COUNT as u64) as usize].clone();
        out.emit([Value::Str(sentence)], self.params.reliable.then_some(item))?;
        Ok(())
    }

    fn fail(&mut self, msg_id: u64) {
        self.replay.push_back(msg_id);
    }
}

/// Parameters of [`SplitSentence`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SplitParams {
    /// The field holding the sentence (text, or UTF-8 bytes such as a Kafka message's `value`);
    /// default: the first field.
    pub field: Option<String>,
}

/// Splits a sentence on spaces into `word` tuples, anchored, then acks. A tuple without the
/// field, or whose sentence is not text, is acked and emits nothing.
#[derive(Debug)]
pub struct SplitSentence {
    params: SplitParams,
    /// Words seen so far (up to [`WORD_CACHE_MAX`]), built once: an emitted word is a copy.
    words: TextCache,
}

impl Default for SplitSentence {
    fn default() -> Self {
        SplitSentence::new(SplitParams::default())
    }
}

/// The most words a split task keeps built (slots of 24 bytes: at most 1.5 MB); beyond them a
/// new word replaces another or is built per use.
const WORD_CACHE_MAX: usize = 65_536;

impl SplitSentence {
    pub fn new(params: SplitParams) -> Self {
        SplitSentence { params, words: TextCache::new(WORD_CACHE_MAX) }
    }
}

impl Bolt for SplitSentence {
    fn declare_outputs(&self, declarer: &mut OutputDeclarer) {
        declarer.declare(Fields::new(["word"]));
    }

    fn execute(&mut self, input: &Tuple, out: &mut BoltCollector<'_>) -> Result<(), ComponentError> {
        let value = match &self.params.field {
            Some(name) => input.get_by_field(name),
            None => input.get(0),
        };
        let sentence =
            value.and_then(|v| v.as_str().or_else(|| v.as_bytes().and_then(|b| std::str::from_utf8(b).ok())));
        if let Some(sentence) = sentence {
            for word in Words(sentence) {
                let word = self.words.get(word);
                out.emit_value(&[input], word)?;
            }
        }
        out.ack(input);
        Ok(())
    }
}

/// The words of a sentence: its text between spaces (`split(' ')`), empty ones skipped.
///
/// The next space is looked for eight bytes at a time, in a machine word: most words end in
/// their first eight bytes, so the search takes no branch per byte. (`str::split(' ')` called
/// `memchr` and then `bcmp`, for the one-byte space, per word; a byte loop mispredicted the end
/// of every word.)
struct Words<'a>(&'a str);

/// The index of the first space in `bytes`, or its length.
#[inline]
fn next_space(bytes: &[u8]) -> usize {
    const ONES: u64 = u64::from_ne_bytes([0x01; 8]);
    const HIGHS: u64 = u64::from_ne_bytes([0x80; 8]);
    const SPACES: u64 = u64::from_ne_bytes([b' '; 8]);
    let mut at = 0;
    while let Some(chunk) = bytes.get(at..).and_then(<[u8]>::first_chunk::<8>) {
        // A byte of `x` is zero where the chunk has a space; the lowest zero byte is the
        // lowest byte whose high bit survives (higher ones may be false hits, never lower).
        let x = u64::from_le_bytes(*chunk) ^ SPACES;
        let found = x.wrapping_sub(ONES) & !x & HIGHS;
        if found != 0 {
            return at + (found.trailing_zeros() / 8) as usize;
        }
        at += 8;
    }
    let tail = bytes.get(at..).unwrap_or_default();
    at + tail.iter().position(|b| *b == b' ').unwrap_or(tail.len())
}

impl<'a> Iterator for Words<'a> {
    type Item = &'a str;

    #[inline]
    fn next(&mut self) -> Option<&'a str> {
        while !self.0.is_empty() {
            let end = next_space(self.0.as_bytes());
            // A space is one byte, so `end` and `end + 1` are character boundaries.
            let (word, rest) = self.0.split_at_checked(end)?;
            self.0 = rest.get(1..).unwrap_or_default();
            if !word.is_empty() {
                return Some(word);
            }
        }
        None
    }
}

/// Parameters of [`WordCount`].
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WordCountParams {
    /// Emit `(word, count)` after each update.
    pub emit: bool,
}

impl Default for WordCountParams {
    fn default() -> Self {
        WordCountParams { emit: true }
    }
}

/// Running count per word (field 0); emits `(word, count)` anchored when `emit`, then acks.
#[derive(Debug, Default)]
pub struct WordCount {
    params: WordCountParams,
    counts: TextCounts,
}

impl WordCount {
    /// A counter with these parameters.
    pub fn new(params: WordCountParams) -> Self {
        WordCount { params, counts: TextCounts::default() }
    }

    /// The count of `word` so far.
    pub fn count(&self, word: &str) -> i64 {
        self.counts.get(word)
    }
}

impl Bolt for WordCount {
    fn declare_outputs(&self, declarer: &mut OutputDeclarer) {
        declarer.declare(Fields::new(["word", "count"]));
    }

    fn execute(&mut self, input: &Tuple, out: &mut BoltCollector<'_>) -> Result<(), ComponentError> {
        if let Some(Value::Str(word)) = input.get(0) {
            let count = self.counts.add_one(word);
            if self.params.emit {
                out.emit(&[input], crate::values![word.clone(), count])?;
            }
        }
        out.ack(input);
        Ok(())
    }
}

/// Parameters of [`Filter`].
#[derive(Debug, Clone, PartialEq, Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
pub struct FilterParams {
    /// The input's fields, re-declared as this bolt's output fields.
    pub fields: Vec<String>,
    /// The field tested.
    pub field: String,
    /// Keep tuples whose field equals this text or number.
    pub equals: Option<serde_yaml_ng::Value>,
    /// Keep tuples whose (text) field contains this.
    pub contains: Option<String>,
    /// Keep tuples whose (numeric) field is at least this.
    pub min: Option<f64>,
    /// Invert the test.
    pub negate: bool,
}

/// Passes on (anchored) the tuples that satisfy a test on one field, acks all.
#[derive(Debug)]
pub struct Filter {
    params: FilterParams,
}

impl Filter {
    /// Checks that the tested field is declared.
    pub fn new(params: FilterParams) -> Result<Self, String> {
        if !params.fields.contains(&params.field) {
            return Err(format!("field {:?} is not among fields {:?}", params.field, params.fields));
        }
        Ok(Filter { params })
    }

    fn keep(&self, v: Option<&Value>) -> bool {
        let p = &self.params;
        let mut ok = true;
        if let Some(want) = &p.equals {
            ok &= match (v, want) {
                (Some(Value::Str(s)), serde_yaml_ng::Value::String(w)) => &**s == w.as_str(),
                (Some(Value::Int(i)), serde_yaml_ng::Value::Number(n)) => n.as_i64() == Some(*i),
                (Some(Value::Float(f)), serde_yaml_ng::Value::Number(n)) => n.as_f64() == Some(*f),
                (Some(Value::Bool(b)), serde_yaml_ng::Value::Bool(w)) => b == w,
                _ => false,
            };
        }
        if let Some(sub) = &p.contains {
            ok &= v.and_then(Value::as_str).is_some_and(|s| s.contains(sub.as_str()));
        }
        if let Some(min) = p.min {
            ok &= v.and_then(Value::as_float).is_some_and(|x| x >= min);
        }
        ok != p.negate
    }
}

impl Bolt for Filter {
    fn declare_outputs(&self, declarer: &mut OutputDeclarer) {
        declarer.declare(Fields::new(self.params.fields.iter().cloned()));
    }

    fn execute(&mut self, input: &Tuple, out: &mut BoltCollector<'_>) -> Result<(), ComponentError> {
        if self.keep(input.get_by_field(&self.params.field)) {
            out.emit(&[input], input.values().to_vec())?;
        }
        out.ack(input);
        Ok(())
    }
}

/// Logs every tuple at `info` through `tracing` (target `worker::builtin`), then acks.
#[derive(Debug, Default)]
pub struct LogSink;

impl Bolt for LogSink {
    fn execute(&mut self, input: &Tuple, out: &mut BoltCollector<'_>) -> Result<(), ComponentError> {
        LogSinkAt::default().execute(input, out)
    }
}

/// The `log` bolt: every tuple logged at `level` (its `level` param, `info` by default), then
/// acked.
#[derive(Debug, Default)]
pub struct LogSinkAt {
    pub level: LogSinkLevel,
}

/// The `log` bolt's params: `{level: debug}` (trace, debug, info, warn, error; default info).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogSinkLevel {
    Trace,
    Debug,
    #[default]
    Info,
    Warn,
    Error,
}

/// The `log` bolt's params.
#[derive(Debug, Clone, Copy, Default, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LogSinkParams {
    pub level: LogSinkLevel,
}

impl Bolt for LogSinkAt {
    fn execute(&mut self, input: &Tuple, out: &mut BoltCollector<'_>) -> Result<(), ComponentError> {
        let (component, stream, values) = (input.source_component(), input.source_stream(), input.values());
        match self.level {
            LogSinkLevel::Trace => tracing::trace!(component = %component, stream, values = ?values, "tuple"),
            LogSinkLevel::Debug => tracing::debug!(component = %component, stream, values = ?values, "tuple"),
            LogSinkLevel::Info => tracing::info!(component = %component, stream, values = ?values, "tuple"),
            LogSinkLevel::Warn => tracing::warn!(component = %component, stream, values = ?values, "tuple"),
            LogSinkLevel::Error => tracing::error!(component = %component, stream, values = ?values, "tuple"),
        }
        out.ack(input);
        Ok(())
    }
}

/// Prints every tuple's values, tab-separated, one line each, then acks.
#[derive(Debug, Default)]
pub struct StdoutSink;

impl Bolt for StdoutSink {
    fn execute(&mut self, input: &Tuple, out: &mut BoltCollector<'_>) -> Result<(), ComponentError> {
        let line: Vec<String> = input.values().iter().map(ToString::to_string).collect();
        let mut stdout = std::io::stdout().lock();
        writeln!(stdout, "{}", line.join("\t"))?;
        out.ack(input);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The bucket grants `rate` tokens a second whatever the calls' spacing, at most
    /// `MAX_BURST` of them after a pause, and reads the clock only when it is empty.
    #[test]
    fn the_token_bucket_keeps_its_rate_and_reads_the_clock_once_per_burst() {
        use std::cell::Cell;
        use std::time::Duration;
        let t0 = Instant::now();
        let mut bucket = TokenBucket::new(1000.0, t0);
        // 1 s of calls every 100 us: 10 ticks, one token each ms.
        let (now, reads, mut granted) = (Cell::new(t0), Cell::new(0u32), 0u32);
        let clock = || {
            reads.set(reads.get() + 1);
            now.get()
        };
        for _ in 0..10_000 {
            now.set(now.get() + Duration::from_micros(100));
            granted += u32::from(bucket.take(clock));
        }
        assert!((999..=1000).contains(&granted), "granted {granted} tokens in 1 s at 1000/s");
        assert_eq!(reads.get(), 10_000, "an empty bucket reads the clock at every call");
        // Calls in bursts every 10 ms: 10 tokens each, one clock read per burst.
        reads.set(0);
        granted = 0;
        for _ in 0..100 {
            now.set(now.get() + Duration::from_millis(10));
            // MAX_BURST (2 ms) caps what a 10 ms pause earns.
            while bucket.take(clock) {
                granted += 1;
            }
        }
        assert_eq!(granted, 200, "a pause earns at most MAX_BURST worth of tokens");
        // Per burst: the read that refills, and the one that finds it empty again.
        assert_eq!(reads.get(), 200, "the clock is read only when the bucket is empty");
    }

    #[test]
    fn corpus_matches_the_reference_checks() {
        assert_eq!(
            reference_sentence(0),
            "day ago dwarfs score stream two a the stream seven snow apple storm dwarfs squall keeps snow stream"
        );
        let corpus = reference_corpus();
        assert!(corpus.iter().all(|s| s.len() <= 100));
        let bytes: usize = corpus.iter().map(|s| s.len()).sum();
        let words: Vec<usize> = corpus.iter().map(|s| s.split(' ').count()).collect();
        assert_eq!(bytes, 99_820);
        assert_eq!(words.iter().sum::<usize>(), 19_354);
        let items = |n: usize| -> usize { (0..n).map(|i| words[i % SENTENCE_COUNT]).sum() };
        assert_eq!(items(2_000_000), 37_800_767);
    }

    #[test]
    fn a_sentence_splits_into_the_words_between_its_spaces() {
        let cases = [
            "day ago dwarfs",
            "  two  spaces   and more ",
            "",
            " ",
            "one",
            "tab\tstays in\nits word",
            "äpfel über straße 水 🌧 squall",
            "a b c d e f g h i j k l m n o p q r s t u v w x y z",
        ];
        // Spaces, runs of spaces and multi-byte characters on and around every edge of the
        // eight-byte words the search reads, and words longer than one.
        let mut long: Vec<String> = Vec::new();
        for len in [63, 64, 65, 127, 128, 129, 200] {
            for word in ["x", "ab", "äb", "水", "seven", "dwarfs"] {
                for gap in [" ", "  "] {
                    let mut s = String::new();
                    while s.len() < len {
                        s.push_str(word);
                        s.push_str(gap);
                    }
                    long.push(s.clone());
                    long.push(s.trim_end().to_owned());
                    long.push(format!("{}{}", "y".repeat(len), s));
                }
            }
        }
        for sentence in cases.iter().copied().chain(long.iter().map(String::as_str)) {
            let expected: Vec<&str> = sentence.split(' ').filter(|w| !w.is_empty()).collect();
            assert_eq!(Words(sentence).collect::<Vec<_>>(), expected, "{sentence:?}");
        }
        let corpus = reference_corpus();
        let words: usize = corpus.iter().map(|s| Words(s).count()).sum();
        assert_eq!(words, 19_354);
    }

    #[test]
    fn split_words_are_built_once_and_only_short_ones_kept() {
        let mut split = SplitSentence::default();
        let long = "a-word-longer-than-23-bytes";
        for w in ["cow", "äpfel", "cow", long, "", long, "moon"] {
            let t = split.words.get(w);
            assert_eq!(t.as_str(), w);
            assert_eq!(Value::Str(t), Value::from(w));
        }
        let mut kept: Vec<&str> = split.words.iter().map(Text::as_str).collect();
        kept.sort_unstable();
        assert_eq!(kept, ["", "cow", "moon", "äpfel"]);
        let mut full = SplitSentence::default();
        for i in 0..WORD_CACHE_MAX + 10 {
            assert_eq!(full.words.get(&format!("w{i}")).as_str(), format!("w{i}"));
        }
        let held = full.words.len();
        assert!((WORD_CACHE_MAX / 2..=WORD_CACHE_MAX).contains(&held), "{held} words kept");
    }
}
