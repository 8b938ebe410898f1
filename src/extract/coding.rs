//! Content codings (RFC 9110 section 8.4): a `Content-Encoding: gzip` body is read from its
//! inflated bytes, bounded after inflation, while the original bytes are what is forwarded.
//!
//! Inflation is flate2's (miniz_oxide backend), never our own.

use std::borrow::Cow;
use std::io::Read;

use flate2::read::{MultiGzDecoder, ZlibDecoder};

/// Most codings one body may list (`gzip, gzip` is legal, and a longer list is only a way to
/// make the proxy work).
const MAX_CODINGS: usize = 2;

/// Why a coded body gives no bytes to read facts from.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// Inflated, it is larger than the limit (a decompression bomb, or simply too big): the
    /// request is refused with 413, as an uncoded body of that size is.
    #[error("the body inflates to more than {limit} bytes")]
    TooLarge {
        /// The limit, bytes (`--max-body`).
        limit: u64,
    },
    /// A coding the proxy does not read (`br`, `zstd`, `compress`, more than two codings), or
    /// bytes that do not inflate: the facts are unreadable, and the body is forwarded as it
    /// came.
    #[error("{0}")]
    Unreadable(String),
}

/// The bytes to read facts from: `body` itself without a coding (or with `identity`), else
/// `body` decoded through the codings of the `Content-Encoding` header values, in reverse
/// order of application (RFC 9110 section 8.4), at most `limit` bytes after decoding.
///
/// # Errors
/// [`DecodeError::TooLarge`] past `limit`; [`DecodeError::Unreadable`] for an unknown
/// coding or a corrupt body.
pub fn decoded<'a>(
    content_encoding: &[&[u8]],
    body: &'a [u8],
    limit: u64,
) -> Result<Cow<'a, [u8]>, DecodeError> {
    let mut codings: Vec<String> = Vec::new();
    for value in content_encoding {
        for coding in String::from_utf8_lossy(value).split(',') {
            let coding = coding.trim().to_ascii_lowercase();
            if !coding.is_empty() && coding != "identity" {
                codings.push(coding);
            }
        }
    }
    if codings.len() > MAX_CODINGS {
        return Err(DecodeError::Unreadable(format!(
            "{} content codings (at most {MAX_CODINGS} are read)",
            codings.len()
        )));
    }
    let mut bytes = Cow::Borrowed(body);
    for coding in codings.iter().rev() {
        let reader: Box<dyn Read + '_> = match coding.as_str() {
            "gzip" | "x-gzip" => Box::new(MultiGzDecoder::new(&bytes[..])),
            // RFC 9110 section 8.4.1.2: "deflate" is the zlib format.
            "deflate" => Box::new(ZlibDecoder::new(&bytes[..])),
            other => {
                return Err(DecodeError::Unreadable(format!(
                    "content coding {other:?} is not read"
                )));
            }
        };
        let mut out = Vec::new();
        reader
            .take(limit.saturating_add(1))
            .read_to_end(&mut out)
            .map_err(|e| DecodeError::Unreadable(format!("{coding} body: {e}")))?;
        if out.len() as u64 > limit {
            return Err(DecodeError::TooLarge { limit });
        }
        bytes = Cow::Owned(out);
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use flate2::Compression;
    use flate2::write::{GzEncoder, ZlibEncoder};

    use super::*;

    fn gzip(bytes: &[u8]) -> Vec<u8> {
        let mut e = GzEncoder::new(Vec::new(), Compression::default());
        e.write_all(bytes).unwrap();
        e.finish().unwrap()
    }

    #[test]
    fn codings() {
        let json = br#"{"lat":52.52}"#;
        assert_eq!(decoded(&[], json, 100).unwrap(), &json[..]);
        assert_eq!(decoded(&[b"identity"], json, 100).unwrap(), &json[..]);
        assert_eq!(decoded(&[b"gzip"], &gzip(json), 100).unwrap(), &json[..]);
        assert_eq!(decoded(&[b"X-Gzip"], &gzip(json), 100).unwrap(), &json[..]);
        let twice = gzip(&gzip(json));
        assert_eq!(decoded(&[b"gzip, gzip"], &twice, 100).unwrap(), &json[..]);
        assert_eq!(
            decoded(&[b"gzip", b"gzip"], &twice, 100).unwrap(),
            &json[..]
        );
        let mut z = ZlibEncoder::new(Vec::new(), Compression::default());
        z.write_all(json).unwrap();
        assert_eq!(
            decoded(&[b"deflate"], &z.finish().unwrap(), 100).unwrap(),
            &json[..]
        );
    }

    #[test]
    fn bombs_unknown_codings_and_corrupt_bodies() {
        let bomb = gzip(&vec![b' '; 10 << 20]);
        assert!(bomb.len() < 20_000);
        assert_eq!(
            decoded(&[b"gzip"], &bomb, 1 << 20),
            Err(DecodeError::TooLarge { limit: 1 << 20 })
        );
        for (coding, body) in [
            (&b"br"[..], &b"x"[..]),
            (b"gzip", b"not gzip"),
            (b"gzip, gzip, gzip", b"x"),
        ] {
            assert!(
                matches!(
                    decoded(&[coding], body, 100),
                    Err(DecodeError::Unreadable(_))
                ),
                "{coding:?}"
            );
        }
    }
}
