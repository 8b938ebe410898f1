//! Header hygiene on both legs: hop-by-hop headers removed (RFC 9110 section 7.6.1) and the
//! forwarding headers set (`X-Forwarded-For`, `X-Forwarded-Proto`, `Forwarded`), kept and
//! extended only from trusted peers (docs/responses.md "Proxying").

use http::header::{self, HeaderMap, HeaderName, HeaderValue};

use crate::edge::serve::ClientInfo;

/// Hop-by-hop headers that never cross a proxy (RFC 9110 section 7.6.1, plus the legacy
/// `Keep-Alive` and `Proxy-Connection`, and `TE`/`Trailer`/`Transfer-Encoding`/`Upgrade`), and
/// `HTTP2-Settings`, which belongs to the connection an h2c upgrade would make (RFC 7540
/// section 3.2.1) and is meaningless without that `Upgrade` (go#80416: it reached upstreams).
/// Names built at compile time: removing them parses nothing per request (parsing the nine
/// names twice per request was about 1% of the proxy's CPU, docs/benchmark-history.md).
pub const HOP_BY_HOP: [HeaderName; 10] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
    HeaderName::from_static("http2-settings"),
];

/// Where `name` (lowercase, as `HeaderName` holds it) is in [`HOP_BY_HOP`].
fn hop_by_hop_index(name: &str) -> Option<usize> {
    request_index(name).filter(|&i| i < FORWARDING_AT)
}

/// The names a request is looked over for on its way upstream, at the bits
/// [`request_present`] gives them: [`HOP_BY_HOP`] at 0..10, [`FORWARDING`] at 10..24, then
/// `Expect`, `Content-Length` and `Host`. A `static`, not a `const`: a `const` array of
/// `HeaderName`s is built and dropped wherever it is used (381 instructions per request).
static REQUEST_NAMES: [HeaderName; 27] = [
    HeaderName::from_static("connection"),
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    HeaderName::from_static("proxy-authenticate"),
    HeaderName::from_static("proxy-authorization"),
    HeaderName::from_static("te"),
    HeaderName::from_static("trailer"),
    HeaderName::from_static("transfer-encoding"),
    HeaderName::from_static("upgrade"),
    HeaderName::from_static("http2-settings"),
    HeaderName::from_static("forwarded"),
    HeaderName::from_static("x-forwarded-for"),
    HeaderName::from_static("x-forwarded-proto"),
    HeaderName::from_static("x-forwarded-host"),
    HeaderName::from_static("x-forwarded-port"),
    HeaderName::from_static("x-forwarded-prefix"),
    HeaderName::from_static("x-forwarded-server"),
    HeaderName::from_static("x-forwarded-ssl"),
    HeaderName::from_static("x-forwarded-scheme"),
    HeaderName::from_static("x-url-scheme"),
    HeaderName::from_static("front-end-https"),
    HeaderName::from_static("x-real-ip"),
    HeaderName::from_static("x-client-ip"),
    HeaderName::from_static("true-client-ip"),
    HeaderName::from_static("expect"),
    HeaderName::from_static("content-length"),
    HeaderName::from_static("host"),
];

/// Where [`FORWARDING`] starts in [`REQUEST_NAMES`] (the length of [`HOP_BY_HOP`]), and its
/// length: numbers, as reading a `const` array's length at run time would build it.
const FORWARDING_AT: usize = 10;
const FORWARDING_LEN: usize = 14;
/// Bits of [`REQUEST_NAMES`]: the hop-by-hop set's, `Expect`, `Content-Length`, `Host`.
const HOP_BITS: u32 = (1 << FORWARDING_AT) - 1;
const EXPECT_BIT: u32 = 1 << 24;
const CONTENT_LENGTH_BIT: u32 = 1 << 25;
const HOST_BIT: u32 = 1 << 26;
/// Set by [`request_present`] when some name holds a `_` (a possible forwarding twin).
const UNDERSCORE_BIT: u32 = 1 << 31;
/// Set by [`strip_hop_by_hop`]'s scan when a `Connection` value may name other headers
/// ([`nominates`]).
const NOMINATES_BIT: u32 = 1 << 30;

/// Where `name` (lowercase) is in [`REQUEST_NAMES`]: one `match` on the text (a switch on
/// the length, then one comparison).
fn request_index(name: &str) -> Option<usize> {
    Some(match name {
        "connection" => 0,
        "keep-alive" => 1,
        "proxy-connection" => 2,
        "proxy-authenticate" => 3,
        "proxy-authorization" => 4,
        "te" => 5,
        "trailer" => 6,
        "transfer-encoding" => 7,
        "upgrade" => 8,
        "http2-settings" => 9,
        "forwarded" => 10,
        "x-forwarded-for" => 11,
        "x-forwarded-proto" => 12,
        "x-forwarded-host" => 13,
        "x-forwarded-port" => 14,
        "x-forwarded-prefix" => 15,
        "x-forwarded-server" => 16,
        "x-forwarded-ssl" => 17,
        "x-forwarded-scheme" => 18,
        "x-url-scheme" => 19,
        "front-end-https" => 20,
        "x-real-ip" => 21,
        "x-client-ip" => 22,
        "true-client-ip" => 23,
        "expect" => 24,
        "content-length" => 25,
        "host" => 26,
        _ => return None,
    })
}

/// Which of [`REQUEST_NAMES`] `headers` holds (bit `i` for `REQUEST_NAMES[i]`), and
/// [`UNDERSCORE_BIT`] when a name holds a `_`: one pass over the request's names for all
/// the hygiene it gets.
fn request_present(headers: &HeaderMap) -> u32 {
    let mut found = 0u32;
    for name in headers.keys() {
        let name = name.as_str();
        match request_index(name) {
            Some(i) => found |= 1 << i,
            None if name.as_bytes().contains(&b'_') => found |= UNDERSCORE_BIT,
            None => {}
        }
    }
    found
}

/// Removes hop-by-hop headers: the standard set and every header named in `Connection`.
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    // One pass over the names and values: which of the set are present, and whether a
    // `Connection` names more than its options (only then is it split into tokens).
    let mut present = 0u32;
    for (name, value) in headers.iter() {
        if let Some(i) = hop_by_hop_index(name.as_str()) {
            present |= 1 << i;
            if i == 0 && nominates(value) {
                present |= NOMINATES_BIT;
            }
        }
    }
    if present == 0 {
        return;
    }
    // `HOP_BY_HOP[0]` is `Connection`: the headers it names go too.
    if present & NOMINATES_BIT != 0 {
        strip_nominated(headers);
    }
    remove(headers, &REQUEST_NAMES, present & HOP_BITS);
}

/// Whether a `Connection` value may name a header: anything but the bare options
/// `keep-alive` (as nginx sends on every answer) and `close`, which name none.
///
/// `scripts/instructions.sh` (callgrind, 4,000 requests; nginx answers `Connection:
/// keep-alive`): splitting every `Connection` into tokens (a `get_all`, then a split and
/// three comparisons per token) cost 265 instructions per request in the client
/// connection's task on both yes paths (54,011 → 53,746 sheddable, 36,781 → 36,516 `never`).
fn nominates(value: &HeaderValue) -> bool {
    let v = value.as_bytes();
    !(v.eq_ignore_ascii_case(b"keep-alive") || v.eq_ignore_ascii_case(b"close"))
}

/// Removes the headers `Connection` names (not those of [`HOP_BY_HOP`], which go by their
/// bits anyway); whether it removed any.
fn strip_nominated(headers: &mut HeaderMap) -> bool {
    // Bytes, not `to_str`: a non-UTF-8 value must not hide the tokens beside it.
    // Tokens that name a header removed below anyway (`keep-alive`, `close`-free lists in
    // practice) are skipped without making a `HeaderName` of them.
    let nominated: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .flat_map(|v| v.as_bytes().split(|&b| b == b','))
        .map(<[u8]>::trim_ascii)
        .filter(|t| {
            !t.eq_ignore_ascii_case(b"keep-alive")
                && !t.eq_ignore_ascii_case(b"close")
                && !REQUEST_NAMES[..FORWARDING_AT]
                    .iter()
                    .any(|h| t.eq_ignore_ascii_case(h.as_str().as_bytes()))
        })
        .filter_map(|t| HeaderName::from_bytes(t).ok())
        .collect();
    let mut removed = false;
    for name in nominated {
        removed |= headers.remove(name).is_some();
    }
    removed
}

/// A request's header hygiene on its way upstream, from one pass over its names
/// ([`request_present`]): hop-by-hop headers stripped (as [`strip_hop_by_hop`]), `Expect`
/// removed (the proxy answered `100-continue` itself by reading the body) and
/// `Content-Length` removed (the body is re-framed by the client), then, for a request from
/// `client` (with whether its peer is `trusted`), the forwarding headers set (as
/// [`add_forwarding_headers`]). Returns whether the request still has a `Host`.
///
/// `scripts/instructions.sh` (callgrind): a pass for the hop-by-hop names, one for the
/// forwarding names, one for `_`, hashed lookups for `Expect`, `Content-Length` and `Host`,
/// and `const` arrays of names built and dropped at each use cost 1,024 instructions more on
/// the sheddable yes (76,683 → 75,659) and 927 more on the `never` yes (59,791 → 58,864).
pub(super) fn prepare_request(
    headers: &mut HeaderMap,
    client: Option<(&ClientInfo, bool)>,
) -> bool {
    let mut present = request_present(headers);
    // Headers `Connection` names may be any of the others: look again if one went. (Its
    // values are looked at only when it is there: a pass over every value instead of every
    // name cost 168 instructions per request on the harness's requests, which have none.)
    if present & 1 != 0
        && headers.get_all(header::CONNECTION).iter().any(nominates)
        && strip_nominated(headers)
    {
        present = request_present(headers);
    }
    remove(
        headers,
        &REQUEST_NAMES,
        present & (HOP_BITS | EXPECT_BIT | CONTENT_LENGTH_BIT),
    );
    if let Some((client, trusted)) = client {
        if present & UNDERSCORE_BIT != 0 {
            remove_forwarding_twins(headers);
        }
        let forwarding = (present >> FORWARDING_AT) & ((1 << FORWARDING_LEN) - 1);
        set_forwarding_headers(headers, client, trusted, forwarding);
    }
    present & HOST_BIT != 0
}

/// Which names of a set `headers` holds: bit `i` for the name `index` places at `i` (at most
/// 32). One pass over the request's or answer's few names, each placed by one `match` on its
/// text (a switch on the length, then one comparison), instead of a hashed lookup per name:
/// the proxy looks for 32 fixed names per request (hop-by-hop both ways, forwarding headers)
/// and a request carries one or two of them. `scripts/instructions.sh` (callgrind, 4,000
/// POSTs of the harness's body): 70,202–70,247 instructions per request with a `remove` per
/// name; 66,585–66,933 comparing each name with each of the set's (64,525–64,666 with that
/// comparison after later changes), 63,449–63,758 over nine runs with the `match` (runs of
/// one build spread by up to 300; 63,483–63,542 in the final build).
fn present(headers: &HeaderMap, index: impl Fn(&str) -> Option<usize>) -> u32 {
    let mut found = 0u32;
    for name in headers.keys() {
        if let Some(i) = index(name.as_str()) {
            found |= 1 << i;
        }
    }
    found
}

/// Removes the `names` whose bits are set in `present` (from [`present`]).
fn remove(headers: &mut HeaderMap, names: &[HeaderName], mut present: u32) {
    while present != 0 {
        let i = present.trailing_zeros() as usize;
        present &= present - 1;
        if let Some(name) = names.get(i) {
            headers.remove(name);
        }
    }
}

/// Forwarding headers a client could use to claim an address, host, path or scheme it does
/// not have (the de facto set frameworks read: Rack's `X-Forwarded-Ssl` and
/// `X-Forwarded-Scheme`, IIS's `Front-End-Https`, CDNs' `True-Client-IP`): kept (and
/// extended) only from trusted peers. Names built at compile time: removing them from an
/// untrusted peer's request parses nothing per request.
/// `FORWARDING[0..3]` are the three shedgate sets (`add_forwarding_headers`).
#[cfg_attr(
    not(test),
    expect(
        dead_code,
        reason = "the set as named; REQUEST_NAMES holds it at run time"
    )
)]
const FORWARDING: [HeaderName; 14] = [
    HeaderName::from_static("forwarded"),
    HeaderName::from_static("x-forwarded-for"),
    HeaderName::from_static("x-forwarded-proto"),
    HeaderName::from_static("x-forwarded-host"),
    HeaderName::from_static("x-forwarded-port"),
    HeaderName::from_static("x-forwarded-prefix"),
    HeaderName::from_static("x-forwarded-server"),
    HeaderName::from_static("x-forwarded-ssl"),
    HeaderName::from_static("x-forwarded-scheme"),
    HeaderName::from_static("x-url-scheme"),
    HeaderName::from_static("front-end-https"),
    HeaderName::from_static("x-real-ip"),
    HeaderName::from_static("x-client-ip"),
    HeaderName::from_static("true-client-ip"),
];

/// Where `name` (lowercase, as `HeaderName` holds it) is in [`FORWARDING`].
fn forwarding_index(name: &str) -> Option<usize> {
    request_index(name)
        .and_then(|i| i.checked_sub(FORWARDING_AT))
        .filter(|&i| i < FORWARDING_LEN)
}

/// Removes underscore twins of the forwarding headers (`X_Forwarded_For` beside
/// `X-Forwarded-For`; any name that reads as one of [`FORWARDING`] once `_` reads as `-`),
/// from every peer, trusted ones included: a CGI or WSGI upstream reads a twin as the header
/// itself (`HTTP_X_FORWARDED_FOR`), so a client's twin passed through an ingress that keeps
/// underscores would stand beside the value shedgate sets (httpd PR #558, caddy#7808). Other
/// underscore headers are left alone. A request without `_` in any name costs one scan of
/// its names.
fn remove_forwarding_twins(headers: &mut HeaderMap) {
    if !headers
        .keys()
        .any(|k| k.as_str().as_bytes().contains(&b'_'))
    {
        return;
    }
    let twins: Vec<HeaderName> = headers
        .keys()
        .filter(|k| {
            REQUEST_NAMES[FORWARDING_AT..FORWARDING_AT + FORWARDING_LEN]
                .iter()
                .any(|f| crate::extract::headers::is_twin(k.as_str(), f.as_str().as_bytes()))
        })
        .cloned()
        .collect();
    for name in twins {
        headers.remove(name);
    }
}

/// Sets the forwarding headers for a request from `client`.
///
/// - From a trusted peer (`trusted`: a load balancer or ingress in `--trusted-proxies`), the
///   client is appended to `X-Forwarded-For` and `Forwarded` (RFC 7239 section 4), earlier
///   values joined into one line, and `X-Forwarded-Proto` is kept as that peer set it (it
///   names the original client's scheme; `https, http` would name none), else set to this
///   hop's scheme: `https` when the client connected over TLS, `http` otherwise
///   (`client.proto`).
/// - From anyone else, every forwarding header it sent is dropped (a direct client could
///   claim any address or `https`), and `X-Forwarded-For`, `X-Forwarded-Proto` and
///   `Forwarded` name only this hop: its address and its scheme (`https` over TLS, `http`
///   otherwise; `proto=` in `Forwarded`).
///
/// An IPv4 client on a `[::]` listener (`::ffff:a.b.c.d`) is named as IPv4. The elements that
/// name the client are made once per connection and resume ([`ClientInfo::new`]); a request with no
/// earlier hops gets them without a copy (formatting them per request was about 1.8% of the
/// proxy's CPU under the throughput harness, docs/benchmark-history.md).
pub fn add_forwarding_headers(headers: &mut HeaderMap, client: &ClientInfo, trusted: bool) {
    remove_forwarding_twins(headers);
    let present = present(headers, forwarding_index);
    set_forwarding_headers(headers, client, trusted, present);
}

/// [`add_forwarding_headers`] after the twins are gone, with `present` the bits of the
/// [`FORWARDING`] names the request holds.
fn set_forwarding_headers(
    headers: &mut HeaderMap,
    client: &ClientInfo,
    trusted: bool,
    present: u32,
) {
    let names = &REQUEST_NAMES[FORWARDING_AT..FORWARDING_AT + FORWARDING_LEN];
    if !trusted {
        remove(headers, names, present);
    }
    // Whether `FORWARDING[i]` is still there.
    let kept = |i: usize| trusted && present & (1 << i) != 0;
    let append = |headers: &mut HeaderMap, name: &HeaderName, value: &HeaderValue, kept: bool| {
        if !kept {
            headers.insert(name.clone(), value.clone());
            return;
        }
        // Earlier hops are kept as bytes (a non-UTF-8 value is not dropped).
        let mut line: Vec<u8> = Vec::new();
        for v in &headers.get_all(name) {
            line.extend_from_slice(v.as_bytes());
            line.extend_from_slice(b", ");
        }
        line.extend_from_slice(value.as_bytes());
        if let Ok(v) = HeaderValue::from_bytes(&line) {
            headers.insert(name.clone(), v);
        }
    };
    append(headers, &names[1], &client.forwarded_for, kept(1));
    if !kept(2) {
        headers.insert(names[2].clone(), client.proto.clone());
    }
    append(headers, &names[0], &client.forwarded, kept(0));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn client(ip: &str) -> ClientInfo {
        ClientInfo::new(std::net::SocketAddr::new(ip.parse().unwrap(), 40000))
    }

    #[test]
    fn each_set_places_its_own_names_within_its_bits() {
        for (set, index) in [
            (
                &HOP_BY_HOP[..],
                hop_by_hop_index as fn(&str) -> Option<usize>,
            ),
            (&FORWARDING[..], forwarding_index),
        ] {
            for (i, name) in set.iter().enumerate() {
                assert_eq!(index(name.as_str()), Some(i), "{name}");
            }
            // Every index the match can give is one of the set's: names near the set's
            // (and the other set's) are placed nowhere or within it.
            for other in HOP_BY_HOP.iter().chain(&FORWARDING) {
                assert!(
                    index(other.as_str()).is_none_or(|i| set[i] == other),
                    "{other}"
                );
            }
            for other in ["host", "x-stream", "content-length", "x-forwarded", "tE"] {
                assert_eq!(index(other), None, "{other}");
            }
        }
    }

    #[test]
    fn the_request_names_are_the_sets_at_their_bits() {
        for (i, name) in REQUEST_NAMES.iter().enumerate() {
            assert_eq!(request_index(name.as_str()), Some(i), "{name}");
        }
        let (hop_by_hop, forwarding) = (HOP_BY_HOP, FORWARDING);
        assert_eq!(hop_by_hop.len(), FORWARDING_AT);
        assert_eq!(forwarding.len(), FORWARDING_LEN);
        let sets = hop_by_hop.iter().chain(&forwarding);
        assert!(sets.eq(&REQUEST_NAMES[..FORWARDING_AT + FORWARDING_LEN]));
        assert_eq!(REQUEST_NAMES[24], header::EXPECT);
        assert_eq!(REQUEST_NAMES[25], header::CONTENT_LENGTH);
        assert_eq!(REQUEST_NAMES[26], header::HOST);
    }

    /// `prepare_request` leaves what its parts did one after the other, in their order.
    #[test]
    fn preparing_a_request_is_its_parts_in_turn() {
        let maps: [&[(&str, &str)]; 6] = [
            &[("host", "a"), ("content-length", "3"), ("x-stream", "s")],
            &[
                ("connection", "x-forwarded-for, host, Expect"),
                ("x-forwarded-for", "10.0.0.1"),
                ("host", "a"),
                ("expect", "100-continue"),
                ("te", "trailers"),
            ],
            &[
                ("x_forwarded_for", "10.9.9.9"),
                ("x-forwarded-proto", "https"),
                ("forwarded", "for=10.0.0.1"),
                ("keep-alive", "5"),
                ("x_other", "kept"),
            ],
            &[
                ("connection", "close"),
                ("transfer-encoding", "chunked"),
                ("upgrade", "h2c"),
                ("http2-settings", "AAA"),
                ("x-real-ip", "1.2.3.4"),
            ],
            &[
                ("connection", "content-length, x_forwarded_for"),
                ("content-length", "9"),
                ("x_forwarded_for", "1"),
                ("x-client-ip", "2"),
            ],
            &[],
        ];
        for pairs in maps {
            for peer in [None, Some(true), Some(false)] {
                let mut h = HeaderMap::new();
                for (k, v) in pairs {
                    h.append(
                        HeaderName::from_bytes(k.as_bytes()).unwrap(),
                        HeaderValue::from_static(v),
                    );
                }
                let mut expected = h.clone();
                strip_hop_by_hop(&mut expected);
                expected.remove(header::EXPECT);
                expected.remove(header::CONTENT_LENGTH);
                let info = client("127.0.0.1");
                if let Some(trusted) = peer {
                    add_forwarding_headers(&mut expected, &info, trusted);
                }
                let has_host = prepare_request(&mut h, peer.map(|trusted| (&info, trusted)));
                assert_eq!(h, expected, "{pairs:?} {peer:?}");
                assert_eq!(has_host, expected.contains_key(header::HOST), "{pairs:?}");
            }
        }
    }

    #[test]
    fn strips_standard_and_nominated_headers() {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONNECTION,
            HeaderValue::from_static("keep-alive, X-Debug-Trace"),
        );
        h.insert("x-debug-trace", HeaderValue::from_static("1"));
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert("te", HeaderValue::from_static("trailers"));
        h.insert("x-stream", HeaderValue::from_static("a"));
        strip_hop_by_hop(&mut h);
        assert_eq!(h.len(), 1);
        assert!(h.contains_key("x-stream"));
    }

    /// A `Connection` of options only goes without a look at its tokens; one line naming a
    /// header beside a plain one still has its header removed.
    #[test]
    fn a_plain_connection_goes_and_a_nominating_one_still_strips() {
        let mut h = HeaderMap::new();
        h.append(header::CONNECTION, HeaderValue::from_static("Keep-Alive"));
        h.append(header::CONNECTION, HeaderValue::from_static("close"));
        h.insert("x-debug-trace", HeaderValue::from_static("1"));
        strip_hop_by_hop(&mut h);
        assert!(!h.contains_key(header::CONNECTION));
        assert!(h.contains_key("x-debug-trace"));
        h.append(header::CONNECTION, HeaderValue::from_static("keep-alive"));
        h.append(
            header::CONNECTION,
            HeaderValue::from_static("x-debug-trace"),
        );
        let mut request = h.clone();
        strip_hop_by_hop(&mut h);
        assert!(h.is_empty(), "{h:?}");
        prepare_request(&mut request, None);
        assert!(request.is_empty(), "{request:?}");
    }

    #[test]
    fn forwarding_headers_from_trusted_peers_are_extended() {
        let mut h = HeaderMap::new();
        h.insert("x-forwarded-for", HeaderValue::from_static("203.0.113.7"));
        h.insert("x-forwarded-proto", HeaderValue::from_static("https"));
        add_forwarding_headers(&mut h, &client("127.0.0.1"), true);
        assert_eq!(h["x-forwarded-for"], "203.0.113.7, 127.0.0.1");
        assert_eq!(h["x-forwarded-proto"], "https", "the original scheme, once");
        assert_eq!(h["forwarded"], "for=127.0.0.1;proto=http");
        add_forwarding_headers(&mut h, &client("::1"), true);
        assert_eq!(
            h["forwarded"],
            "for=127.0.0.1;proto=http, for=\"[::1]\";proto=http"
        );
    }

    #[test]
    fn underscore_twins_of_forwarding_headers_go_from_every_peer() {
        for trusted in [true, false] {
            let mut h = HeaderMap::new();
            h.insert("x_forwarded_for", HeaderValue::from_static("10.9.9.9"));
            h.insert("x_forwarded-proto", HeaderValue::from_static("https"));
            h.insert("x-real_ip", HeaderValue::from_static("10.9.9.9"));
            h.insert("x_fleet_tenant", HeaderValue::from_static("kept"));
            add_forwarding_headers(&mut h, &client("127.0.0.1"), trusted);
            for twin in ["x_forwarded_for", "x_forwarded-proto", "x-real_ip"] {
                assert!(!h.contains_key(twin), "{twin} kept (trusted {trusted})");
            }
            assert_eq!(h["x_fleet_tenant"], "kept", "other underscore headers stay");
            assert_eq!(h["x-forwarded-for"], "127.0.0.1");
        }
    }

    #[test]
    fn forwarding_headers_from_anyone_else_are_replaced() {
        let mut h = HeaderMap::new();
        h.insert("x-forwarded-for", HeaderValue::from_static("10.0.0.1"));
        h.insert("x-forwarded-proto", HeaderValue::from_static("https"));
        h.insert(
            "x-forwarded-host",
            HeaderValue::from_static("admin.example.test"),
        );
        h.insert(
            "forwarded",
            HeaderValue::from_static("for=10.0.0.1;proto=https"),
        );
        add_forwarding_headers(&mut h, &client("::ffff:127.0.0.1"), false);
        assert_eq!(
            h["x-forwarded-for"], "127.0.0.1",
            "mapped IPv4 named as IPv4"
        );
        assert_eq!(h["x-forwarded-proto"], "http");
        assert_eq!(h["forwarded"], "for=127.0.0.1;proto=http");
        assert!(!h.contains_key("x-forwarded-host"));
        let mut h = HeaderMap::new();
        for name in FORWARDING {
            h.insert(name, HeaderValue::from_static("https"));
        }
        add_forwarding_headers(&mut h, &client("10.1.2.3"), false);
        let left: Vec<_> = h.keys().map(HeaderName::as_str).collect();
        assert_eq!(left.len(), 3, "only this hop's: {left:?}");
    }
}
