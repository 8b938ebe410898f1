//! The request path that routes match on.

use std::borrow::Cow;

/// The path that routes match on: `raw` with percent-encoded unreserved characters decoded
/// (RFC 3986 section 6.2.2.2), repeated slashes collapsed, and dot segments removed (RFC 3986
/// section 5.2.4), so that `//ingest/owntracks`, `/ingest/./owntracks` and
/// `/ingest/%6Fwntracks` match the route `/ingest/owntracks`, and `/ingest/overland/../fleet`
/// does not match `/ingest/overland`. Only matching uses it: the path is forwarded as sent.
/// Borrowed (no work) when the path has nothing to normalise.
pub fn route_path(raw: &str) -> Cow<'_, str> {
    let bytes = raw.as_bytes();
    let plain = !bytes.contains(&b'%') && !raw.contains("//") && !raw.contains("/.");
    if plain {
        return Cow::Borrowed(raw);
    }
    let decoded = decode_unreserved(raw);
    let trailing = decoded.ends_with('/') || decoded.ends_with("/.") || decoded.ends_with("/..");
    let mut segments: Vec<&str> = Vec::new();
    for segment in decoded.split('/') {
        match segment {
            "" | "." => {}
            ".." => {
                segments.pop();
            }
            s => segments.push(s),
        }
    }
    let mut path = String::with_capacity(decoded.len());
    for s in &segments {
        path.push('/');
        path.push_str(s);
    }
    if trailing || segments.is_empty() {
        path.push('/');
    }
    Cow::Owned(path)
}

/// Decodes `%XX` escapes of unreserved characters (`A-Z a-z 0-9 - . _ ~`); every other escape
/// stays as written (an encoded `/` is data, not a separator).
fn decode_unreserved(raw: &str) -> String {
    let bytes = raw.as_bytes();
    let mut out = String::with_capacity(raw.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && let Some(hex) = raw.get(i + 1..i + 3)
            && let Ok(b) = u8::from_str_radix(hex, 16)
            && (b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~'))
        {
            out.push(char::from(b));
            i += 3;
            continue;
        }
        let ch = raw[i..].chars().next().unwrap_or('\u{fffd}');
        out.push(ch);
        i += ch.len_utf8();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn route_paths_are_normalised() {
        for (raw, want) in [
            ("/ingest/owntracks", "/ingest/owntracks"),
            ("//ingest/owntracks", "/ingest/owntracks"),
            ("/ingest/./owntracks", "/ingest/owntracks"),
            ("/ingest//owntracks/", "/ingest/owntracks/"),
            ("/ingest/overland/../fleet", "/ingest/fleet"),
            ("/ingest/%6Fwntracks", "/ingest/owntracks"),
            ("/ingest/%2e%2E/admin", "/admin"),
            ("/a/%2F/b", "/a/%2F/b"),
            ("/../../etc", "/etc"),
            ("/a/..", "/"),
            ("/%", "/%"),
            ("/%zz/é", "/%zz/é"),
        ] {
            assert_eq!(route_path(raw), want, "{raw}");
        }
        assert!(matches!(route_path("/ingest/owntracks"), Cow::Borrowed(_)));
    }
}
