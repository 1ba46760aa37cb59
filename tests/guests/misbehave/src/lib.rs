//! A plugin that misbehaves on purpose, for the runtime's fault tests.
//!
//! Config: `{ "fault": "<mode>", "on_model": "<model>" }`. The fault fires only for
//! requests whose model equals `on_model` (every request when it is absent); other
//! requests are answered by reversing the input order, reason "reversed".
//!
//! Beyond `rank`: `observe` (`trap`, `loop`, `sleep`) misbehaves in `observe`;
//! `configure` (`spin`, `sleep`, `spin-after-first`, `sleep-after-first`,
//! `trap-after-first`, `reload-nap`) misbehaves while an instance is configured — "after first"
//! meaning every instance but the first one the process ever configured (told
//! apart through plugin state); `ms` is how long a sleep or spin lasts and
//! `bytes` how big a flood or a reason is.
//!
//! Single huge host calls (one call, no loop — what epoch interruption cannot
//! cut): `random-bytes` / `insecure-random-bytes` ask WASI for `bytes` random
//! bytes at once, `stdout-write` hands `bytes` bytes to one `output-stream.write`
//! (ignoring `check-write`, as a hostile guest would), and `state-evict` fills its
//! scope with `entries` tiny entries, `per_call` a call, then lowers its
//! `state-limit` to 1 in one call (reason `evicted`) and starts over.
//!
//! `state-tiny` writes `per_call` fresh tiny entries a call (a key of about eight
//! bytes, a 1-byte value), so that a scope fills with as many entries
//! as its bytes allow: reason `tiny-full` once the first key it wrote has been
//! evicted (the scope met a bound), `tiny-filling` before.
//!
//! `state-clobber` empties its state scope on every call. `err-forge`,
//! `trap-forge` and `detail-forge` carry line breaks and a bidirectional
//! override in their `Err` text, their panic message and stderr, and the
//! detail of a good answer.
//!
//! Pool modes (issue #22): `configure = "pool-nap-after-first"` naps 100 ms
//! at a time forever in every configure but the first (a build that never
//! ends, waiting in small pieces); `fault = "pool-fill"` grows its memory by
//! `bytes` and fills it with one bulk-memory instruction (`memory.fill`), which
//! no epoch tick interrupts.
//!
//! `slow_model`: requests for that model sleep `ms` and then succeed (a slow but
//! healthy plugin); `reason`: the `reason` mode answers with that reason.
//!
//! `budget-nap` (as `fault`, `observe` or `configure`, and `configure =
//! "budget-nap-after-first"`): a loop of short sleeps of `ms` each that never
//! ends on its own — a retry loop with a short sleep — each sleep shorter than
//! any single-wait bound, so only a budget that sums the waits cuts it.

// A WebAssembly component only: on a native target (`cargo build --workspace`)
// the crate is empty, since its exports' names are not native symbol names.
#![cfg(target_arch = "wasm32")]

use poolgate_sdk::prelude::*;

/// WASI functions the SDK does not wrap, imported by hand (Rust's std links the
/// WASI world they belong to).
mod raw {
    #[link(wasm_import_module = "wasi:random/random@0.2.6")]
    unsafe extern "C" {
        #[link_name = "get-random-bytes"]
        pub fn get_random_bytes(len: i64, ret: *mut usize);
    }
    #[link(wasm_import_module = "wasi:random/insecure@0.2.6")]
    unsafe extern "C" {
        #[link_name = "get-insecure-random-bytes"]
        pub fn get_insecure_random_bytes(len: i64, ret: *mut usize);
    }
    #[link(wasm_import_module = "wasi:cli/stdout@0.2.6")]
    unsafe extern "C" {
        #[link_name = "get-stdout"]
        pub fn get_stdout() -> i32;
    }
    #[link(wasm_import_module = "wasi:io/streams@0.2.6")]
    unsafe extern "C" {
        #[link_name = "[method]output-stream.write"]
        pub fn output_stream_write(stream: i32, ptr: *const u8, len: usize, ret: *mut u8);
        #[link_name = "[resource-drop]output-stream"]
        pub fn output_stream_drop(stream: i32);
    }

    /// One `get-random-bytes` (or `get-insecure-random-bytes`) call; the length
    /// of what came back.
    pub fn random_bytes(len: u64, insecure: bool) -> usize {
        let mut ret = [0usize; 2];
        // SAFETY: the canonical ABI of `func(len: u64) -> list<u8>`: the list
        // (allocated with the guest's `cabi_realloc`) is written at `ret`.
        unsafe {
            if insecure {
                get_insecure_random_bytes(len as i64, ret.as_mut_ptr());
            } else {
                get_random_bytes(len as i64, ret.as_mut_ptr());
            }
            drop(Vec::from_raw_parts(ret[0] as *mut u8, ret[1], ret[1]));
        }
        ret[1]
    }

    /// One `output-stream.write` of `bytes` to stdout, whatever `check-write` says.
    pub fn write_stdout(bytes: &[u8]) {
        let mut ret = [0u32; 4];
        // SAFETY: `func(self: borrow<output-stream>, contents: list<u8>) ->
        // result<_, stream-error>`; the result lands in `ret`.
        unsafe {
            let out = get_stdout();
            output_stream_write(out, bytes.as_ptr(), bytes.len(), ret.as_mut_ptr().cast());
            output_stream_drop(out);
        }
    }
}

struct Misbehave {
    fault: String,
    on_model: Option<String>,
    addr: String,
    observe: String,
    ms: u64,
    bytes: usize,
    calls: u64,
    /// Misbehave only on every `every`-th call (1: always), so that a plugin
    /// that works half the time can be had.
    every: u64,
    /// Requests for this model sleep `ms`, then succeed.
    slow_model: Option<String>,
    /// The `reason` mode's reason.
    reason: String,
    /// Entries the `state-evict` mode fills its scope with.
    entries: u64,
    /// Entries written so far, and per call (`state-evict`).
    written: u64,
    per_call: u64,
    /// The big buffer of `stdout-write`, made once.
    big: Vec<u8>,
}

/// Text that would forge a log line of the gateway's, or reorder one, if it
/// reached the log as it is: a carriage return, a line and a paragraph
/// separator, NEL, a vertical tab and a right-to-left override.
const FORGED: &str = "innocent\r2026-12-01T00:00:00.000000Z ERROR poolgate::gateway: FORGED via CR\u{2028}LS\u{2029}PS\u{85}NEL\u{b}VT\u{202e}RTL";

/// A loop of host calls that never ends on its own: host calls burn no fuel,
/// so only the host's wall-clock bound can stop it.
fn host_call_loop(kind: &str, bytes: usize) -> ! {
    let big = "k".repeat(bytes);
    loop {
        match kind {
            "log" => log::info(&big),
            "state-get" => {
                std::hint::black_box(state::get(&big));
            }
            _ => state::set(&big, "v", None),
        }
    }
}

/// Burns CPU for `ms` of wall-clock time.
fn spin(ms: u64) {
    let until = std::time::Instant::now() + std::time::Duration::from_millis(ms);
    let mut x: u64 = 0;
    while std::time::Instant::now() < until {
        x = std::hint::black_box(x.wrapping_add(1));
    }
}

fn sleep(ms: u64) {
    std::thread::sleep(std::time::Duration::from_millis(ms));
}

/// Sleeps `ms` at a time, forever (see `budget-nap` in the crate docs).
fn budget_nap(ms: u64) -> ! {
    loop {
        sleep(ms);
    }
}

fn endless() -> ! {
    let mut x: u64 = 0;
    loop {
        x = std::hint::black_box(x.wrapping_add(1));
    }
}

/// Grows the memory by `bytes` and fills the new pages with one
/// `memory.fill` (bulk memory): a single instruction of `bytes` of work.
fn pool_fill(bytes: usize) -> Result<(), String> {
    #[cfg(target_arch = "wasm32")]
    {
        let pages = bytes.div_ceil(65536);
        let base = core::arch::wasm32::memory_grow(0, pages);
        if base == usize::MAX {
            return Err(format!("memory.grow of {pages} pages refused"));
        }
        // SAFETY: the pages were just grown and belong to no allocation. With
        // bulk memory (on by default for wasm32-wasip2) LLVM lowers this to
        // one `memory.fill`.
        unsafe { core::ptr::write_bytes((base * 65536) as *mut u8, 0x5a, bytes) };
        Ok(())
    }
    #[cfg(not(target_arch = "wasm32"))]
    {
        let _ = bytes;
        Err("wasm only".into())
    }
}

/// `configure = "reload-nap"`: holds `bytes` of memory (touched, so it is
/// really resident) and then sleeps `ms` at a time, forever — each piece
/// short enough for any per-wait timer, the whole never ending: what only a
/// bound on the whole load can stop, and what must be freed when it does.
fn nap_forever(ms: u64, bytes: usize) -> ! {
    let held: Vec<u8> = (0..bytes).map(|i| i as u8).collect();
    loop {
        std::hint::black_box(&held);
        sleep(ms);
    }
}

/// Whether an instance was configured before this one (in this process).
fn not_the_first() -> bool {
    let seen = state::get("configured-before").is_some();
    state::set("configured-before", "yes", None);
    seen
}

impl Misbehave {
    /// The `state-tiny` mode: `per_call` fresh tiny entries; whether the
    /// scope has evicted this instance's first one yet.
    fn state_tiny(&mut self, req_id: u64) -> &'static str {
        state::limit(1_000_000);
        // Short keys that differ between instances and calls: the request's
        // id (which two instances never share) and a counter.
        let tag = req_id;
        if self.written == 0 {
            // Distinct from every key that follows (they all have a dot).
            state::set("first", "v", None);
        }
        for _ in 0..self.per_call {
            self.written += 1;
            state::set(&format!("{tag:x}.{:x}", self.written), "v", None);
        }
        if state::get("first").is_none() { "tiny-full" } else { "tiny-filling" }
    }
}

impl Ranker for Misbehave {
    fn configure(config: Config, _pool: &Pool) -> Result<Self, String> {
        let mut o = config.options();
        let fault = o.required("fault", Options::string)?;
        let on_model = o.string("on_model")?;
        // Where the `socket` fault tries to connect.
        let addr = o.string("addr")?.unwrap_or_else(|| "127.0.0.1:9".into());
        let observe = o.string("observe")?.unwrap_or_else(|| "none".into());
        let configure = o.string("configure")?;
        let ms = o.u64("ms")?.unwrap_or(10_000);
        let bytes = o.usize("bytes")?.unwrap_or(64 * 1024);
        let every = o.u64("every")?.unwrap_or(1).max(1);
        let slow_model = o.string("slow_model")?;
        let reason = o.string("reason")?.unwrap_or_default();
        let entries = o.u64("entries")?.unwrap_or(100_000);
        let per_call = o.u64("per_call")?.unwrap_or(1000).max(1);
        o.done()?;
        if fault == "configure" {
            return Err("option `fault`: refusing to configure, as asked".into());
        }
        match configure.as_deref() {
            None => {}
            Some("spin") => spin(ms),
            Some("sleep") => sleep(ms),
            Some("spin-after-first") if not_the_first() => spin(ms),
            Some("sleep-after-first") if not_the_first() => sleep(ms),
            Some("trap-after-first") if not_the_first() => panic!("misbehave: configure fails after the first"),
            Some("log-loop-after-first") if not_the_first() => host_call_loop("log", bytes),
            Some("pool-nap-after-first") if not_the_first() => loop {
                sleep(100);
            },
            Some("budget-nap") => budget_nap(ms),
            Some("budget-nap-after-first") if not_the_first() => budget_nap(ms),
            Some(
                "spin-after-first"
                | "sleep-after-first"
                | "trap-after-first"
                | "log-loop-after-first"
                | "pool-nap-after-first"
                | "budget-nap-after-first",
            ) => {}
            Some("reload-nap") => nap_forever(ms, bytes),
            Some(other) => return Err(format!("option `configure`: unknown mode `{other}`")),
        }
        let big = if fault == "stdout-write" { vec![b'x'; bytes] } else { Vec::new() };
        Ok(Misbehave {
            fault,
            on_model,
            addr,
            observe,
            ms,
            bytes,
            calls: 0,
            every,
            slow_model,
            reason,
            entries,
            written: 0,
            per_call,
            big,
        })
    }

    fn rank(&mut self, req: &Request, c: &Candidates) -> Result<Ranking, String> {
        if self.slow_model.as_ref().is_some_and(|m| *m == req.model) {
            sleep(self.ms);
            return Ok(c.unchanged("slow"));
        }
        if self.on_model.as_ref().is_some_and(|m| *m != req.model) {
            let mut order = c.input_order();
            order.reverse();
            return Ok(Ranking::new(order, "reversed"));
        }
        let n = c.len() as u32;
        self.calls += 1;
        if !self.calls.is_multiple_of(self.every) {
            return Ok(c.unchanged("spared"));
        }
        match self.fault.as_str() {
            "log-loop" => host_call_loop("log", self.bytes),
            "budget-nap" => budget_nap(self.ms),
            "state-get-loop" => host_call_loop("state-get", self.bytes),
            "state-set-loop" => host_call_loop("state-set", self.bytes),
            "err-lines" => Err("a\n".repeat(self.bytes / 2)),
            "err-forge" => Err(FORGED.into()),
            "detail-forge" => Ok(c.unchanged("forged-detail").with_detail(FORGED)),
            "trap-forge" => {
                eprintln!("{FORGED}");
                panic!("misbehave: {FORGED}");
            }
            "forge-log" => {
                log::warn("innocent\n2026-12-01T00:00:00.000000Z ERROR poolgate::gateway: FORGED by a plugin");
                Ok(c.unchanged("forged"))
            }
            "sleep" => {
                sleep(self.ms);
                Ok(c.unchanged("slept"))
            }
            "spin" => {
                spin(self.ms);
                Ok(c.unchanged("spun"))
            }
            "exit" => std::process::exit(3),
            "pool-fill" => pool_fill(self.bytes).map(|()| c.unchanged("filled")),
            "print-flood" => {
                let line = "x".repeat(1023);
                for _ in 0..(self.bytes / 1024).max(1) {
                    println!("{line}");
                    eprintln!("{line}");
                }
                Ok(c.unchanged("flooded-stdio"))
            }
            "log-flood" => {
                for i in 0..(self.bytes / 64).max(1) {
                    log::warn(&format!("misbehave log line {i}"));
                }
                Ok(c.unchanged("flooded-log"))
            }
            "state-flood" => {
                // Fresh keys every call, values as large as allowed.
                state::limit(1_000_000);
                let value = "v".repeat(self.bytes.min(64 * 1024));
                for i in 0..16 {
                    state::set(&format!("flood-{}-{}-{i}", req.id, self.calls), &value, None);
                }
                Ok(c.unchanged("flooded-state"))
            }
            "huge-reason" => Ok(c.unchanged(&"r".repeat(self.bytes))),
            "reason" => Ok(c.unchanged(&self.reason)),
            "random-bytes" => Ok(c.unchanged(&format!("random:{}", raw::random_bytes(self.bytes as u64, false)))),
            "insecure-random-bytes" => {
                Ok(c.unchanged(&format!("random:{}", raw::random_bytes(self.bytes as u64, true))))
            }
            "stdout-write" => {
                raw::write_stdout(&self.big);
                Ok(c.unchanged("wrote"))
            }
            "state-clobber" => {
                // Empties its scope (one entry left), then passes the reason on:
                // harmless to itself, and to every other plugin whose scope is
                // its own.
                state::limit(1);
                state::set("clobbered", "1", None);
                state::limit(1_000_000);
                Ok(c.unchanged(""))
            }
            "state-evict" => {
                if self.written >= self.entries {
                    state::limit(1);
                    state::limit(1_000_000);
                    self.written = 0;
                    return Ok(c.unchanged("evicted"));
                }
                state::limit(1_000_000);
                for _ in 0..self.per_call {
                    self.written += 1;
                    state::set(&format!("{}-{}", req.id, self.written), "", None);
                }
                Ok(c.unchanged("filled"))
            }
            "state-tiny" => Ok(c.unchanged(self.state_tiny(req.id))),
            "header-reason" => Ok(c.unchanged("evil\r\nx-injected: 1")),
            "huge-detail" => Ok(c.unchanged("huge-detail").with_detail("d".repeat(self.bytes))),
            "none" => Ok(c.unchanged("none")),
            "pass" => Ok(c.unchanged("")),
            // What the host says a fresh reading is (`host.freshness-ms`).
            "freshness" => Ok(c.unchanged(&format!("freshness-{}", c.pool().freshness_ms()))),
            "report-decided-by" => Ok(c.unchanged("").with_detail(format!("saw {:?}", req.decided_by))),
            "drop-first" => Ok(Ranking::new((1..n).collect(), "dropped-first")),
            "trap" => panic!("misbehave: deliberate panic"),
            "loop" => endless(),
            "oom" => {
                let mut hoard: Vec<Vec<u8>> = Vec::new();
                loop {
                    // Reserve without touching every page: the cap, not the
                    // deadline, must be what stops this.
                    let mut chunk = Vec::<u8>::with_capacity(4 << 20);
                    chunk.push(1);
                    hoard.push(chunk);
                    std::hint::black_box(&hoard);
                }
            }
            "duplicate" => Ok(Ranking::new(vec![0, 0], "dup")),
            "unknown" => Ok(Ranking::new(vec![0, n + 7], "unknown")),
            "empty" => Ok(Ranking::new(vec![], "empty")),
            "oversize" => Ok(Ranking::new((0..n * 4).collect(), "oversize")),
            "drop-all-but-last" => Ok(Ranking::new(vec![n - 1], "kept-last")),
            "error" => Err("misbehave: deliberate error".into()),
            "print" => {
                println!("misbehave says hello on stdout");
                eprintln!("misbehave says hello on stderr");
                Ok(c.unchanged("printed"))
            }
            "read-file" => match std::fs::read_to_string("/etc/hostname") {
                Ok(s) => Ok(Ranking::new(c.input_order(), format!("escaped:file:{}", s.trim()))),
                Err(e) => Err(format!("file read refused: {e}")),
            },
            "env" => {
                let vars: Vec<(String, String)> = std::env::vars().collect();
                match std::env::var("PATH") {
                    Ok(v) => Ok(Ranking::new(c.input_order(), format!("escaped:env:{v}"))),
                    Err(e) if vars.is_empty() => Err(format!("environment empty: {e}")),
                    Err(e) => Ok(Ranking::new(c.input_order(), format!("escaped:env:{} vars ({e})", vars.len()))),
                }
            }
            "socket" => match std::net::TcpStream::connect(self.addr.as_str()) {
                Ok(_) => Ok(Ranking::new(c.input_order(), "escaped:socket")),
                Err(e) => Err(format!("socket refused: {e}")),
            },
            "echo" => {
                // Everything received, in a canonical text the host test rebuilds
                // from its own side of the call.
                let mut out = String::new();
                for a in c.iter() {
                    out += &format!(
                        "A{} p{} u{} c{:?} f{} m{:?} s{:?} r{:?} q{:?};",
                        a.id,
                        a.primary as u8,
                        a.usable as u8,
                        a.cooldown.map(|x| (x.until_ms, x.reason as u8)),
                        a.in_flight,
                        a.max_in_flight,
                        a.status as u8,
                        a.resets_at_ms,
                        a.quota_freshness as u8
                    );
                    for w in a.windows {
                        out += &format!(
                            "W{} k{} n{} x{} r{:?} s{} o{};",
                            w.account,
                            w.kind as u8,
                            w.name,
                            w.utilization.to_bits(),
                            w.resets_at_ms,
                            w.status as u8,
                            w.observed_at_ms
                        );
                    }
                }
                Ok(c.unchanged("echo").with_detail(out))
            }
            "clock" => {
                // Wall-clock access is allowed (std needs it) but must not be
                // needed: rankers use `req.now_ms`.
                let _ = std::time::SystemTime::now();
                Ok(c.unchanged("clock"))
            }
            "state" => {
                let n: u64 = state::get("count").and_then(|v| v.parse().ok()).unwrap_or(0);
                state::set("count", &(n + 1).to_string(), None);
                Ok(c.unchanged(&format!("count:{}", n + 1)))
            }
            other => Err(format!("option `fault`: unknown mode `{other}`")),
        }
    }

    fn observe(&mut self, req: &Request, _account: &AccountInfo, _outcome: &Outcome) {
        if self.on_model.as_ref().is_some_and(|m| *m != req.model) {
            return;
        }
        match self.observe.as_str() {
            "trap" => panic!("misbehave: observe fails"),
            "loop" => endless(),
            "sleep" => sleep(self.ms),
            "budget-nap" => budget_nap(self.ms),
            _ => {}
        }
    }
}

poolgate_sdk::export_ranker!(Misbehave);
