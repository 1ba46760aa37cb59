//! One plugin instance: its store, its exports, and every call into it — each
//! bounded by a CPU budget (fuel), a wall-clock bound, and a net for panics.
//!
//! An instance whose call failed in any way is never used again (a trapped
//! instance cannot be entered, and one cut short mid-call is in an unknown
//! state); the pool replaces it in the background.

use std::time::Duration;

use wasmtime::Store;
use wasmtime::component::{ComponentExportIndex, Func, TypedFunc};

use super::bindings::{Account, AccountInfo, Outcome, Policy, PolicyPre, QuotaWindow, Ranking, Request};
use super::bounded::{Bounded, Cut};
use super::engine::{CallGuard, YIELD_FUEL, fuel};
use super::fault::{Cause, Fault};
use super::lowering::{FastAccount, FastWindow, fast_accounts, fast_windows};
use super::sandbox::{MAX_HOSTCALL_BYTES, Sandbox, SandboxSpec};

/// The parameters `rank` is called with (see `lowering`).
type RankParams<'a> = (&'a Request, &'a [FastAccount], &'a [FastWindow]);
type RankResults = (Result<Ranking, String>,);

/// The time bounds of one call.
#[derive(Debug, Clone, Copy)]
pub struct Budget {
    /// CPU budget: the call's fuel is this many ms of work.
    pub cpu: Duration,
    /// Wall-clock bound: what the call may take however it spends it.
    pub wall: Duration,
}

impl Budget {
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
            Ok(wasmtime::UpdateDeadline::YieldCustom(1, Box::pin(tokio::task::yield_now())))
        });
        store.set_epoch_deadline(1);
        let _running = CallGuard::enter();
        prepared.map_err(|e| Fault::new(Cause::Host, format!("cannot prepare the store: {e}")))?;
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
            budget.wall,
        )
        .await;
        let (policy, rank) = settle(&mut store, instantiated, budget).map_err(|f| f.context("instantiation failed"))?;
        let configured =
            Bounded::new(policy.poolgate_policy_ranker().call_configure(&mut store, config_json, pool), budget.wall)
                .await;
        match settle(&mut store, configured, budget) {
            Ok(Ok(())) => Ok(Instance { store, policy, rank }),
            Ok(Err(msg)) => Err(Fault::new(Cause::Error, format!("configure refused its options: {msg}"))),
            Err(f) => Err(f.context("configure failed")),
        }
    }

    /// Asks the plugin to order `candidates`. Only the shape of the answer is
    /// checked here; the chain validates it against the input.
    pub async fn rank(
        &mut self,
        req: &Request,
        candidates: &[Account],
        windows: &[QuotaWindow],
        budget: Budget,
    ) -> Result<Ranking, Fault> {
        let _running = self.begin(req, budget)?;
        // SAFETY: `rank` was type-checked against exactly these types when the
        // instance was created.
        let typed = unsafe { TypedFunc::<RankParams<'_>, RankResults>::new_unchecked(self.rank) };
        let called = Bounded::new(
            typed.call_async(&mut self.store, (req, fast_accounts(candidates), fast_windows(windows))),
            budget.wall,
        )
        .await;
        let (answer,) = settle(&mut self.store, called, budget)?;
        answer.map_err(|msg| Fault::new(Cause::Error, msg))
    }

    /// Tells the plugin how a request ended on pool account `account`.
    pub async fn observe(
        &mut self,
        req: &Request,
        account: u32,
        outcome: &Outcome,
        budget: Budget,
    ) -> Result<(), Fault> {
        let _running = self.begin(req, budget)?;
        let called = Bounded::new(
            self.policy.poolgate_policy_ranker().call_observe(&mut self.store, req, account, *outcome),
            budget.wall,
        )
        .await;
        settle(&mut self.store, called, budget)
    }

    fn begin(&mut self, req: &Request, budget: Budget) -> Result<CallGuard, Fault> {
        self.store.data_mut().begin_call(req.id, req.now_ms);
        // Two ticks, not one: a call that starts just before a tick would
        // otherwise yield after microseconds, and a yielded call waits behind
        // the executor's whole queue holding its instance — under a burst, tens
        // of milliseconds for a microsecond plugin (docs/benchmarks.md,
        // "Bursts"). Every call still yields within 2 ms.
        self.store.set_epoch_deadline(2);
        self.store.set_fuel(fuel(budget.cpu)).map_err(|e| Fault::new(Cause::Host, format!("cannot refuel: {e}")))?;
        Ok(CallGuard::enter())
    }

    /// Bytes of memory the instance holds (all memories and tables).
    pub fn memory_bytes(&self) -> usize {
        self.store.data().limiter.used()
    }
}

/// Classifies how a bounded call ended, after turning the guest's stdio into log
/// lines; a trap's message carries what the guest last wrote to stderr.
fn settle<T>(store: &mut Store<Sandbox>, result: Result<wasmtime::Result<T>, Cut>, budget: Budget) -> Result<T, Fault> {
    let stderr = store.data_mut().flush_stdio();
    match result {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => {
            let f = Fault::from_call_error(&e, store.data().limiter.denied, &budget.describe());
            // What the guest printed last explains a trap, and an `oom` that
            // ended in a panic ("memory allocation failed").
            Err(if matches!(f.cause, Cause::Trap | Cause::Oom) { f.with_stderr(stderr) } else { f })
        }
        Err(Cut::Busy(d)) => Err(Fault::new(
            Cause::Timeout,
            format!(
                "busy for its wall-clock bound of {} ms, most of it in host calls (its CPU budget counts only its own instructions)",
                d.as_millis()
            ),
        )),
        Err(Cut::Waited(d)) => Err(Fault::new(
            Cause::Timeout,
            format!(
                "waited {} ms at once in a host call (a sleep or a poll): past its wall-clock bound",
                d.as_millis()
            ),
        )),
        Err(Cut::Panicked(m)) => Err(Fault::new(
            Cause::Host,
            format!("poolgate failed while serving the call (caught; the instance is discarded): {m}"),
        )),
    }
}
