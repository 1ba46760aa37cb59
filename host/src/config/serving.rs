//! What `serve` would run, judged before it runs: the checks `check`, the
//! start of `serve` and every reload make of a configuration with the command
//! line's overrides applied (who could reach the listener, an empty chain),
//! and what a reload must not do to a gateway that is running (open its bound
//! listener, drop its admin token). Pure functions of the configurations and
//! the bound address; `validate::meaning` and `Gateway::reload` call them.

use super::{Config, LineIndex, Overrides};

/// The checks of what `serve` would run, which a reload must pass as the start
/// did: an address to listen on; no listener beyond loopback without client
/// keys (anyone who reaches it could spend the pool); and no chain written
/// empty (`chain = []` would rank nothing — the default chain is had by
/// leaving the key out, and a reload that empties the chain by mistake must
/// not silently route by the default instead).
///
/// `overrides` `None` judges the file alone: only that `listen` is an address.
pub fn check(config: &Config, index: &LineIndex, overrides: Option<&Overrides>, add: &mut impl FnMut(String, String)) {
    let s = &config.server;
    let Some(overrides) = overrides else {
        if s.listen.parse::<std::net::SocketAddr>().is_err() {
            add("server.listen".into(), format!("`{}` is not an address with a port (e.g. 127.0.0.1:8787)", s.listen));
        }
        return;
    };
    let (key, from) = match overrides.listen {
        Some(_) => ("--listen".to_string(), " (from --listen or POOLGATE_LISTEN)"),
        None => ("server.listen".to_string(), ""),
    };
    match s.listen.parse::<std::net::SocketAddr>() {
        Err(_) => add(key, format!("`{}`{from} is not an address with a port (e.g. 127.0.0.1:8787)", s.listen)),
        Ok(addr) if !exposure_allowed(&addr, !s.client_keys.is_empty()) => add(
            key,
            format!(
                "`{addr}`{from} is not a loopback address and no client keys are configured: anyone who can reach \
                 it could spend the pool. Add [[server.client_keys]] or listen on 127.0.0.1"
            ),
        ),
        Ok(_) => {}
    }
    if config.policy.chain.is_empty() && index.contains_key("policy.chain") {
        add(
            "policy.chain".into(),
            format!(
                "an empty chain ranks nothing; leave `chain` out for the default chain ({}), or list at least one \
                 stage",
                super::DEFAULT_CHAIN.join(" → ")
            ),
        );
    }
}

/// Whether a gateway may listen on `addr`: beyond loopback only with client
/// keys. (An IPv4 address mapped into IPv6 is judged as the IPv4 one.)
pub fn exposure_allowed(addr: &std::net::SocketAddr, has_client_keys: bool) -> bool {
    has_client_keys || addr.ip().to_canonical().is_loopback()
}

/// What a reload must not do to a running gateway, beyond what a start would
/// refuse: leave the listener it cannot move (`bound`: where it listens)
/// reachable beyond loopback without client keys, or drop the admin token —
/// the operator's way in to `/status` and `POST /admin/reload` — which only a
/// restart may do. Each problem as `key: why`, for the reload's refusal.
pub fn reload_weakens(running: &Config, bound: Option<std::net::SocketAddr>, next: &Config) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(addr) = bound
        && !exposure_allowed(&addr, !next.server.client_keys.is_empty())
    {
        out.push(format!(
            "server.client_keys: the gateway listens on {addr}, beyond loopback, and this file has no client keys: \
             anyone who can reach it could spend the pool. Keep at least one key, or restart it on a loopback address"
        ));
    }
    let admin = |c: &Config| c.server.admin_token_env.is_some() || c.server.admin_token_sha256.is_some();
    if admin(running) && !admin(next) {
        out.push(
            "server.admin_token_env: this file drops the admin token; a reload cannot close the admin routes it may \
             have come through (/status, POST /admin/reload). Restart the gateway to run without one"
                .to_string(),
        );
    }
    out
}
