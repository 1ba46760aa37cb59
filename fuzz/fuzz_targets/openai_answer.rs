//! Fuzz target `openai_answer`: its body is `poolgate::fuzzing`'s, which the stable
//! corpus test runs over `fuzz/corpus/openai_answer/` too.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    (poolgate::fuzzing::target("openai_answer").expect("a target"))(data);
});
