//! Fuzz target `credentials`: its body is `poolgate::fuzzing`'s, which the stable
//! corpus test runs over `fuzz/corpus/credentials/` too.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    (poolgate::fuzzing::target("credentials").expect("a target"))(data);
});
