//! Fuzz target `openai_request`: its body is `poolgate::fuzzing`'s, which the stable
//! corpus test runs over `fuzz/corpus/openai_request/` too.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    (poolgate::fuzzing::target("openai_request").expect("a target"))(data);
});
