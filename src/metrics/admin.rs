//! The `reason` label of [`ADMIN_REFUSALS`](super::ADMIN_REFUSALS): why the admin listener
//! refused a request (`admin::guard`; docs/operations.md "The admin listener's rules").

/// Why the admin listener refused a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdminRefusal {
    /// A `Host` that is not an IP literal, `localhost` or a name of `--admin-allow-host`
    /// (421), or a request without one or with two (400).
    Host,
    /// A browser's `Origin` on a state-changing request (403).
    Origin,
    /// A state-changing request whose `Content-Type` is not `application/json`, or that has
    /// a body and no type (415).
    ContentType,
    /// A state-changing request from beyond loopback, and no `--admin-token-file` (403).
    NotLoopback,
    /// A state-changing request from beyond loopback without `Authorization: Bearer` (401).
    TokenMissing,
    /// A credential that is not the `--admin-token-file` token (401), from any peer.
    TokenInvalid,
}

impl AdminRefusal {
    /// Every reason, in metric-slot order.
    pub const ALL: [AdminRefusal; 6] = [
        AdminRefusal::Host,
        AdminRefusal::Origin,
        AdminRefusal::ContentType,
        AdminRefusal::NotLoopback,
        AdminRefusal::TokenMissing,
        AdminRefusal::TokenInvalid,
    ];

    /// The `reason` label value.
    pub fn as_str(self) -> &'static str {
        match self {
            AdminRefusal::Host => "host",
            AdminRefusal::Origin => "origin",
            AdminRefusal::ContentType => "content_type",
            AdminRefusal::NotLoopback => "not_loopback",
            AdminRefusal::TokenMissing => "token_missing",
            AdminRefusal::TokenInvalid => "token_invalid",
        }
    }
}
