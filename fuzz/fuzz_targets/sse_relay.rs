//! Fuzz target `sse_relay`: its body is `poolgate::fuzzing`'s, which the stable
//! corpus test runs over `fuzz/corpus/sse_relay/` too.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    (poolgate::fuzzing::target("sse_relay").expect("a target"))(data);
});
