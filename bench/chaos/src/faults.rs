//! The injector: what goes wrong, when, and the timeline the verdict reads.
//!
//! Faults are drawn from a seeded generator, so a run can be repeated. All of
//! them but one kind leave the reserve account alone: outside an exhaustion
//! window some account can always serve, so any request that fails there is a
//! failure the gateway owed. In an exhaustion window every account answers
//! 429 with its window rejected until the window's end; then the fallback
//! serves, or, while it fails too, nothing can.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use poolgate_mock_upstream::{Quota, Step, TokenMode, Window, now_s};

use crate::forward::Mode;
use crate::world::{Chain, World};

/// How late the gateways may see an exhaustion window end (a reset is in
/// whole seconds; replicas learn through Redis).
pub const GRACE: Duration = Duration::from_secs(3);

/// A small seeded generator (xorshift64*): repeatable runs, no dependency.
pub struct Rng(u64);

impl Rng {
    /// Seeded; 0 is replaced, as xorshift needs a non-zero state.
    pub fn new(seed: u64) -> Rng {
        Rng(seed.max(1))
    }

    /// The next 64 random bits.
    pub fn bits(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in `lo..hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.bits() % (hi - lo).max(1)
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        (self.bits() >> 11) as f64 / (1u64 << 53) as f64 <= p
    }

    /// One of `items`.
    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.range(0, items.len() as u64) as usize]
    }
}

/// What happened when: the windows the verdict allows failures in, and a
/// count of every fault by kind.
#[derive(Default)]
pub struct Timeline {
    /// Exhaustion windows: every account parked from `.0` to `.1`.
    pub exhausted: Vec<(Instant, Instant)>,
    /// When the fallback failed: from `.0` to `.1` (open while failing).
    pub fallback_down: Vec<(Instant, Option<Instant>)>,
    /// Faults injected, by kind.
    pub faults: BTreeMap<&'static str, u64>,
    /// Reloads signalled to each replica: (valid, to be refused).
    pub reloads: BTreeMap<usize, (u64, u64)>,
    /// Reloads whose effect was not the promised one: a valid chain not
    /// running within seconds, or an invalid one not refused (the last good
    /// one no longer running).
    pub reload_mismatches: Vec<String>,
}

impl Timeline {
    fn count(&mut self, kind: &'static str) {
        *self.faults.entry(kind).or_default() += 1;
    }

    /// Whether `[start, end]` met a moment when no account could serve.
    pub fn parked(&self, start: Instant, end: Instant) -> bool {
        self.exhausted.iter().any(|(s, e)| start <= *e + GRACE && end >= *s)
    }

    /// Whether the fallback failed (or rested after failing) during `[start, end]`.
    pub fn fallback_failed(&self, start: Instant, end: Instant) -> bool {
        let rest = Duration::from_millis(1_500);
        self.fallback_down.iter().any(|(s, e)| start <= e.map_or(end, |e| e + rest) && end >= *s)
    }
}

/// How the injector paces itself.
pub struct Pace {
    /// Until when it injects.
    pub until: Instant,
    /// Between two exhaustion windows (the first comes after one period).
    pub exhaust_every: Duration,
    /// How long an exhaustion window lasts.
    pub exhaust_for: Duration,
    /// Between two reloads.
    pub reload_every: Duration,
    /// Between two Redis kills (it is down for a few seconds each time).
    pub redis_every: Duration,
}

/// Injects faults into `world` until `pace.until`, recording them.
pub async fn inject(world: Arc<World>, timeline: Arc<Mutex<Timeline>>, pace: Pace, seed: u64) {
    let mut rng = Rng::new(seed);
    let start = Instant::now();
    let (mut next_exhaust, mut next_reload, mut next_redis) =
        (start + pace.exhaust_every, start + pace.reload_every, start + pace.redis_every);
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    let chains = world.chains();
    let mut running = vec![crate::world::first_chain(); world.gateways.len()];
    while Instant::now() < pace.until {
        tick.tick().await;
        let now = Instant::now();
        if now >= next_exhaust && now + pace.exhaust_for < pace.until {
            next_exhaust = now + pace.exhaust_every;
            exhaust(&world, &timeline, &mut rng, pace.exhaust_for).await;
            continue;
        }
        if now >= next_reload {
            next_reload = now + pace.reload_every;
            let chain = rng.pick(&chains).clone();
            let r = rng.range(0, world.gateways.len() as u64) as usize;
            if world.reload(r, &chain).is_ok() {
                let expect = if chain.invalid() { running[r].clone() } else { chain.clone() };
                running[r] = expect.clone();
                let check = Check { url: world.gateways[r].url.clone(), replica: r, chain: chain.clone(), expect };
                tokio::spawn(check_reload(check, timeline.clone()));
                let mut t = timeline.lock();
                let sent = t.reloads.entry(r).or_default();
                match chain.invalid() {
                    true => sent.1 += 1,
                    false => sent.0 += 1,
                }
                t.count(match chain {
                    Chain::Hostile(_) => "reload: hostile plugin",
                    Chain::NotAPlugin => "reload: invalid plugin",
                    Chain::Unreadable => "reload: invalid config",
                    Chain::Builtins(_) => "reload: built-in chain",
                });
            }
        }
        if now >= next_redis && world.redis.is_some() {
            next_redis = now + pace.redis_every;
            redis_outage(&world, &timeline).await;
        }
        if rng.chance(0.35) {
            account_fault(&world, &timeline, &mut rng);
        }
        if rng.chance(0.04) {
            forwarder_fault(&world, &timeline, &mut rng);
        }
        if rng.chance(0.02) {
            token_outage(&world, &timeline, &mut rng);
        }
        if rng.chance(0.01) {
            revoke_a_seat(&world, &timeline, &mut rng);
        }
    }
}

/// What a reload must have done.
struct Check {
    url: String,
    replica: usize,
    chain: Chain,
    expect: Chain,
}

/// Polls the replica's `/status` until its chain is the one expected: the new
/// one after a valid reload (within 5 s), the last good one a second after an
/// invalid one. A chain that never comes is recorded.
async fn check_reload(c: Check, timeline: Arc<Mutex<Timeline>>) {
    let http = reqwest::Client::builder().timeout(Duration::from_secs(2)).build().expect("a reqwest client");
    let want = c.expect.names();
    if c.chain.invalid() {
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let deadline = Instant::now() + Duration::from_secs(if c.chain.invalid() { 1 } else { 5 });
    let mut seen = Vec::new();
    while Instant::now() < deadline {
        let status = http.get(format!("{}/status", c.url)).bearer_auth(crate::world::ADMIN).send().await;
        let body: serde_json::Value = match status {
            Ok(r) => r.json().await.unwrap_or_default(),
            Err(_) => serde_json::Value::Null,
        };
        seen = body["chain"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|s| s["name"].as_str().map(str::to_string))
            .collect();
        if seen == want {
            return;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let what = format!("replica {}: after a reload to {:?} it runs {seen:?}, not {want:?}", c.replica, c.chain);
    timeline.lock().reload_mismatches.push(what);
}

/// One burst of upstream answers on a random account but the reserve.
fn account_fault(world: &World, timeline: &Mutex<Timeline>, rng: &mut Rng) {
    let faulty: Vec<_> = world.members.iter().filter(|m| !m.reserve).collect();
    let m = rng.pick(&faulty);
    if m.account.pending() > 12 {
        return;
    }
    let (kind, step, n): (&'static str, Step, u64) = match rng.range(0, 8) {
        0 => (
            "429 storm, unified",
            Step::RateLimited { unified: true, retry_after: Some(rng.range(1, 3).to_string()) },
            rng.range(3, 8),
        ),
        1 => ("429 storm, bare", Step::RateLimited { unified: false, retry_after: None }, rng.range(3, 8)),
        2 => ("529 burst", Step::Overloaded, rng.range(2, 6)),
        3 => ("5xx", Step::ServerError(*rng.pick(&[500, 502, 503])), rng.range(1, 4)),
        4 => ("reset before the first byte", Step::ResetBeforeResponse, rng.range(1, 3)),
        5 => ("cut mid-stream", Step::ResetMidStream { after_events: rng.range(2, 7) as usize }, 1),
        6 => ("slow first byte", Step::Delay { ms: rng.range(300, 2_000), then: Box::new(Step::Ok) }, rng.range(1, 3)),
        _ => ("slow stream", Step::SlowStream { chunk_delay_ms: rng.range(50, 250) }, rng.range(1, 3)),
    };
    for _ in 0..n {
        m.account.push(step.clone());
    }
    timeline.lock().count(kind);
}

/// A forwarded account refuses connections, or closes them before answering,
/// for a second or three.
fn forwarder_fault(world: &World, timeline: &Mutex<Timeline>, rng: &mut Rng) {
    let forwarded: Vec<_> = world.members.iter().filter_map(|m| m.forwarder.clone()).collect();
    let f = rng.pick(&forwarded).clone();
    let (kind, mode) = match rng.chance(0.5) {
        true => ("connections refused", Mode::Refuse),
        false => ("closed before the first byte", Mode::CloseEarly),
    };
    let ms = rng.range(1_000, 3_000);
    f.set(mode);
    timeline.lock().count(kind);
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(ms)).await;
        f.set(Mode::Pass);
    });
}

/// The token endpoint fails (503) or hangs for a few seconds: seats whose
/// token expires meanwhile cannot refresh.
fn token_outage(world: &World, timeline: &Mutex<Timeline>, rng: &mut Rng) {
    let oauth = world.mock.oauth();
    let (kind, mode) = match rng.chance(0.5) {
        true => ("token endpoint 503", TokenMode::Failing(503)),
        false => ("token endpoint hangs", TokenMode::Hang),
    };
    oauth.set_mode(mode);
    timeline.lock().count(kind);
    let ms = rng.range(2_000, 7_000);
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(ms)).await;
        oauth.set_mode(TokenMode::Normal);
    });
}

/// A seat's login is revoked (its refresh answers `invalid_grant`); a few
/// seconds later the operator logs in again (a new login in its file).
fn revoke_a_seat(world: &World, timeline: &Mutex<Timeline>, rng: &mut Rng) {
    let seats: Vec<_> = world.members.iter().filter_map(|m| m.seat.clone()).collect();
    let (seat, path) = rng.pick(&seats).clone();
    seat.revoke();
    timeline.lock().count("seat revoked (invalid_grant), logged in again");
    let ms = rng.range(3_000, 6_000);
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(ms)).await;
        let _ = crate::world::write_credentials(&path, &seat);
    });
}

/// Every account answers 429 with its 5h window rejected until the window's
/// end; the fallback fails for half of the windows.
async fn exhaust(world: &World, timeline: &Mutex<Timeline>, rng: &mut Rng, length: Duration) {
    let start = Instant::now();
    let reset = now_s() + length.as_secs().max(1);
    let fallback_fails = rng.chance(0.5);
    let spent = Quota {
        status: Some("rejected".into()),
        reset_s: Some(reset),
        five_hour: Some(Window::new(1.0, "rejected", reset)),
        ..Quota::unified(1.0, 0.5)
    };
    let saved: Vec<_> = world.members.iter().map(|m| m.account.quota()).collect();
    for m in &world.members {
        m.account.set_quota(spent.clone());
        m.account.set_default(Step::RateLimited { unified: true, retry_after: None });
    }
    {
        let mut t = timeline.lock();
        t.count(if fallback_fails { "pool exhausted, fallback down" } else { "pool exhausted" });
        if fallback_fails {
            world.fallback.set_failing(true);
            t.fallback_down.push((start, None));
        }
    }
    tokio::time::sleep(length).await;
    for (m, q) in world.members.iter().zip(saved) {
        m.account.set_default(Step::Ok);
        m.account.set_quota(Quota { reset_s: q.reset_s.map(|_| now_s() + 5 * 3600), ..q });
    }
    let end = Instant::now();
    let mut t = timeline.lock();
    world.fallback.set_failing(false);
    if let Some(last) = t.fallback_down.last_mut().filter(|(_, e)| e.is_none()) {
        last.1 = Some(end);
    }
    t.exhausted.push((start, end));
}

/// Redis is killed (SIGKILL) and started again, empty, three seconds later.
async fn redis_outage(world: &World, timeline: &Mutex<Timeline>) {
    if let Some(redis) = &world.redis {
        redis.lock().kill();
        timeline.lock().count("redis killed and restarted");
        tokio::time::sleep(Duration::from_secs(3)).await;
        let redis = redis.clone();
        let _ = tokio::task::spawn_blocking(move || redis.lock().restart()).await;
    }
}
