//! Where a chain load is: which stage, and which phase of it — so that a start or
//! a reload that gives up can say what it was waiting for.
//!
//! The bound on a whole load lives with whoever loads a generation
//! (`gateway::generation`): each phase has its own bound, and a load that stays
//! in one phase past it is dropped and refused, naming the stage and the phase.
//! Loading code marks its progress here as it goes ([`stage`], [`phase`]); the
//! marks go to the [`LoadWatch`] of the task that loads (a task-local, set by
//! [`LoadWatch::scope`]), so the chain and the plugin loader need not carry it
//! through every signature, and a load without a watch (a test, `poolgate rank`)
//! marks nothing.

use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;
use tokio::sync::Notify;

/// A phase of loading one stage (or the chain).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoadPhase {
    /// Before the chain: credentials, accounts.
    Prepare,
    /// Reading the plugin file and compiling it (or taking it from a cache).
    Compile,
    /// Instantiating the first instance and running `configure`.
    Configure,
    /// Ranking a synthetic request through the whole chain, and observing it.
    Smoke,
}

impl LoadPhase {
    /// Its name in logs and refusals.
    pub fn as_str(self) -> &'static str {
        match self {
            LoadPhase::Prepare => "prepare",
            LoadPhase::Compile => "compile",
            LoadPhase::Configure => "configure",
            LoadPhase::Smoke => "smoke test",
        }
    }
}

/// Where a load is now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    /// The stage being loaded (index in the chain, name); none before the
    /// first stage and during the smoke test, which runs the whole chain.
    pub stage: Option<(usize, String)>,
    /// What it is doing.
    pub phase: LoadPhase,
    /// When it entered this step.
    pub since: Instant,
    /// Counts steps, so that a watcher can tell a step from the next one of
    /// the same kind.
    pub seq: u64,
}

/// The progress of one load.
#[derive(Debug)]
pub struct LoadWatch {
    step: Mutex<Step>,
    changed: Notify,
}

tokio::task_local! {
    static WATCH: Arc<LoadWatch>;
}

impl LoadWatch {
    /// A watch whose load starts now, preparing.
    pub fn new(now: Instant) -> Arc<LoadWatch> {
        Arc::new(LoadWatch {
            step: Mutex::new(Step { stage: None, phase: LoadPhase::Prepare, since: now, seq: 0 }),
            changed: Notify::new(),
        })
    }

    /// Runs `load` with this watch receiving its marks.
    pub async fn scope<F: Future>(self: &Arc<Self>, load: F) -> F::Output {
        WATCH.scope(self.clone(), load).await
    }

    /// Where the load is now.
    pub fn now(&self) -> Step {
        self.step.lock().clone()
    }

    /// Resolves at the next step (register before reading [`LoadWatch::now`]
    /// to miss none: see [`Notify::notified`]).
    pub fn changed(&self) -> tokio::sync::futures::Notified<'_> {
        self.changed.notified()
    }

    fn set(&self, stage: Option<Option<(usize, String)>>, phase: LoadPhase) {
        {
            let mut s = self.step.lock();
            if let Some(stage) = stage {
                s.stage = stage;
            }
            s.phase = phase;
            s.since = crate::clock::machine_instant();
            s.seq += 1;
        }
        self.changed.notify_waiters();
    }
}

/// Marks the start of loading stage `index` (`name`): its compile phase.
pub fn stage(index: usize, name: &str) {
    let _ = WATCH.try_with(|w| w.set(Some(Some((index, name.to_string()))), LoadPhase::Compile));
}

/// Marks the start of `phase` of the stage being loaded (or, for
/// [`LoadPhase::Smoke`], of the whole chain).
pub fn phase(phase: LoadPhase) {
    let stage = (phase == LoadPhase::Smoke).then_some(None);
    let _ = WATCH.try_with(|w| w.set(stage, phase));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn marks_reach_the_watch_of_the_loading_task_only() {
        let watch = LoadWatch::new(crate::clock::machine_instant());
        watch
            .scope(async {
                stage(2, "slow");
                phase(LoadPhase::Configure);
            })
            .await;
        let now = watch.now();
        assert_eq!((now.stage, now.phase, now.seq), (Some((2, "slow".into())), LoadPhase::Configure, 2));
        // Outside any scope: nothing to mark, nothing fails.
        stage(0, "other");
        assert_eq!(watch.now().seq, 2);
        watch.scope(async { phase(LoadPhase::Smoke) }).await;
        assert_eq!((watch.now().stage, watch.now().phase), (None, LoadPhase::Smoke));
    }
}
