//! Fuzz target `quota_headers`: its body is `poolgate::fuzzing`'s, which the stable
//! corpus test runs over `fuzz/corpus/quota_headers/` too.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    (poolgate::fuzzing::target("quota_headers").expect("a target"))(data);
});
