//! Hostile components no Rust guest can be, written with wasm-encoder and
//! wrapped into components against `wit/policy.wit` with wit-component (what
//! `poolgate-witgen component` does for C plugins):
//!
//! - [`many_memories`]: a ranker whose core module owns many linear memories
//!   and, on every `rank`, grows each of them and writes the new pages (real
//!   memory, not reservations). A host that caps memory per linear memory lets
//!   it hold `memories × cap`; poolgate caps the instance as a whole.
//! - [`slow_to_compile`]: a ranker carrying thousands of functions it never
//!   calls, which take the compiler seconds.
//! - [`padded`]: any component grown by a custom section, for size limits.

use std::path::Path;

use wasm_encoder::{
    CodeSection, ConstExpr, DataSection, ExportKind, ExportSection, Function, FunctionSection, GlobalSection,
    GlobalType, MemArg, MemorySection, MemoryType, Module, TypeSection, ValType,
};

/// Where the canonical ABI's result records live in memory 0.
const RESULT: i32 = 16;
const CONFIGURE_RESULT: i32 = 64;
const ORDER: i32 = 128;
const REASON: i32 = 144;
const REASON_TEXT: &[u8] = b"many-memories";
/// Where the bump allocator starts, and the bytes it cycles through.
const HEAP: i32 = 1024;
const HEAP_END: i32 = 16 * 65536;

/// `memories` linear memories in one core instance (the first is the canonical
/// ABI's, 16 pages); every `rank` grows each of the others by `grow_pages` and
/// fills the new pages, trapping if a growth is refused.
pub fn many_memories(memories: u32, grow_pages: u32) -> Vec<u8> {
    wrap(core_module(memories, grow_pages, 0))
}

/// A well-behaved ranker (one memory) that also carries `dead` functions of
/// straight-line arithmetic nobody calls.
pub fn slow_to_compile(dead: u32) -> Vec<u8> {
    wrap(core_module(1, 0, dead))
}

/// `component` with a custom section of `extra` bytes appended (still valid).
pub fn padded(component: &[u8], extra: usize) -> Vec<u8> {
    let mut out = component.to_vec();
    let name = b"padding";
    let mut payload = vec![name.len() as u8];
    payload.extend_from_slice(name);
    payload.resize(payload.len() + extra, 0);
    out.push(0); // custom section id
    leb128(&mut out, payload.len() as u64);
    out.extend_from_slice(&payload);
    out
}

fn leb128(out: &mut Vec<u8>, mut v: u64) {
    loop {
        let byte = (v & 0x7f) as u8;
        v >>= 7;
        if v == 0 {
            out.push(byte);
            return;
        }
        out.push(byte | 0x80);
    }
}

fn wrap(mut module: Vec<u8>) -> Vec<u8> {
    let wit = Path::new(env!("CARGO_MANIFEST_DIR")).join("../wit");
    let mut resolve = wit_parser::Resolve::default();
    let (pkg, _) = resolve.push_dir(&wit).expect("wit/ parses");
    let world = resolve.select_world(&[pkg], Some("policy")).expect("the policy world");
    wit_component::embed_component_metadata(&mut module, &resolve, world, wit_component::StringEncoding::UTF8, false)
        .expect("metadata embeds");
    wit_component::ComponentEncoder::default()
        .validate(true)
        .module(&module)
        .expect("the core module is accepted")
        .encode()
        .expect("the component encodes")
}

fn mem(offset: u64, align: u32) -> MemArg {
    MemArg { offset, align, memory_index: 0 }
}

fn core_module(memories: u32, grow_pages: u32, dead: u32) -> Vec<u8> {
    let mut types = TypeSection::new();
    types.ty().function([ValType::I32; 4], [ValType::I32]); // 0: configure, cabi_realloc
    types.ty().function([ValType::I32], [ValType::I32]); // 1: rank, dead code
    types.ty().function([ValType::I32], []); // 2: observe
    let mut functions = FunctionSection::new();
    for ty in [0, 1, 2, 0] {
        functions.function(ty);
    }
    for _ in 0..dead {
        functions.function(1);
    }
    let mut mems = MemorySection::new();
    mems.memory(MemoryType { minimum: 16, maximum: None, memory64: false, shared: false, page_size_log2: None });
    for _ in 1..memories {
        mems.memory(MemoryType { minimum: 1, maximum: None, memory64: false, shared: false, page_size_log2: None });
    }
    let mut globals = GlobalSection::new();
    globals.global(GlobalType { val_type: ValType::I32, mutable: true, shared: false }, &ConstExpr::i32_const(HEAP));
    let mut exports = ExportSection::new();
    exports.export("memory", ExportKind::Memory, 0);
    // The version of the WIT `wrap` embeds (wit/), which is the host's.
    let v = poolgate::policy::engine::WIT_VERSION;
    exports.export(&format!("poolgate:policy/ranker@{v}#configure"), ExportKind::Func, 0);
    exports.export(&format!("poolgate:policy/ranker@{v}#rank"), ExportKind::Func, 1);
    exports.export(&format!("poolgate:policy/ranker@{v}#observe"), ExportKind::Func, 2);
    exports.export("cabi_realloc", ExportKind::Func, 3);

    let mut code = CodeSection::new();
    // configure: Ok(()).
    let mut f = Function::new([]);
    f.instructions().i32_const(CONFIGURE_RESULT).i32_const(0).i32_store8(mem(0, 0)).i32_const(CONFIGURE_RESULT).end();
    code.function(&f);
    // rank: grow and fill every other memory, then Ok({ order: [0], reason }).
    let mut f = Function::new([(1, ValType::I32)]);
    let mut ins = f.instructions();
    for m in 1..memories {
        // old = memory.grow m; if old == -1 { unreachable }
        ins.i32_const(grow_pages as i32).memory_grow(m).local_tee(1).i32_const(-1).i32_eq();
        ins.if_(wasm_encoder::BlockType::Empty).unreachable().end();
        // memory.fill m (old * 64 KiB, 1, pages * 64 KiB)
        ins.local_get(1).i32_const(16).i32_shl().i32_const(1).i32_const((grow_pages as i32) << 16).memory_fill(m);
    }
    ins.i32_const(RESULT).i32_const(0).i32_store8(mem(0, 0));
    ins.i32_const(RESULT).i32_const(ORDER).i32_store(mem(4, 2));
    ins.i32_const(RESULT).i32_const(1).i32_store(mem(8, 2));
    ins.i32_const(RESULT).i32_const(REASON).i32_store(mem(12, 2));
    ins.i32_const(RESULT).i32_const(REASON_TEXT.len() as i32).i32_store(mem(16, 2));
    ins.i32_const(RESULT).i32_const(0).i32_store8(mem(20, 0));
    ins.i32_const(RESULT).end();
    code.function(&f);
    // observe: nothing.
    let mut f = Function::new([]);
    f.instructions().end();
    code.function(&f);
    // cabi_realloc(old, old_size, align, size): a bump allocator that starts
    // over when it reaches the end (a call's arguments are dead by the next).
    let mut f = Function::new([(1, ValType::I32)]);
    let mut ins = f.instructions();
    // p = (heap + align - 1) & -align
    ins.global_get(0).local_get(2).i32_add().i32_const(1).i32_sub().i32_const(0).local_get(2).i32_sub().i32_and();
    ins.local_set(4);
    ins.local_get(4).local_get(3).i32_add().i32_const(HEAP_END).i32_gt_u();
    ins.if_(wasm_encoder::BlockType::Empty).i32_const(HEAP).local_set(4).end();
    ins.local_get(4).local_get(3).i32_add().global_set(0);
    ins.local_get(4).end();
    code.function(&f);
    // Dead code: a long dependent chain of arithmetic per function.
    for i in 0..dead {
        let mut f = Function::new([]);
        let mut ins = f.instructions();
        ins.local_get(0);
        for k in 0..200 {
            ins.i32_const((i * 7 + k) as i32).i32_add().i32_const(3).i32_mul().i32_const(k as i32 + 1).i32_xor();
        }
        ins.end();
        code.function(&f);
    }

    let mut data = DataSection::new();
    data.active(0, &ConstExpr::i32_const(ORDER), 0u32.to_le_bytes());
    data.active(0, &ConstExpr::i32_const(REASON), REASON_TEXT.iter().copied());

    let mut module = Module::new();
    module
        .section(&types)
        .section(&functions)
        .section(&mems)
        .section(&globals)
        .section(&exports)
        .section(&code)
        .section(&data);
    module.finish()
}
