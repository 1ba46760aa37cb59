//! Fuzz target `openai_stream`: its body is `poolgate::fuzzing`'s, which the stable
//! corpus test runs over `fuzz/corpus/openai_stream/` too.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    (poolgate::fuzzing::target("openai_stream").expect("a target"))(data);
});
