//! What the gateway reads from files and from other replicas: its config,
//! a seat's credentials file, and the account records replicas exchange.

use std::path::Path;

use super::{CUT, NOW_MS};
use crate::config::validate;
use crate::learned::accounts::Learned;
use crate::learned::facts::{self, Absorbed, AccountFacts};
use crate::oauth::store::{Leftover, StoredCredential, Verdict, judge};

/// Where the config target's file "is": a directory that does not exist, so
/// every relative path it names (plugins, credentials, token files) resolves
/// to nothing rather than to whatever the fuzzer's working directory holds.
const CONFIG_FILE: &str = "/nonexistent/poolgate-fuzz/poolgate.toml";

/// A config file's text through the parser and validator `poolgate check`,
/// `serve` and every reload run: a valid config, or problems — at least one,
/// each located in the file — never a panic. What it accepts is TOML.
pub fn config(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    match validate::parse(text, CONFIG_FILE) {
        Ok((mut config, index)) => {
            assert!(text.parse::<toml::Table>().is_ok(), "accepted a file that is not TOML");
            config.resolve_paths(Path::new(CONFIG_FILE).parent().expect("a directory"));
            if let Err(problems) = validate::meaning(&config, &index, CONFIG_FILE, None) {
                assert!(!problems.items.is_empty(), "refused without a problem");
                assert!(problems.to_string().contains(CONFIG_FILE), "a problem names its file");
            }
            let _ = config.stage_specs();
            let _ = (config.breaker(), config.compile_limits(), config.state_limits());
        }
        Err(problems) => {
            assert!(!problems.items.is_empty(), "refused without a problem");
            assert!(problems.items.iter().all(|p| !p.message.is_empty()), "a problem says what is wrong");
        }
    }
}

/// A seat's credentials file (and Claude Code's, which `accounts import`
/// reads), and the recovery rule between a leftover temporary file and the
/// file: input cut at [`CUT`] into the leftover's text and the file's. A
/// credential read holds two tokens, and survives its own write.
pub fn credentials(data: &[u8]) {
    let mut parts = data.splitn(2, |&b| b == CUT);
    let (leftover, file) = (parts.next().unwrap_or_default(), parts.next());
    let read = |bytes: &[u8]| {
        let text = std::str::from_utf8(bytes).ok()?;
        let path = Path::new("/nonexistent/credentials.json");
        let c = StoredCredential::parse(text, path).ok()?;
        assert!(
            !c.access_token.trim().is_empty() && !c.refresh_token.trim().is_empty(),
            "a credential without a token"
        );
        let written = serde_json::to_string_pretty(&c).expect("credentials serialize");
        assert_eq!(StoredCredential::parse(&written, path).ok().as_ref(), Some(&c), "a written credential reads back");
        Some(c)
    };
    if let Ok(text) = std::str::from_utf8(leftover)
        && let Ok(c) = StoredCredential::from_claude_code(text, NOW_MS)
    {
        assert!(!c.access_token.is_empty() && !c.refresh_token.is_empty());
    }
    let leftover = Leftover { credential: read(leftover), modified: None, writer_runs: false, age_ms: 0 };
    let file = file.and_then(read);
    match judge(&leftover, file.as_ref(), None) {
        Verdict::Recover => {
            let pair = leftover.credential.as_ref().expect("only a whole pair is recovered");
            assert!(
                file.is_none_or(|f| f.refresh_token != pair.refresh_token && f.obtained_at_ms < pair.obtained_at_ms)
            );
        }
        Verdict::Discard(why) => assert!(!why.is_empty()),
        Verdict::Keep => panic!("a leftover whose writer is gone is never kept"),
    }
}

/// Account records as replicas exchange them through Redis (JSON, cut at
/// [`CUT`]), merged into one view. The merge is a join: absorbing a record
/// again changes nothing, the order they arrive in does not change the
/// view, and nothing merged lies in the future.
pub fn replica_merge(data: &[u8]) {
    let records: Vec<AccountFacts> =
        data.split(|&b| b == CUT).filter_map(|r| serde_json::from_slice(r).ok()).take(8).collect();
    let Some(identity) = records.first().map(|r| r.identity.clone()) else { return };
    let merged = |order: &mut dyn Iterator<Item = (usize, &AccountFacts)>| {
        let mut l = Learned::default();
        for (i, f) in order {
            let _ = facts::absorb(&mut l, f, &format!("r{i}"), Some(&identity), NOW_MS);
        }
        l
    };
    let mut l = merged(&mut records.iter().enumerate());
    for (i, f) in records.iter().enumerate() {
        let again = facts::absorb(&mut l, f, &format!("r{i}"), Some(&identity), NOW_MS);
        assert!(!matches!(again, Absorbed::Merged(true)), "absorbing record {i} again changed the view");
        let mut fresh = Learned::default();
        let _ = facts::restore(&mut fresh, f, Some(&identity), NOW_MS);
    }
    assert!(l.windows.values().all(|w| w.observed_at_ms.is_none_or(|t| t <= NOW_MS)), "a window from the future");
    assert!(l.last_reading_ms.is_none_or(|t| t <= NOW_MS), "a reading from the future");
    let reversed = merged(&mut records.iter().enumerate().rev());
    assert_eq!(view(&l), view(&reversed), "the merge depends on the order records arrive in");
}

/// What a replica's view says about an account (its own streaks aside):
/// the record it would write, gates in a fixed order.
fn view(l: &Learned) -> AccountFacts {
    let mut f = facts::export(l, "view", NOW_MS);
    f.gates.sort_by(|a, b| a.family.cmp(&b.family));
    f.gates_cleared.sort();
    f.streaks = Default::default();
    f.streaks_ms = 0;
    f
}
