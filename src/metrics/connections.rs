//! The `reason` labels of client connections: why shedgate closed one
//! ([`CONNECTION_CLOSES`](super::CONNECTION_CLOSES)) and where descriptors ran short
//! ([`DESCRIPTOR_SHORTAGES`](super::DESCRIPTOR_SHORTAGES)).

/// Why shedgate closed a client connection (docs/responses.md "Connections").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CloseReason {
    /// No request within the idle timeout (from accept or the previous response).
    IdleTimeout,
    /// A started head unfinished within the header read timeout.
    HeaderTimeout,
    /// Answered before the request was received whole: `Connection: close` and a lingering
    /// close.
    EarlyAnswer,
    /// Answered during the lame duck (shutdown delay): `Connection: close`.
    LameDuck,
    /// Still open when the drain timeout ended: cut.
    DrainCut,
    /// Idle (no request yet, or parked between requests), closed to free a descriptor when
    /// they ran low (`edge::descriptors`).
    Descriptors,
    /// An HTTP/2 connection closed with `GOAWAY` `ENHANCE_YOUR_CALM` (RFC 9113 section 7):
    /// a client that reset too many streams before they were accepted (the rapid-reset
    /// pattern, CVE-2023-44487), made the proxy reset too many of its streams, or sent a
    /// header list or CONTINUATION frames far past the limits (`edge::serve::h2`).
    Http2EnhanceYourCalm,
    /// An HTTP/2 connection closed with another `GOAWAY` error of the proxy's: a frame or a
    /// header block the protocol does not allow (`PROTOCOL_ERROR`, `COMPRESSION_ERROR`,
    /// `FRAME_SIZE_ERROR`, `FLOW_CONTROL_ERROR`).
    Http2ProtocolError,
}

impl CloseReason {
    pub(super) const ALL: [CloseReason; 8] = [
        CloseReason::IdleTimeout,
        CloseReason::HeaderTimeout,
        CloseReason::EarlyAnswer,
        CloseReason::LameDuck,
        CloseReason::DrainCut,
        CloseReason::Descriptors,
        CloseReason::Http2EnhanceYourCalm,
        CloseReason::Http2ProtocolError,
    ];

    pub(super) fn as_str(self) -> &'static str {
        match self {
            CloseReason::IdleTimeout => "idle_timeout",
            CloseReason::HeaderTimeout => "header_timeout",
            CloseReason::EarlyAnswer => "early_answer",
            CloseReason::LameDuck => "lame_duck",
            CloseReason::DrainCut => "drain_cut",
            CloseReason::Descriptors => "descriptors",
            CloseReason::Http2EnhanceYourCalm => "http2_enhance_your_calm",
            CloseReason::Http2ProtocolError => "http2_protocol_error",
        }
    }
}

/// Where the proxy found its open-file descriptors short (`edge::descriptors`): the `reason`
/// label of [`DESCRIPTOR_SHORTAGES`](super::DESCRIPTOR_SHORTAGES).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DescriptorShortage {
    /// The proxy listener found the sockets held at the soft limit less the reserve, and
    /// closed idle connections (or waited) before accepting.
    Reserve,
    /// The proxy listener's accept failed with `EMFILE` or `ENFILE`.
    Accept,
    /// The admin listener's accept failed with `EMFILE` or `ENFILE`.
    AdminAccept,
    /// An upstream connect failed with `EMFILE` or `ENFILE`.
    UpstreamConnect,
}

impl DescriptorShortage {
    /// Every place, in metric-slot order.
    pub const ALL: [DescriptorShortage; 4] = [
        DescriptorShortage::Reserve,
        DescriptorShortage::Accept,
        DescriptorShortage::AdminAccept,
        DescriptorShortage::UpstreamConnect,
    ];

    /// The `reason` label value.
    pub fn as_str(self) -> &'static str {
        match self {
            DescriptorShortage::Reserve => "reserve",
            DescriptorShortage::Accept => "accept",
            DescriptorShortage::AdminAccept => "admin_accept",
            DescriptorShortage::UpstreamConnect => "upstream_connect",
        }
    }
}
