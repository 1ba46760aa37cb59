//! One plugin instance: its store, its exports, and every call into it — each
//! bounded by a CPU budget (fuel), a wall-clock budget that sums every wait and
//! a hard cap (see [`super::bounded`]), and a net for panics. Building an
//! instance (instantiation, then `configure`) is one budget too: the two share
//! one [`Tally`], so a start made of many short waits ends like a call does.
//!
//! An instance whose call failed in any way is never used again (a trapped
//! instance cannot be entered, and one cut short mid-call is in an unknown
//! state); the pool replaces it in the background.

use std::time::Duration;

use wasmtime::Store;
use wasmtime::component::{ComponentExportIndex, Func, TypedFunc};

use super::bindings::{Account, AccountInfo, Outcome, Policy, PolicyPre, QuotaWindow, Ranking, Request};
use super::bounded::{Bounded, Cut, Limit, Spent, Tally};
use super::breaker::Phase;
use super::engine::{CallGuard, FUEL_PER_MS, YIELD_FUEL, fuel};
use super::fault::{Cause, Fault};
use super::limiter::MAX_HOSTCALL_BYTES;
use super::lowering::{FastAccount, FastWindow, fast_accounts, fast_windows};
use super::sandbox::{Sandbox, SandboxSpec};

/// The parameters `rank` is called with (see `lowering`).
type RankParams<'a> = (&'a Request, &'a [FastAccount], &'a [FastWindow]);
type RankResults = (Result<Ranking, String>,);

/// The time bounds of one call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    /// CPU budget: the call's fuel is this many ms of work. It is the
    /// configured deadline.
    pub cpu: Duration,
    /// Wall-clock limits: the plugin's own time (running plus waiting) and the
    /// hard cap (see [`super::bounded`]).
    pub wall: Limit,
}

impl Budget {
    /// The bounds of a call whose configured deadline is `deadline`: that much
    /// fuel, and [`Limit::for_deadline`] on the wall clock.
    pub fn for_deadline(deadline: Duration) -> Budget {
        Budget { cpu: deadline, wall: Limit::for_deadline(deadline) }
    }

    /// The bounds of building an instance whose configure deadline is
    /// `deadline`: that much fuel, and [`Limit::for_configure`].
    pub fn for_configure(deadline: Duration) -> Budget {
        Budget { cpu: deadline, wall: Limit::for_configure(deadline) }
    }

    fn describe(&self) -> String {
        format!("{} ms", self.cpu.as_millis())
    }
}

/// A live, configured instance.
pub struct Instance {
    store: Store<Sandbox>,
    policy: Policy,
    /// `rank`, type-checked against the bulk-lowering parameter types once.
    rank: Func,
}

impl Instance {
    /// Instantiates the component and configures it, within `budget` (which
    /// covers both: a language runtime's start-up is part of configuring).
    pub async fn create(
        pre: &PolicyPre<Sandbox>,
        rank_export: ComponentExportIndex,
        sandbox: SandboxSpec,
        config_json: &str,
        pool: &[AccountInfo],
        budget: Budget,
    ) -> Result<Instance, Fault> {
        let mut store = Store::new(pre.engine(), Sandbox::new(sandbox));
        store.limiter(|s| &mut s.limiter);
        // What one host call may copy out of the guest (see `sandbox`).
        store.set_hostcall_fuel(MAX_HOSTCALL_BYTES);
        let prepared =
            store.set_fuel(fuel(budget.cpu)).and_then(|()| store.fuel_async_yield_interval(Some(YIELD_FUEL)));
        // Yield at every epoch tick (1 ms), host calls or not — through tokio's
        // own yield, which lets the worker poll its I/O driver before the call
        // resumes (a plain re-wake could run 61 such slices back to back, and a
        // `/healthz` waiting on the driver would wait for all of them).
        store.epoch_deadline_callback(|_| {
            Ok(wasmtime::UpdateDeadline::YieldCustom(1, Box::pin(super::bounded::yield_now())))
        });
        store.set_epoch_deadline(1);
        let _running = CallGuard::enter();
        prepared.map_err(|e| Fault::new(Cause::Host, format!("cannot prepare the store: {e}")))?;
        let mut tally = Tally::new(budget.wall);
        let instantiated = Bounded::new(
            async {
                let instance = pre.instance_pre().instantiate_async(&mut store).await?;
                let policy = Policy::new(&mut store, &instance)?;
                let rank = instance
                    .get_func(&mut store, rank_export)
                    .ok_or_else(|| wasmtime::format_err!("no `rank` export"))?;
                // Type-check once; calls then skip the check (see `rank`).
                rank.typed::<RankParams<'_>, RankResults>(&store)?;
                wasmtime::Result::Ok((policy, rank))
            },
            &mut tally,
        )
        .await;
        let call = Call { phase: Phase::Configure, budget, tally: &tally };
        let (policy, rank) = settle(&mut store, instantiated, call).map_err(|f| {
            if f.cause == Cause::Timeout { f.context("while instantiating") } else { f.context("instantiation failed") }
        })?;
        let configured =
            Bounded::new(policy.poolgate_policy_ranker().call_configure(&mut store, config_json, pool), &mut tally)
                .await;
        let call = Call { phase: Phase::Configure, budget, tally: &tally };
        match settle(&mut store, configured, call) {
            Ok(Ok(())) => Ok(Instance { store, policy, rank }),
            Ok(Err(msg)) => Err(Fault::new(Cause::Error, format!("configure refused its options: {msg}"))),
            Err(f) if f.cause == Cause::Timeout => Err(f),
            Err(f) => Err(f.context("configure failed")),
        }
    }

    /// Asks the plugin to order `candidates`. Only the shape of the answer is
    /// checked here; the chain validates it against the input. Where the
    /// call's time went is left in `spent`: its own time (on a CPU plus
    /// waiting) is what the pool judges a plugin's speed by, since the wall
    /// time an instance is held also counts time the call sat queued for a
    /// thread. (Not kept in the instance: every byte of it is copied each
    /// time the instance goes back to its pool.)
    pub async fn rank(
        &mut self,
        req: &Request,
        candidates: &[Account],
        windows: &[QuotaWindow],
        budget: Budget,
        spent: &mut Spent,
    ) -> Result<Ranking, Fault> {
        let _running = self.begin(req, budget)?;
        // SAFETY: `rank` was type-checked against exactly these types when the
        // instance was created.
        let typed = unsafe { TypedFunc::<RankParams<'_>, RankResults>::new_unchecked(self.rank) };
        let mut tally = Tally::new(budget.wall);
        let called = Bounded::new(
            typed.call_async(&mut self.store, (req, fast_accounts(candidates), fast_windows(windows))),
            &mut tally,
        )
        .await;
        *spent = tally.settled();
        let (answer,) = settle(&mut self.store, called, Call { phase: Phase::Rank, budget, tally: &tally })?;
        answer.map_err(|msg| Fault::new(Cause::Error, msg))
    }

    /// Tells the plugin how a request ended on pool account `account`; where
    /// the call's time went is left in `spent` (as for `rank`).
    pub async fn observe(
        &mut self,
        req: &Request,
        account: u32,
        outcome: &Outcome,
        budget: Budget,
        spent: &mut Spent,
    ) -> Result<(), Fault> {
        let _running = self.begin(req, budget)?;
        let mut tally = Tally::new(budget.wall);
        let called = Bounded::new(
            self.policy.poolgate_policy_ranker().call_observe(&mut self.store, req, account, *outcome),
            &mut tally,
        )
        .await;
        *spent = tally.settled();
        settle(&mut self.store, called, Call { phase: Phase::Observe, budget, tally: &tally })
    }

    fn begin(&mut self, req: &Request, budget: Budget) -> Result<CallGuard, Fault> {
        self.store.data_mut().begin_call(req.id, req.now_ms);
        // Two ticks, not one: a call that starts just before a tick would
        // otherwise yield after microseconds, and a yielded call leaves the
        // request's thread for the call threads (`policy::calls`) — a move
        // that costs more than the call. Every call still yields within 2 ms.
        self.store.set_epoch_deadline(2);
        self.store.set_fuel(fuel(budget.cpu)).map_err(|e| Fault::new(Cause::Host, format!("cannot refuel: {e}")))?;
        Ok(CallGuard::enter())
    }

    /// The fuel the last call burned, of the `budget` it was given.
    pub fn fuel_burned(&self, budget: Budget) -> u64 {
        burned(&self.store, budget).unwrap_or(0)
    }

    /// Bytes of memory the instance holds (all memories and tables).
    pub fn memory_bytes(&self) -> usize {
        self.store.data().limiter.used()
    }
}

/// What a bounded call was, for the message of its fault.
#[derive(Clone, Copy)]
struct Call<'a> {
    phase: Phase,
    budget: Budget,
    tally: &'a Tally,
}

/// Classifies how a bounded call ended, after turning the guest's stdio into log
/// lines; a trap's message carries the guest's last words (stderr, or an
/// error it logged).
fn settle<T>(store: &mut Store<Sandbox>, result: Result<wasmtime::Result<T>, Cut>, call: Call<'_>) -> Result<T, Fault> {
    let words = store.data_mut().flush_stdio();
    let phase = call.phase.as_str();
    match result {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => {
            let f = Fault::from_call_error(&e, store.data().limiter.denied, &call.budget.describe());
            if f.cause == Cause::Timeout {
                let total = call.tally.spent(tokio::time::Instant::now()).total;
                return Err(f.context(&format!("{phase} cut after {} ms", total.as_millis())));
            }
            // What the guest printed last explains a trap, and an `oom` that
            // ended in a panic ("memory allocation failed").
            Err(if matches!(f.cause, Cause::Trap | Cause::Oom) { f.with_last_words(words) } else { f })
        }
        Err(Cut::OverBudget(spent)) => {
            let guest = guest_time(store, call.budget);
            Err(Fault::new(Cause::Timeout, over_budget(phase, &spent, call.budget, guest)))
        }
        Err(Cut::OverCap(spent)) => Err(Fault::new(Cause::Timeout, over_cap(phase, &spent, call.budget))),
        Err(Cut::Panicked(m)) => Err(Fault::new(
            Cause::Host,
            format!("poolgate failed while serving the call (caught; the instance is discarded): {m}"),
        )),
    }
}

/// About how long the guest's own instructions took, from the fuel it burned
/// (at the rate fuel is calibrated to).
fn guest_time(store: &Store<Sandbox>, budget: Budget) -> Option<Duration> {
    Some(Duration::from_micros(burned(store, budget)?.saturating_mul(1000) / FUEL_PER_MS))
}

/// The fuel the last call burned of the `budget` it was given.
fn burned(store: &Store<Sandbox>, budget: Budget) -> Option<u64> {
    Some(fuel(budget.cpu).saturating_sub(store.get_fuel().ok()?))
}

fn ms(d: Duration) -> u128 {
    d.as_millis()
}

/// The message of a call cut at its own-time budget: the phase, the total, how
/// it was spent, and where most of it went — by what was measured.
pub fn over_budget(phase: &str, spent: &Spent, budget: Budget, guest: Option<Duration>) -> String {
    // Of the time on a CPU, the guest's own instructions (by fuel) and the rest:
    // host calls (which burn no fuel). Fuel is calibrated on an idle core; on
    // a loaded one (a busy hyperthread sibling, cold caches) the same fuel
    // takes up to about twice as long, so the guest is credited twice its fuel
    // time before the rest is blamed on host calls: a pure CPU loop under load
    // is not reported as host calls.
    let guest = (guest.unwrap_or_default() * 2).min(spent.on_cpu);
    let host = spent.on_cpu - guest;
    let parts = [
        (spent.waited, "waiting in host calls (a sleep, a slow host call): waits count toward the deadline too"),
        (host, "in host calls (its CPU budget counts only its own instructions)"),
        (guest, "running its own code"),
    ];
    let (_, most) = parts.iter().max_by_key(|(d, _)| *d).expect("three parts");
    format!(
        "{phase} cut after {} ms, over its budget of {} ms ({} ms deadline + {} ms slack) of its own time: \
         it ran {} ms on a CPU and waited {} ms (preempted {} ms, queued {} ms: not counted); most of it {most}",
        ms(spent.total),
        ms(budget.wall.own),
        ms(budget.cpu),
        ms(budget.wall.own.saturating_sub(budget.cpu)),
        ms(spent.on_cpu),
        ms(spent.waited),
        ms(spent.preempted()),
        ms(spent.queued()),
    )
}

/// The message of a call cut at its hard cap: most of its time it sat queued
/// for a thread.
pub fn over_cap(phase: &str, spent: &Spent, budget: Budget) -> String {
    format!(
        "{phase} cut after {} ms, its hard cap ({} ms, over its own-time budget of {} ms): it ran {} ms on a CPU \
         and waited {} ms, and was preempted or blocked {} ms and queued {} ms for a thread (the machine or the \
         thread is overloaded)",
        ms(spent.total),
        ms(budget.wall.cap),
        ms(budget.wall.own),
        ms(spent.on_cpu),
        ms(spent.waited),
        ms(spent.preempted()),
        ms(spent.queued()),
    )
}
