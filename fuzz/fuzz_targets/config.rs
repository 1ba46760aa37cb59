//! Fuzz target `config`: its body is `poolgate::fuzzing`'s, which the stable
//! corpus test runs over `fuzz/corpus/config/` too.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    (poolgate::fuzzing::target("config").expect("a target"))(data);
});
