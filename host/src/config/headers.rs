//! Which client headers travel upstream: an allow-list, so that what a client
//! (or a proxy in front of poolgate) adds — cookies, `x-forwarded-for`, its own
//! tracing headers — never reaches an account. The fixed lists are here with
//! the operator's additions (`gateway.forward_headers`), parsed and checked at
//! load; the gateway applies the result to every attempt.

/// Forwarded whatever the config says: what Anthropic's API and its clients
/// (the SDKs, Claude Code) use. Session headers are Claude Code's.
const ALLOWED: [&str; 8] = [
    "x-app",
    "user-agent",
    "content-type",
    "accept",
    "accept-encoding",
    "accept-language",
    "x-claude-code-session-id",
    "x-session-id",
];

/// Prefixes forwarded whatever the config says: `anthropic-version`,
/// `anthropic-beta`, `anthropic-dangerous-direct-browser-access`, …; the SDKs'
/// `x-stainless-os`, `x-stainless-retry-count`, ….
const ALLOWED_PREFIXES: [&str; 2] = ["anthropic-", "x-stainless-"];

/// Never forwarded, even when an addition matches: headers about one
/// connection (RFC 9110 §7.6.1), headers about the client's network, the
/// client's own credential (the account's replaces it), and those the HTTP
/// layer writes itself.
const STRIPPED: [&str; 16] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "cookie",
    "forwarded",
    "x-real-ip",
    "via",
    "x-api-key",
    "authorization",
    "host",
    "content-length",
    "expect",
];

/// Prefixes never forwarded: `proxy-authorization` and kin, `x-forwarded-for`
/// and kin, and poolgate's own headers.
const STRIPPED_PREFIXES: [&str; 3] = ["proxy-", "x-forwarded-", "x-poolgate-"];

/// Whether `name` (lowercase) is never forwarded.
pub fn stripped(name: &str) -> bool {
    STRIPPED.contains(&name) || STRIPPED_PREFIXES.iter().any(|p| name.starts_with(p))
}

/// The client headers an attempt forwards.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ForwardPolicy {
    names: Vec<String>,
    prefixes: Vec<String>,
}

impl ForwardPolicy {
    /// The fixed lists plus `additions` (`gateway.forward_headers`, checked
    /// with [`check_addition`]; an entry that does not pass is ignored).
    pub fn new(additions: &[String]) -> ForwardPolicy {
        let mut policy = ForwardPolicy::default();
        for a in additions.iter().filter(|a| check_addition(a).is_ok()) {
            match a.strip_suffix('*') {
                Some(prefix) => policy.prefixes.push(prefix.to_string()),
                None => policy.names.push(a.clone()),
            }
        }
        policy
    }

    /// Whether a client header named `name` (lowercase, as `http` keeps it) goes upstream.
    pub fn forwards(&self, name: &str) -> bool {
        if stripped(name) {
            return false;
        }
        ALLOWED.contains(&name)
            || ALLOWED_PREFIXES.iter().any(|p| name.starts_with(p))
            || self.names.iter().any(|n| n == name)
            || self.prefixes.iter().any(|p| name.starts_with(p.as_str()))
    }
}

/// Checks one `gateway.forward_headers` entry: a lowercase header name
/// (`x-team`), or a prefix ending in `-*` (`x-team-*`), that is not one of the
/// headers never forwarded.
pub fn check_addition(entry: &str) -> Result<(), String> {
    let name = entry.strip_suffix('*').unwrap_or(entry);
    let token = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || "!#$%&'+-.^_`|~".contains(c);
    let what = "a lowercase header name (`x-team`) or a prefix ending in `-*` (`x-team-*`)";
    if name.is_empty() || !name.chars().all(token) {
        return Err(format!("`{entry}` is not {what}"));
    }
    if name.len() < entry.len() && !name.ends_with('-') {
        return Err(format!("`{entry}`: a prefix ends in `-*`; write `{name}-*`"));
    }
    // A name never forwarded, or a prefix all of whose headers never are.
    if stripped(name) {
        return Err(format!(
            "`{entry}` is never forwarded: connection headers, cookies, x-forwarded-*, forwarded, x-real-ip, via, \
             the client's credential and x-poolgate-* stay at the gateway"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_allow_list_with_additions_and_the_strip_list_first() {
        let p = ForwardPolicy::new(&["x-team".into(), "x-trace-*".into(), "x-*".into()]);
        for kept in ["anthropic-beta", "anthropic-version", "x-stainless-os", "user-agent", "x-team", "x-trace-id"] {
            assert!(p.forwards(kept), "{kept}");
        }
        // `x-*` matches them, but these never go.
        for gone in ["cookie", "x-forwarded-for", "x-real-ip", "x-api-key", "authorization", "x-poolgate-debug"] {
            assert!(!p.forwards(gone), "{gone}");
        }
        let p = ForwardPolicy::new(&[]);
        assert!(!p.forwards("x-foo") && !p.forwards("x-team") && p.forwards("x-app"));
    }

    #[test]
    fn additions_are_lowercase_names_or_dash_star_prefixes() {
        assert!(check_addition("x-team").is_ok() && check_addition("x-team-*").is_ok());
        for bad in
            ["X-Team", "x team", "", "*", "x-team*", "x-*-y", "cookie", "authorization", "x-forwarded-*", "proxy-*"]
        {
            assert!(check_addition(bad).is_err(), "{bad}");
        }
        assert!(check_addition("x-team*").unwrap_err().contains("write `x-team-*`"));
        // A prefix may overlap the strip list: those headers still stay.
        assert!(check_addition("x-*").is_ok());
    }
}
