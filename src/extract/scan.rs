//! The walk over a body's bytes: one pass that descends only along a shape's pointers,
//! captures each leaf as its raw JSON text for [`EventCaps`](super::walk::EventCaps), and checks everything else for
//! its grammar only, iteratively, so the depth of unrelated parts of a document never matters.
//!
//! It accepts exactly the bodies serde_json's `from_slice` accepted when the walk was a serde
//! visitor over it (`oracle.rs` keeps that visitor, and a property test compares the two on
//! bodies made and mangled at random):
//! - every value's grammar (RFC 8259): `true`, `false`, `null`; numbers without leading zeros;
//!   strings without raw control characters and with the escapes RFC 8259 section 7 lists
//!   (`\u` and four hex digits); no trailing comma; nothing but whitespace after the document;
//! - UTF-8 (and escapes decoded, surrogates paired) only where a value is read: object keys
//!   on the pointers' paths, captured leaves (UTF-8 over the whole value), and a string met
//!   where a path expected an object or array; a number met there must be finite (`1e400`
//!   is not). Strings elsewhere are not decoded, as serde_json's skipper does not;
//! - containers nested along the pointers' paths at most 127 deep (serde_json's recursion
//!   limit).
//!
//! What it costs (callgrind, the benchmark's 312-byte `vehicle.position` body, four leaves
//! of fourteen keys): the walk 5,934 instructions against 8,412 for the serde visitor, the
//! whole extraction 7,767 against 10,230.

use std::borrow::Cow;

mod descend;

/// Eight bytes of a JSON string, little-endian, flagged (bit 7 of a byte) at each byte a
/// string cannot hold as it is: a quote, a backslash or a control character; 0 for none. The
/// lowest flag is exact (a borrow can flag only bytes after a true one), so
/// `trailing_zeros() / 8` is the first such byte of the eight. serde_json's test; used by the
/// walk's strings and by the 503 document's writer.
#[inline]
pub fn string_stops(w: u64) -> u64 {
    // Non-zero at each zero byte of `x`, exact at the lowest.
    let zero = |x: u64| x.wrapping_sub(ONES) & !x & HIGHS;
    zero(w ^ (ONES * u64::from(b'"')))
        | zero(w ^ (ONES * u64::from(b'\\')))
        | (w.wrapping_sub(ONES * 0x20) & !w & HIGHS)
}

/// A one in each of a word's eight bytes.
const ONES: u64 = u64::from_ne_bytes([0x01; 8]);
/// The high bit of each of a word's eight bytes.
const HIGHS: u64 = u64::from_ne_bytes([0x80; 8]);

/// The body is not JSON as the walk reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct NotJson;

type Result<T> = std::result::Result<T, NotJson>;

/// Containers nested along the pointers' paths beyond this many: not read (serde_json's
/// recursion limit of 128 counted as it counts it).
const MAX_DEPTH: usize = 127;

/// A body's bytes and the walk's place in them.
pub(super) struct Scanner<'de> {
    bytes: &'de [u8],
    at: usize,
}

/// The open containers of a skipped value: bit set for an object. The first 64 levels in a
/// word, deeper ones in a vector that allocates only then.
#[derive(Default)]
struct Frames {
    low: u64,
    high: Vec<bool>,
    len: usize,
}

impl Frames {
    fn push(&mut self, object: bool) {
        if self.len < 64 {
            let bit = 1u64 << self.len;
            self.low = if object {
                self.low | bit
            } else {
                self.low & !bit
            };
        } else {
            self.high.push(object);
        }
        self.len += 1;
    }

    /// The innermost open container (`Some(true)`: an object).
    fn top(&self) -> Option<bool> {
        match self.len {
            0 => None,
            n if n <= 64 => Some(self.low >> (n - 1) & 1 == 1),
            _ => self.high.last().copied(),
        }
    }

    fn pop(&mut self) {
        if self.len > 64 {
            self.high.pop();
        }
        self.len = self.len.saturating_sub(1);
    }
}

/// What a string's scan saw between its quotes.
#[derive(Debug, Clone, Copy)]
struct Seen {
    /// A backslash escape.
    escaped: bool,
    /// Only ASCII bytes (so valid UTF-8 as it is).
    ascii: bool,
}

impl<'de> Scanner<'de> {
    pub(super) fn new(bytes: &'de [u8]) -> Self {
        Scanner { bytes, at: 0 }
    }

    /// Only whitespace is left.
    pub(super) fn end(&mut self) -> Result<()> {
        match self.peek_ws() {
            None => Ok(()),
            Some(_) => Err(NotJson),
        }
    }

    /// The next byte past whitespace (RFC 8259's four), not consumed.
    #[inline]
    fn peek_ws(&mut self) -> Option<u8> {
        while let Some(&b) = self.bytes.get(self.at) {
            match b {
                b' ' | b'\n' | b'\t' | b'\r' => self.at += 1,
                _ => return Some(b),
            }
        }
        None
    }

    #[inline]
    fn peek(&self) -> Option<u8> {
        self.bytes.get(self.at).copied()
    }

    /// Consumes `byte` after whitespace.
    #[inline]
    fn expect(&mut self, byte: u8) -> Result<()> {
        if self.peek_ws() == Some(byte) {
            self.at += 1;
            Ok(())
        } else {
            Err(NotJson)
        }
    }

    /// A string's rest, after its opening quote, through its closing one: no raw control
    /// character, escapes as RFC 8259 lists them. Not decoded. Eight bytes at a time while
    /// none of them is a quote, a backslash or a control character (serde_json's test too).
    #[inline]
    fn string(&mut self) -> Result<Seen> {
        let bytes = self.bytes;
        let mut at = self.at;
        let mut high = 0u64;
        let mut escaped = false;
        loop {
            while let Some(chunk) = bytes.get(at..at + 8) {
                let mut word = [0u8; 8];
                word.copy_from_slice(chunk);
                let w = u64::from_le_bytes(word);
                let stop = string_stops(w);
                if stop == 0 {
                    high |= w;
                    at += 8;
                    continue;
                }
                let before = stop.trailing_zeros() / 8;
                high |= w & ((1u64 << (before * 8)) - 1);
                at += before as usize;
                break;
            }
            // The byte that stopped the words, or a byte of the last few.
            let Some(&b) = bytes.get(at) else {
                return Err(NotJson);
            };
            at += 1;
            match b {
                b'"' => {
                    self.at = at;
                    return Ok(Seen {
                        escaped,
                        ascii: high & HIGHS == 0,
                    });
                }
                b'\\' => {
                    escaped = true;
                    self.at = at;
                    self.escape()?;
                    at = self.at;
                }
                0..=0x1f => return Err(NotJson),
                _ => high |= u64::from(b),
            }
        }
    }

    /// An escape's rest, after its backslash.
    fn escape(&mut self) -> Result<()> {
        let Some(&b) = self.bytes.get(self.at) else {
            return Err(NotJson);
        };
        self.at += 1;
        match b {
            b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => Ok(()),
            b'u' => {
                let hex = self.bytes.get(self.at..self.at + 4).ok_or(NotJson)?;
                if !hex.iter().all(u8::is_ascii_hexdigit) {
                    return Err(NotJson);
                }
                self.at += 4;
                Ok(())
            }
            _ => Err(NotJson),
        }
    }

    /// A string's rest, after its opening quote, read as text: UTF-8, escapes decoded
    /// (serde_json's reading, which refuses an unpaired surrogate).
    fn text(&mut self) -> Result<Cow<'de, str>> {
        let start = self.at;
        let seen = self.string()?;
        let bytes = self.bytes;
        let inner = bytes.get(start..self.at - 1).ok_or(NotJson)?;
        if !seen.escaped {
            return std::str::from_utf8(inner)
                .map(Cow::Borrowed)
                .map_err(|_| NotJson);
        }
        let quoted = bytes.get(start - 1..self.at).ok_or(NotJson)?;
        serde_json::from_slice::<String>(quoted)
            .map(Cow::Owned)
            .map_err(|_| NotJson)
    }

    /// A number's grammar: `-`, an integer part without leading zeros, a fraction, an
    /// exponent.
    fn number(&mut self) -> Result<()> {
        if self.peek() == Some(b'-') {
            self.at += 1;
        }
        match self.peek() {
            Some(b'0') => {
                self.at += 1;
                if self.peek().is_some_and(|b| b.is_ascii_digit()) {
                    return Err(NotJson);
                }
            }
            Some(b'1'..=b'9') => {
                self.digits();
            }
            _ => return Err(NotJson),
        }
        if self.peek() == Some(b'.') {
            self.at += 1;
            if self.digits() == 0 {
                return Err(NotJson);
            }
        }
        if matches!(self.peek(), Some(b'e' | b'E')) {
            self.at += 1;
            if matches!(self.peek(), Some(b'+' | b'-')) {
                self.at += 1;
            }
            if self.digits() == 0 {
                return Err(NotJson);
            }
        }
        Ok(())
    }

    /// Digits consumed.
    #[inline]
    fn digits(&mut self) -> usize {
        let start = self.at;
        while self.peek().is_some_and(|b| b.is_ascii_digit()) {
            self.at += 1;
        }
        self.at - start
    }

    /// `true`, `false` or `null`, whichever `word` is.
    fn word(&mut self, word: &[u8]) -> Result<()> {
        if self
            .bytes
            .get(self.at..)
            .is_some_and(|rest| rest.starts_with(word))
        {
            self.at += word.len();
            Ok(())
        } else {
            Err(NotJson)
        }
    }

    /// An object member's key and colon, after the object's `{` or a `,`: its grammar only.
    #[inline]
    fn skip_key(&mut self) -> Result<()> {
        self.expect(b'"')?;
        self.string()?;
        self.expect(b':')
    }

    /// One value, checked for its grammar only and skipped, without recursion.
    #[inline]
    pub(super) fn skip(&mut self) -> Result<()> {
        match self.peek_ws().ok_or(NotJson)? {
            b'"' => {
                self.at += 1;
                self.string().map(drop)
            }
            b'-' | b'0'..=b'9' => self.number(),
            b't' => self.word(b"true"),
            b'f' => self.word(b"false"),
            b'n' => self.word(b"null"),
            _ => self.skip_nested(),
        }
    }

    /// A value that may be an object or array, skipped as [`Scanner::skip`] says.
    fn skip_nested(&mut self) -> Result<()> {
        let mut frames = Frames::default();
        loop {
            match self.peek_ws().ok_or(NotJson)? {
                b'{' => {
                    self.at += 1;
                    if self.peek_ws() == Some(b'}') {
                        self.at += 1;
                    } else {
                        frames.push(true);
                        self.skip_key()?;
                        continue;
                    }
                }
                b'[' => {
                    self.at += 1;
                    if self.peek_ws() == Some(b']') {
                        self.at += 1;
                    } else {
                        frames.push(false);
                        continue;
                    }
                }
                b'"' => {
                    self.at += 1;
                    self.string()?;
                }
                b'-' | b'0'..=b'9' => self.number()?,
                b't' => self.word(b"true")?,
                b'f' => self.word(b"false")?,
                b'n' => self.word(b"null")?,
                _ => return Err(NotJson),
            }
            // After a value: close what it ended, or go on to the next member.
            loop {
                let Some(object) = frames.top() else {
                    return Ok(());
                };
                match self.peek_ws() {
                    Some(b',') => {
                        self.at += 1;
                        if object {
                            self.skip_key()?;
                        }
                        break;
                    }
                    Some(b'}') if object => {
                        self.at += 1;
                        frames.pop();
                    }
                    Some(b']') if !object => {
                        self.at += 1;
                        frames.pop();
                    }
                    _ => return Err(NotJson),
                }
            }
        }
    }

    /// A value where a path expected an object or array: a scalar, read as serde_json reads
    /// one (a string decoded, a number finite), and left.
    fn scalar(&mut self) -> Result<()> {
        match self.peek_ws().ok_or(NotJson)? {
            b'"' => {
                self.at += 1;
                self.text().map(drop)
            }
            b'-' | b'0'..=b'9' => {
                let start = self.at;
                self.number()?;
                let text = self.bytes.get(start..self.at).ok_or(NotJson)?;
                serde_json::from_slice::<f64>(text)
                    .map(drop)
                    .map_err(|_| NotJson)
            }
            b't' => self.word(b"true"),
            b'f' => self.word(b"false"),
            b'n' => self.word(b"null"),
            _ => Err(NotJson),
        }
    }

    /// A leaf's value as its raw JSON text (UTF-8).
    fn capture(&mut self) -> Result<&'de str> {
        self.peek_ws();
        let start = self.at;
        self.skip()?;
        let raw = self.bytes.get(start..self.at).ok_or(NotJson)?;
        std::str::from_utf8(raw).map_err(|_| NotJson)
    }
}
