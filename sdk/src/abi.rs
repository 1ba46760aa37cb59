//! The runtime the generated bindings (`bindings.rs`) call into, in place of
//! `wit_bindgen::rt`: running the module's constructors once, and the canonical
//! ABI's allocation entry point, `cabi_realloc`.

/// Runs the module's static constructors once, before the first export runs.
///
/// wasm-ld synthesizes `__wasm_call_ctors`, which runs every constructor the
/// linked code registered (Rust's std on WASI registers some). Left alone, the
/// linker decides when that happens, and for some module kinds it wraps every
/// export in a call to it, rerunning them per call. Referring to it here takes
/// that over: the bindings call this at the top of every component export (not
/// from `cabi_realloc`, which runs before them), and only the first call runs
/// the constructors. An instance is single-threaded, so a plain flag suffices.
#[cfg(target_arch = "wasm32")]
pub fn run_ctors_once() {
    use std::sync::atomic::{AtomicBool, Ordering};

    unsafe extern "C" {
        fn __wasm_call_ctors();
    }
    static RAN: AtomicBool = AtomicBool::new(false);
    if !RAN.swap(true, Ordering::Relaxed) {
        // SAFETY: the linker-provided constructor entry point, called once.
        unsafe { __wasm_call_ctors() }
    }
}

/// Keeps [`cabi_realloc`] in the linked module. The generated code calls this
/// from a function the bindings keep alive, so the reference below is never
/// dropped, and with it neither is the export the host allocates through.
pub fn maybe_link_cabi_realloc() {
    std::hint::black_box(cabi_realloc as unsafe extern "C" fn(*mut u8, usize, usize, usize) -> *mut u8);
}

/// The canonical ABI's `realloc`: the host calls it to place arguments (strings,
/// lists) in the instance's memory.
///
/// `(old_ptr, old_len, align, new_len)`: with `old_len == 0` it allocates
/// `new_len` bytes aligned to `align`; otherwise it resizes the block at
/// `old_ptr` (allocated by this function with the same `align`) to `new_len`
/// bytes, keeping its first `min(old_len, new_len)` bytes. It never returns null:
/// a request that cannot be met traps, as the component model requires. A
/// zero-sized block is the non-null, aligned address `align` and owns no memory.
///
/// # Safety
///
/// `align` is a power of two; a non-zero `old_len` comes with the `old_ptr` and
/// `align` of an earlier call that returned it.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cabi_realloc(old_ptr: *mut u8, old_len: usize, align: usize, new_len: usize) -> *mut u8 {
    use std::alloc::{Layout, alloc, dealloc, handle_alloc_error, realloc};

    let Ok(layout) = Layout::from_size_align(new_len, align) else {
        // Not a power-of-two alignment, or a size that overflows with it.
        std::process::abort();
    };
    let dangling = align as *mut u8;
    let ptr = if old_len == 0 {
        if new_len == 0 {
            return dangling;
        }
        // SAFETY: `layout` has a non-zero size.
        unsafe { alloc(layout) }
    } else {
        // SAFETY: per the contract, `old_ptr` was allocated here with this layout.
        let old = unsafe { Layout::from_size_align_unchecked(old_len, align) };
        if new_len == 0 {
            // SAFETY: as above.
            unsafe { dealloc(old_ptr, old) };
            return dangling;
        }
        // SAFETY: as above, and `new_len` is non-zero and fits `layout`.
        unsafe { realloc(old_ptr, old, new_len) }
    };
    if ptr.is_null() {
        handle_alloc_error(layout);
    }
    ptr
}
