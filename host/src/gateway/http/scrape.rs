//! `GET /metrics`: the process's counters and histograms, and the gauges read
//! from the live state at this scrape — so a gauge is never stale, and the
//! request path pays nothing for them. What the gauges say is shaped in
//! `crate::metrics`; here the gateway's state is read into it.

use axum::extract::State;
use axum::response::{IntoResponse, Response};

use super::handlers::AppState;
use crate::account::CooldownReason;
use crate::gateway::Gateway;
use crate::gateway::generation::Generation;
use crate::metrics::{Gauge, PoolCounts, QuotaAccount, labels};

/// The handler.
pub async fn metrics(State(s): State<AppState>) -> Response {
    let gw = &s.gateway;
    let g = gw.generation();
    let mut gauges = live_gauges(gw, &g);
    gauges.extend(stage_gauges(&g, gw.clock.now_ms()));
    gauges.extend(account_gauges(&g, gw.clock.now_ms()));
    gauges.extend(ledger_gauges(gw.ledger.as_ref().map(|l| l.health())));
    let text = gw.metrics.render(&gauges);
    ([(http::header::CONTENT_TYPE, crate::metrics::CONTENT_TYPE)], text).into_response()
}

/// In flight, cooling, the queue, the generation, connections, the state backend.
fn live_gauges(gw: &Gateway, g: &Generation) -> Vec<Gauge<'static>> {
    let now = gw.clock.now_ms();
    let in_flight =
        g.accounts.iter().map(|a| (labels(&[("account", &a.config.id)]), a.state.in_flight() as f64)).collect();
    let cooling = g
        .accounts
        .iter()
        .map(|a| (labels(&[("account", &a.config.id)]), if a.state.cooldown(now).is_some() { 1.0 } else { 0.0 }))
        .collect();
    vec![
        ("poolgate_in_flight", "Requests in flight, by account.", in_flight),
        ("poolgate_account_cooling", "1 while the account is cooling down.", cooling),
        (
            "poolgate_queue_depth",
            "Requests waiting for an in-flight slot.",
            vec![(Vec::new(), gw.admission.depth() as f64)],
        ),
        ("poolgate_config_generation", "The configuration generation in force.", vec![(Vec::new(), g.number as f64)]),
        (
            "poolgate_client_connections",
            "Client connections open.",
            vec![(Vec::new(), gw.lifecycle.connections() as f64)],
        ),
        (
            "poolgate_client_connections_limit",
            "The most client connections open at once (server.max_connections, or derived from the open-file limit).",
            vec![(Vec::new(), gw.lifecycle.connection_limit(g.config.server.max_connections) as f64)],
        ),
        (
            "poolgate_state_backend_up",
            "1 while this replica is in step with the shared state backend (always 1 for memory).",
            vec![(Vec::new(), if gw.shared.status().connected { 1.0 } else { 0.0 })],
        ),
    ]
}

/// Each chain stage: its breaker, pool, queue and the most one call cost.
fn stage_gauges(g: &Generation, now: u64) -> Vec<Gauge<'static>> {
    let stages = g.chain.status(now);
    let per_stage = |f: &dyn Fn(&crate::policy::StageStatus) -> f64| {
        stages.iter().map(|st| (labels(&[("stage", &st.name)]), f(st))).collect::<Vec<_>>()
    };
    vec![
        (
            "poolgate_stage_breaker_open",
            "1 while a chain stage is bypassed by its breaker.",
            per_stage(&|st| if st.breaker.state == "closed" { 0.0 } else { 1.0 }),
        ),
        (
            "poolgate_stage_busy_share",
            "Share of a stage's last 64 rankings skipped because no instance was free (busy); above 0.5 the stage is \
             mostly skipped.",
            per_stage(&|st| {
                let b = st.busy_share;
                if b.of == 0 { 0.0 } else { f64::from(b.busy) / f64::from(b.of) }
            }),
        ),
        (
            "poolgate_stage_instances",
            "Instances of a stage's plugin alive (idle, in a call, or being built).",
            per_stage(&|st| st.pool.live as f64),
        ),
        (
            "poolgate_stage_observe_queued",
            "observe calls queued for an instance of a stage's plugin.",
            per_stage(&|st| st.pool.observe_queued as f64),
        ),
        (
            "poolgate_stage_observe_dropped",
            "observe calls dropped since the stage was loaded: its queue was full, or no instance came in time.",
            per_stage(&|st| st.pool.observe_dropped as f64),
        ),
        (
            "poolgate_stage_fuel_high_water",
            "The most fuel one call of a stage burned (rank or observe) since it was loaded; a call's budget is \
             [policy] deadline_ms worth of fuel, so near it the stage is about to time out.",
            per_stage(&|st| st.high_water.fuel as f64),
        ),
        (
            "poolgate_stage_memory_high_water_bytes",
            "The most memory one instance of a stage held after a call since it was loaded, bytes; near the stage's \
             memory cap its calls are about to fail with oom.",
            per_stage(&|st| st.high_water.memory_bytes as f64),
        ),
    ]
}

/// Each account's quota and seat, cooldowns by cause, and the pool's size
/// against what can serve now.
fn account_gauges(g: &Generation, now: u64) -> Vec<Gauge<'static>> {
    let snapshots: Vec<_> = g.accounts.iter().map(|a| a.state.snapshot(&a.config, now)).collect();
    let read: Vec<Option<u64>> = g.accounts.iter().map(|a| a.state.last_reading_ms()).collect();
    let quota: Vec<QuotaAccount<'_>> = snapshots
        .iter()
        .zip(&read)
        .map(|(s, at)| QuotaAccount { id: &s.id, windows: &s.windows, last_reading_ms: *at })
        .collect();
    let seats: Vec<(&str, bool)> =
        g.accounts.iter().filter_map(|a| Some((a.config.id.as_str(), a.state.seat()?.needs_login()))).collect();
    let usable =
        g.accounts.iter().zip(&snapshots).filter(|(a, s)| s.usable(None, now) && !a.state.is_runtime_disabled());
    let counts = PoolCounts {
        accounts: g.accounts.len(),
        usable: usable.count(),
        needing_login: seats.iter().filter(|(_, needs)| *needs).count(),
    };
    let causes = snapshots.iter().flat_map(|s| {
        let gated = s.model_gates.iter().any(|gate| gate.until_ms > now);
        s.active_cooldown(now).map(|c| c.reason).into_iter().chain(gated.then_some(CooldownReason::ModelExhausted))
    });
    let mut gauges = crate::metrics::quota_gauges(&quota, now);
    gauges.push(crate::metrics::cooldowns_active(causes));
    gauges.extend(crate::metrics::pool_gauges(counts));
    gauges.push((
        "poolgate_seat_needs_login",
        "1 while an OAuth seat's refresh token is refused and it waits for `poolgate login`, by account (every seat \
         of the pool listed).",
        seats.iter().map(|(id, needs)| (labels(&[("account", id)]), if *needs { 1.0 } else { 0.0 })).collect(),
    ));
    gauges
}

/// The usage ledger's gauges (none without a ledger).
fn ledger_gauges(health: Option<crate::ledger::Health>) -> Vec<Gauge<'static>> {
    let ledger = |f: &dyn Fn(&crate::ledger::Health) -> f64| health.iter().map(|h| (Vec::new(), f(h))).collect();
    vec![
        (
            "poolgate_ledger_up",
            "1 while the usage ledger's store takes writes (absent without a ledger).",
            ledger(&|h| if h.down.is_none() { 1.0 } else { 0.0 }),
        ),
        ("poolgate_ledger_queued", "Usage entries waiting to be written.", ledger(&|h| h.queued as f64)),
        (
            "poolgate_ledger_dropped_entries",
            "Usage entries dropped since the start because the queue was full while the store was down (a count \
             that only grows).",
            ledger(&|h| h.dropped as f64),
        ),
    ]
}
