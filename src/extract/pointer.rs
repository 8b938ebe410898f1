//! JSON pointers (RFC 6901), parsed once when a policy compiles.

use std::fmt;

/// A parsed JSON pointer (RFC 6901): its reference tokens, unescaped (`~1` → `/`, `~0` → `~`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct JsonPointer {
    pub(super) text: String,
    pub(super) tokens: Vec<String>,
}

/// A JSON pointer that is not valid RFC 6901 or does not name a field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid JSON pointer {text:?}: {why}")]
pub struct PointerError {
    text: String,
    why: &'static str,
}

impl JsonPointer {
    /// Parses `text`, which must start with `/` and name at least one token.
    ///
    /// # Errors
    /// [`PointerError`] for an empty pointer, a missing leading `/`, or a `~` not followed by
    /// `0` or `1` (RFC 6901 section 3).
    pub fn parse(text: &str) -> Result<Self, PointerError> {
        let err = |why| PointerError {
            text: text.to_owned(),
            why,
        };
        let Some(rest) = text.strip_prefix('/') else {
            return Err(err(
                "must start with '/' (the whole document cannot be a field)",
            ));
        };
        let mut tokens = Vec::new();
        for raw in rest.split('/') {
            let mut token = String::with_capacity(raw.len());
            let mut chars = raw.chars();
            while let Some(c) = chars.next() {
                if c == '~' {
                    match chars.next() {
                        Some('0') => token.push('~'),
                        Some('1') => token.push('/'),
                        _ => return Err(err("'~' must be followed by '0' or '1' (RFC 6901)")),
                    }
                } else {
                    token.push(c);
                }
            }
            tokens.push(token);
        }
        Ok(JsonPointer {
            text: text.to_owned(),
            tokens,
        })
    }

    /// The pointer as written.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// Whether `self` is a proper or equal prefix of `other` (then one pointer's value would
    /// contain the other's).
    pub fn is_prefix_of(&self, other: &JsonPointer) -> bool {
        other.tokens.len() >= self.tokens.len() && other.tokens[..self.tokens.len()] == self.tokens
    }
}

impl fmt::Display for JsonPointer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}
