//! The bounds of a call, on a paused clock.

use super::*;

const MS: Duration = Duration::from_millis(1);

fn limit(own_ms: u64, cap_ms: u64) -> Limit {
    Limit { own: MS * own_ms as u32, cap: MS * cap_ms as u32 }
}

async fn bounded<F: Future>(f: F, limit: Limit) -> (Result<F::Output, Cut>, Tally) {
    let mut tally = Tally::new(limit);
    let r = Bounded::new(f, &mut tally).await;
    (r, tally)
}

#[test]
fn the_arithmetic_is_the_deadline_plus_slack_and_a_cap_of_four_times_that() {
    assert_eq!(Limit::for_deadline(MS * 25), limit(45, 280));
    assert_eq!(Limit::for_deadline(MS), limit(21, 184));
    assert_eq!(Limit::for_deadline(MS * 5000), limit(6250, 25_100));
}

#[test]
fn a_wait_counts_until_its_wake_and_a_yield_not_at_all() {
    let t0 = Instant::now();
    let mut t = Tally::new(limit(100, 1000));
    t.resume(t0, None);
    t.ran(MS * 2, None);
    t.pause(t0 + MS * 2, Pause::Waiting);
    assert_eq!(t.wake_at(), Some(t0 + MS * 100));
    // Woken at 40 ms, polled at 90: 38 ms waited, 50 queued.
    t.resume(t0 + MS * 90, Some(t0 + MS * 40));
    t.ran(MS, None);
    t.pause(t0 + MS * 91, Pause::Yielded);
    assert_eq!(t.wake_at(), None);
    t.resume(t0 + MS * 500, None);
    let s = t.spent(t0 + MS * 500);
    assert_eq!((s.running, s.waited, s.total, s.queued()), (MS * 3, MS * 38, MS * 500, MS * 459));
    assert_eq!(t.over(t0 + MS * 500), None);
    assert!(matches!(t.over(t0 + MS * 1000), Some(Cut::OverCap(_))));
}

#[tokio::test]
async fn a_ready_future_passes_through() {
    assert_eq!(bounded(async { 7 }, limit(1, 4)).await.0, Ok(7));
}

#[tokio::test(start_paused = true)]
async fn a_waiting_future_is_cut_at_its_budget() {
    let started = Instant::now();
    let (r, _) = bounded(tokio::time::sleep(Duration::from_secs(3600)), limit(50, 200)).await;
    let Err(Cut::OverBudget(spent)) = r else { panic!("{r:?}") };
    assert_eq!(spent.waited, MS * 50);
    assert_eq!(started.elapsed(), MS * 50);
}

/// The attack of #22: a call made of sleeps each far shorter than the
/// budget. Each is a wait; they add up, and the call is cut at the budget.
#[tokio::test(start_paused = true)]
async fn sleeps_split_into_short_pieces_are_cut_at_the_budget() {
    let naps = async {
        for _ in 0..1_000 {
            tokio::time::sleep(MS * 20).await;
        }
    };
    let started = Instant::now();
    let (r, _) = bounded(naps, limit(45, 180)).await;
    let Err(Cut::OverBudget(spent)) = r else { panic!("{r:?}") };
    assert_eq!(started.elapsed(), MS * 45, "cut when the naps add up to the budget, not at a nap's end");
    assert_eq!(spent.waited, MS * 45);
}

/// The time a woken call waits for its thread is not the plugin's: a wait
/// counts until the wake, and the queue after it does not.
#[tokio::test(start_paused = true)]
async fn time_queued_after_a_wake_is_not_the_plugins() {
    let naps = async {
        for _ in 0..4 {
            tokio::time::sleep(MS * 10).await;
        }
    };
    /// Wakes the task 30 ms after it is woken: its thread was busy.
    struct Late(Waker);
    impl Wake for Late {
        fn wake(self: Arc<Self>) {
            let waker = self.0.clone();
            tokio::spawn(async move {
                tokio::time::sleep(MS * 30).await;
                waker.wake();
            });
        }
    }
    let mut tally = Tally::new(limit(45, 1000));
    let r = {
        let mut call = std::pin::pin!(Bounded::new(naps, &mut tally));
        std::future::poll_fn(|cx| {
            let late = Waker::from(Arc::new(Late(cx.waker().clone())));
            call.as_mut().poll(&mut Context::from_waker(&late))
        })
        .await
    };
    // Four 10 ms naps: 40 ms of the plugin's own, under 45, though the call
    // took over twice that (how much depends on when the timer's early
    // wakes land).
    assert_eq!(r, Ok(()));
    let s = tally.spent(Instant::now());
    assert_eq!(s.waited, MS * 40, "{s:?}");
    assert!(s.total >= MS * 100, "{s:?}");
}

/// Yields, however many, leave the budget alone; the hard cap ends a call
/// that does nothing but yield while others hold the thread.
#[tokio::test(start_paused = true)]
async fn yields_do_not_count_and_the_hard_cap_holds() {
    // Another task holds the thread 1 ms (of paused time) between polls.
    let hog = tokio::spawn(async {
        loop {
            tokio::time::advance(MS).await;
            tokio::task::yield_now().await;
        }
    });
    let yielding = async {
        for _ in 0..100 {
            yield_now().await;
        }
    };
    let (r, tally) = bounded(yielding, limit(20, 1_000)).await;
    assert_eq!(r, Ok(()));
    let s = tally.spent(Instant::now());
    assert_eq!(s.waited, Duration::ZERO, "{s:?}");
    assert!(s.total >= MS * 50, "the hog held the thread: {s:?}");

    let endless = async {
        loop {
            yield_now().await;
        }
    };
    let started = Instant::now();
    let (r, _) = bounded(endless, limit(20, 80)).await;
    assert!(matches!(r, Err(Cut::OverCap(s)) if s.waited.is_zero()), "{r:?}");
    assert!(started.elapsed() >= MS * 80 && started.elapsed() < MS * 90, "{:?}", started.elapsed());
    hog.abort();
}

/// A future that wakes itself before going pending (wasmtime's fuel yield)
/// is a yield too.
#[tokio::test(start_paused = true)]
async fn a_self_wake_is_a_yield() {
    let mut left = 50;
    let self_waking = std::future::poll_fn(move |cx| {
        if left == 0 {
            return Poll::Ready(());
        }
        left -= 1;
        cx.waker().wake_by_ref();
        Poll::Pending
    });
    let hog = tokio::spawn(async {
        loop {
            tokio::time::advance(MS).await;
            tokio::task::yield_now().await;
        }
    });
    let (r, tally) = bounded(self_waking, limit(10, 1_000)).await;
    assert_eq!(r, Ok(()));
    assert_eq!(tally.spent(Instant::now()).waited, Duration::ZERO);
    hog.abort();
}

#[tokio::test]
async fn a_busy_future_is_cut_at_the_budget_however_often_it_yields() {
    let spin = async {
        loop {
            let t = crate::clock::machine_instant();
            while t.elapsed() < MS * 2 {}
            yield_now().await;
        }
    };
    let started = crate::clock::machine_instant();
    let (r, _): (Result<(), Cut>, _) = bounded(spin, limit(30, 120)).await;
    // On a machine busy enough that the thread gets under a quarter of a
    // CPU, the cap comes first.
    match r {
        Err(Cut::OverBudget(s)) => assert!(s.on_cpu >= MS * 30 && s.waited.is_zero(), "{s:?}"),
        Err(Cut::OverCap(s)) => assert!(s.total >= MS * 120, "{s:?}"),
        other => panic!("{other:?}"),
    }
    assert!(started.elapsed() < Duration::from_secs(1));
}

#[tokio::test]
async fn a_panic_is_caught_with_its_message() {
    let (r, _) = bounded(async { panic!("host bug {}", 42) }, limit(1000, 4000)).await;
    let r: Result<(), Cut> = r;
    assert_eq!(r, Err(Cut::Panicked("host bug 42".into())));
}

/// One budget across two futures (a build's instantiation and `configure`).
#[tokio::test(start_paused = true)]
async fn a_tally_carries_over_from_one_future_to_the_next() {
    let mut tally = Tally::new(limit(50, 200));
    assert_eq!(Bounded::new(tokio::time::sleep(MS * 30), &mut tally).await, Ok(()));
    let r = Bounded::new(tokio::time::sleep(MS * 30), &mut tally).await;
    assert!(matches!(r, Err(Cut::OverBudget(s)) if s.waited == MS * 50), "{r:?}");
}
