//! Subscription seats that stay alive, through the real binary and the mock's
//! OAuth authority (its token endpoint rotates single-use refresh tokens, its
//! API answers 401 to an expired access token): a pool served across several
//! token lifetimes on a compressed clock, concurrent 401s that cause one
//! refresh, a refused refresh token that asks for a login (and a login that
//! brings the seat back), an outage of the token endpoint, a restart after
//! the tokens expired, `poolgate login` and `poolgate accounts import`; and
//! seats that come back: a rotated pair a killed gateway left in its
//! temporary file, a seat demoted while its token is dead and its token
//! endpoint down, a Claude Code login imported after its access token
//! expired, refusals counted once; and a seat that forwards the client's own
//! identity headers, adding none.
//!
//! By concern: `expiry` (in-process, on the gateway's manual clock: expiry,
//! refresh ahead of it, refusal, backoff), `refresh` (tokens kept alive), `login` (`poolgate login`,
//! imports), `identity` (which subscription a seat is, what it forwards) and
//! `recovery` (crashes and outages). The helpers are here.

mod expiry;
mod identity;
mod login;
mod recovery;
mod refresh;

use crate::bounded;
use crate::support;

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bounded::OutputWithin;
use poolgate_mock_upstream::{Identity, MockUpstream, Quota, Seat, TokenMode};
use serde_json::{Value, json};
use support::{Gateway, tempdir};

const ADMIN: &str = "oauth-admin";

fn stored(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// A config of OAuth seats `ids` (credentials in `seats/<id>.json` of `dir`)
/// with the mock as API and token endpoint; `oauth` adds `[oauth]` keys.
fn config(mock: &MockUpstream, dir: &Path, ids: &[&str], oauth: &str) -> String {
    let base = mock.base_url();
    let mut s = format!(
        "[server]\nadmin_token_env = \"PG_ADMIN\"\n\n[oauth]\ntoken_url = \"{base}/v1/oauth/token\"\nusage_poll_ms = 0\n{oauth}\n\n"
    );
    for id in ids {
        let path = dir.join("seats").join(format!("{id}.json"));
        s.push_str(&format!(
            "[[accounts]]\nid = \"{id}\"\nkind = \"oauth\"\ncredentials = \"{}\"\nbase_url = \"{base}\"\n\n",
            path.display()
        ));
    }
    s
}

fn seat(mock: &MockUpstream, credential: &str, name: &str, lifetime: Duration) -> Seat {
    let account = mock.account(credential);
    account.set_quota(Quota::unified(0.2, 0.1));
    let seat = mock.oauth().seat(&account, Identity::new(name));
    seat.set_lifetime(lifetime);
    seat
}

async fn status(gw: &Gateway) -> Value {
    gw.admin_json("/status", ADMIN).await
}

fn account<'a>(st: &'a Value, id: &str) -> &'a Value {
    st["accounts"].as_array().and_then(|a| a.iter().find(|a| a["id"] == id)).unwrap_or(&Value::Null)
}

fn start(cfg: &str, dir: &Path) -> Gateway {
    let run = tempdir::Dir::new("oauth-run");
    let path = run.0.join("poolgate.toml");
    std::fs::write(&path, cfg).unwrap();
    let _ = dir;
    Gateway::start_file(&path, &[("PG_ADMIN", ADMIN)], run)
}

/// Refresh-token grants the token endpoint answered with `status`.
fn refresh_answers(mock: &MockUpstream, status: u16) -> usize {
    mock.oauth().token_requests().iter().filter(|r| r.grant_type == "refresh_token" && r.status == Some(status)).count()
}

fn now_ms() -> u64 {
    poolgate::clock::system_time().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64
}

/// `/metrics` (admin token).
async fn metrics(gw: &Gateway) -> String {
    let r = Gateway::client().get(format!("{}/metrics", gw.url)).bearer_auth(ADMIN).send().await.unwrap();
    r.text().await.unwrap()
}

/// The value of counter line `series` (`name{labels}`) in `text`, 0 if absent.
fn counter(text: &str, series: &str) -> u64 {
    text.lines().find_map(|l| l.strip_prefix(series)?.trim().parse().ok()).unwrap_or(0)
}
