//! Bulk lowering of the per-request lists into a guest.
//!
//! wasmtime 48 lowers a record field by field, and every field store looks up the
//! guest's memory afresh (~15 ns). An account and its windows are ~30 fields, so
//! handing 16 accounts to each of 3 stages cost more than the whole chain budget.
//! Here the two hot list types — `list<account>` and `list<quota-window>` — are
//! written with one memory lookup per list, straight into canonical-ABI bytes.
//!
//! Everything else is delegated to the types `bindgen!` generated: type checking
//! (so a layout change in the WIT fails loudly at instantiation, not silently),
//! flat lowering, and single-value stores. The byte offsets are derived from
//! wasmtime's own ABI information for each field type, and a unit test checks
//! them against the record sizes wasmtime computes; `tests/lowering.rs` checks
//! the bytes end to end through a guest that echoes what it received.

use std::mem::MaybeUninit;
use std::sync::LazyLock;

use wasmtime::component::__internal::{CanonicalAbiInfo, InstanceType, InterfaceType, LowerContext};
use wasmtime::component::{ComponentType, Lower};

use super::bindings::{Account, Cooldown, CooldownReason, Freshness, QuotaWindow, WindowKind, WindowStatus};

/// An [`Account`] that lowers in bulk when it is an element of a list.
#[repr(transparent)]
pub struct FastAccount(pub Account);

/// A [`QuotaWindow`] that lowers in bulk when it is an element of a list.
#[repr(transparent)]
pub struct FastWindow(pub QuotaWindow);

/// Views accounts as [`FastAccount`]s without copying.
pub fn fast_accounts(accounts: &[Account]) -> &[FastAccount] {
    // SAFETY: `FastAccount` is `repr(transparent)` over `Account`.
    unsafe { std::slice::from_raw_parts(accounts.as_ptr().cast(), accounts.len()) }
}

/// Views windows as [`FastWindow`]s without copying.
pub fn fast_windows(windows: &[QuotaWindow]) -> &[FastWindow] {
    // SAFETY: `FastWindow` is `repr(transparent)` over `QuotaWindow`.
    unsafe { std::slice::from_raw_parts(windows.as_ptr().cast(), windows.len()) }
}

/// Field offsets inside one canonical-ABI record, computed the way wasmtime lays
/// records out.
struct Fields {
    offsets: Vec<usize>,
    size: usize,
}

fn fields(abis: &[CanonicalAbiInfo]) -> Fields {
    let mut offset = 0usize;
    let offsets = abis.iter().map(|a| a.next_field32_size(&mut offset)).collect();
    let align = abis.iter().map(|a| a.align32 as usize).max().unwrap_or(1);
    Fields { offsets, size: offset.next_multiple_of(align) }
}

/// Where an `option<T>`'s payload sits after its one-byte discriminant.
fn payload<T: ComponentType>() -> usize {
    (T::ALIGN32 as usize).max(1)
}

struct AccountLayout {
    id: usize,
    primary: usize,
    usable: usize,
    cooldown: usize,
    cooldown_payload: usize,
    cooldown_until: usize,
    cooldown_reason: usize,
    in_flight: usize,
    max_in_flight: usize,
    max_in_flight_payload: usize,
    status: usize,
    resets_at: usize,
    resets_at_payload: usize,
    freshness: usize,
    size: usize,
}

struct WindowLayout {
    account: usize,
    kind: usize,
    name: usize,
    utilization: usize,
    resets_at: usize,
    resets_at_payload: usize,
    status: usize,
    observed_at: usize,
    size: usize,
}

static ACCOUNT: LazyLock<AccountLayout> = LazyLock::new(|| {
    let f = fields(&[
        u32::ABI,
        bool::ABI,
        bool::ABI,
        <Option<Cooldown>>::ABI,
        u32::ABI,
        <Option<u32>>::ABI,
        WindowStatus::ABI,
        <Option<u64>>::ABI,
        Freshness::ABI,
    ]);
    let c = fields(&[u64::ABI, CooldownReason::ABI]);
    let layout = AccountLayout {
        id: f.offsets[0],
        primary: f.offsets[1],
        usable: f.offsets[2],
        cooldown: f.offsets[3],
        cooldown_payload: f.offsets[3] + payload::<Cooldown>(),
        cooldown_until: c.offsets[0],
        cooldown_reason: c.offsets[1],
        in_flight: f.offsets[4],
        max_in_flight: f.offsets[5],
        max_in_flight_payload: f.offsets[5] + payload::<u32>(),
        status: f.offsets[6],
        resets_at: f.offsets[7],
        resets_at_payload: f.offsets[7] + payload::<u64>(),
        freshness: f.offsets[8],
        size: f.size,
    };
    assert_eq!(c.size, Cooldown::SIZE32, "cooldown layout");
    assert_eq!(layout.size, Account::SIZE32, "account layout");
    layout
});

static WINDOW: LazyLock<WindowLayout> = LazyLock::new(|| {
    let f = fields(&[u32::ABI, WindowKind::ABI, u32::ABI, f64::ABI, <Option<u64>>::ABI, WindowStatus::ABI, u64::ABI]);
    let layout = WindowLayout {
        account: f.offsets[0],
        kind: f.offsets[1],
        name: f.offsets[2],
        utilization: f.offsets[3],
        resets_at: f.offsets[4],
        resets_at_payload: f.offsets[4] + payload::<u64>(),
        status: f.offsets[5],
        observed_at: f.offsets[6],
        size: f.size,
    };
    assert_eq!(layout.size, QuotaWindow::SIZE32, "quota-window layout");
    layout
});

fn put<const N: usize>(dst: &mut [u8], at: usize, bytes: [u8; N]) {
    dst[at..at + N].copy_from_slice(&bytes);
}

// Enum discriminants are the case's position in the WIT declaration; the
// exhaustive matches make a WIT change a compile error here.
fn status_tag(s: WindowStatus) -> u8 {
    match s {
        WindowStatus::Allowed => 0,
        WindowStatus::AllowedWarning => 1,
        WindowStatus::Rejected => 2,
        WindowStatus::Unknown => 3,
    }
}

fn freshness_tag(f: Freshness) -> u8 {
    match f {
        Freshness::Fresh => 0,
        Freshness::Stale => 1,
        Freshness::Unknown => 2,
    }
}

fn kind_tag(k: WindowKind) -> u8 {
    match k {
        WindowKind::FiveHour => 0,
        WindowKind::SevenDay => 1,
        WindowKind::SevenDayModel => 2,
        WindowKind::Overage => 3,
        WindowKind::Requests => 4,
        WindowKind::Tokens => 5,
        WindowKind::Other => 6,
    }
}

fn reason_tag(r: CooldownReason) -> u8 {
    match r {
        CooldownReason::WeeklyExhausted => 0,
        CooldownReason::SessionExhausted => 1,
        CooldownReason::ModelExhausted => 2,
        CooldownReason::UnifiedRejected => 3,
        CooldownReason::Transient => 4,
        CooldownReason::Overloaded => 5,
        CooldownReason::UpstreamError => 6,
        CooldownReason::Auth => 7,
        CooldownReason::Disabled => 8,
    }
}

fn encode_account(a: &Account, dst: &mut [u8]) {
    let l = &*ACCOUNT;
    dst.fill(0);
    put(dst, l.id, a.id.to_le_bytes());
    dst[l.primary] = a.primary as u8;
    dst[l.usable] = a.usable as u8;
    if let Some(c) = a.cooldown {
        dst[l.cooldown] = 1;
        put(dst, l.cooldown_payload + l.cooldown_until, c.until_ms.to_le_bytes());
        dst[l.cooldown_payload + l.cooldown_reason] = reason_tag(c.reason);
    }
    put(dst, l.in_flight, a.in_flight.to_le_bytes());
    if let Some(m) = a.max_in_flight {
        dst[l.max_in_flight] = 1;
        put(dst, l.max_in_flight_payload, m.to_le_bytes());
    }
    dst[l.status] = status_tag(a.status);
    if let Some(r) = a.resets_at_ms {
        dst[l.resets_at] = 1;
        put(dst, l.resets_at_payload, r.to_le_bytes());
    }
    dst[l.freshness] = freshness_tag(a.quota_freshness);
}

fn encode_window(w: &QuotaWindow, dst: &mut [u8]) {
    let l = &*WINDOW;
    dst.fill(0);
    put(dst, l.account, w.account.to_le_bytes());
    dst[l.kind] = kind_tag(w.kind);
    put(dst, l.name, w.name.to_le_bytes());
    put(dst, l.utilization, w.utilization.to_le_bytes());
    if let Some(r) = w.resets_at_ms {
        dst[l.resets_at] = 1;
        put(dst, l.resets_at_payload, r.to_le_bytes());
    }
    dst[l.status] = status_tag(w.status);
    put(dst, l.observed_at, w.observed_at_ms.to_le_bytes());
}

macro_rules! bulk_lower {
    ($fast:ident, $inner:ty, $encode:ident) => {
        // SAFETY: every property is delegated to the bindgen-generated type, whose
        // `typecheck` guarantees the component's view matches the layout that
        // `$encode` writes (checked against `SIZE32` when the layout is built).
        unsafe impl ComponentType for $fast {
            type Lower = <$inner as ComponentType>::Lower;
            const ABI: CanonicalAbiInfo = <$inner as ComponentType>::ABI;

            fn typecheck(ty: &InterfaceType, types: &InstanceType<'_>) -> wasmtime::Result<()> {
                <$inner as ComponentType>::typecheck(ty, types)
            }
        }

        // SAFETY: as above; the bulk path writes exactly `SIZE32` bytes per item
        // inside the range the list lowering allocated and bounds-checked.
        unsafe impl Lower for $fast {
            fn linear_lower_to_flat<T>(
                &self,
                cx: &mut LowerContext<'_, T>,
                ty: InterfaceType,
                dst: &mut MaybeUninit<Self::Lower>,
            ) -> wasmtime::Result<()> {
                self.0.linear_lower_to_flat(cx, ty, dst)
            }

            fn linear_lower_to_memory<T>(
                &self,
                cx: &mut LowerContext<'_, T>,
                ty: InterfaceType,
                offset: usize,
            ) -> wasmtime::Result<()> {
                self.0.linear_lower_to_memory(cx, ty, offset)
            }

            fn linear_store_list_to_memory<T>(
                cx: &mut LowerContext<'_, T>,
                _ty: InterfaceType,
                offset: usize,
                items: &[Self],
            ) -> wasmtime::Result<()> {
                let size = <Self as ComponentType>::SIZE32;
                let memory = cx.as_slice_mut();
                let dst = &mut memory[offset..][..items.len() * size];
                for (item, chunk) in items.iter().zip(dst.chunks_exact_mut(size)) {
                    $encode(&item.0, chunk);
                }
                Ok(())
            }
        }
    };
}

bulk_lower!(FastAccount, Account, encode_account);
bulk_lower!(FastWindow, QuotaWindow, encode_window);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_match_wasmtimes_record_sizes() {
        // Building the layouts asserts their sizes against wasmtime's.
        assert_eq!(ACCOUNT.size, Account::SIZE32);
        assert_eq!(WINDOW.size, QuotaWindow::SIZE32);
        // The offsets the canonical ABI gives these records (WIT field order).
        assert_eq!((ACCOUNT.cooldown, ACCOUNT.cooldown_payload, ACCOUNT.in_flight), (8, 16, 32));
        assert_eq!((ACCOUNT.resets_at, ACCOUNT.resets_at_payload, ACCOUNT.freshness), (48, 56, 64));
        assert_eq!((WINDOW.utilization, WINDOW.resets_at, WINDOW.observed_at), (16, 24, 48));
    }
}
