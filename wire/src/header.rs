//! Header names and values every answer of both fakes carries.

/// The id of one request, on every answer (`req_…`).
pub const REQUEST_ID: &str = "request-id";

/// The organization the answering account belongs to, on every account's answer.
pub const ORGANIZATION_ID: &str = "anthropic-organization-id";

/// The `content-type` of a JSON body.
pub const JSON: &str = "application/json";

/// The `content-type` of a stream.
pub const EVENT_STREAM: &str = "text/event-stream; charset=utf-8";

/// The `cache-control` of a stream.
pub const NO_CACHE: &str = "no-cache";
