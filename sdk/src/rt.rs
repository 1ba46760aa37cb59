//! The glue between the generated bindings and a [`Ranker`]: one ranker per
//! instance, kept in a thread-local slot (a component instance is single-threaded).

use std::any::Any;
use std::cell::RefCell;

use crate::{Account, AccountInfo, Candidates, Config, Outcome, Pool, QuotaWindow, Ranker, Ranking, Request};

struct Slot {
    ranker: Box<dyn Any>,
    pool: Pool,
}

thread_local! {
    static SLOT: RefCell<Option<Slot>> = const { RefCell::new(None) };
}

/// Parses the config, builds the ranker and keeps it for later calls.
pub fn configure<R: Ranker>(config: String, pool: Vec<AccountInfo>) -> Result<(), String> {
    let config = Config::parse(&config)?;
    // Natively (a plugin's own unit tests) there is no host to ask.
    #[cfg(target_arch = "wasm32")]
    let pool = Pool::new(pool).with_freshness_ms(crate::host::freshness_ms());
    #[cfg(not(target_arch = "wasm32"))]
    let pool = Pool::new(pool);
    let ranker = R::configure(config, &pool)?;
    SLOT.with_borrow_mut(|slot| *slot = Some(Slot { ranker: Box::new(ranker), pool }));
    Ok(())
}

fn with_ranker<R: Ranker, T>(f: impl FnOnce(&mut R, &Pool) -> T) -> Result<T, String> {
    SLOT.with_borrow_mut(|slot| {
        let slot = slot.as_mut().ok_or_else(|| "rank called before configure".to_string())?;
        let ranker = slot.ranker.downcast_mut::<R>().ok_or_else(|| "ranker type mismatch".to_string())?;
        Ok(f(ranker, &slot.pool))
    })
}

/// Runs one `rank` call.
pub fn rank<R: Ranker>(req: Request, candidates: Vec<Account>, windows: Vec<QuotaWindow>) -> Result<Ranking, String> {
    with_ranker::<R, _>(|ranker, pool| {
        let candidates = Candidates::new(candidates, windows, pool);
        ranker.rank(&req, &candidates)
    })?
}

/// Runs one `observe` call; an account index outside the pool is ignored.
pub fn observe<R: Ranker>(req: Request, account: u32, ended: Outcome) {
    let _ = with_ranker::<R, _>(|ranker, pool| {
        if let Some(info) = pool.get(account) {
            ranker.observe(&req, info, &ended);
        }
    });
}
