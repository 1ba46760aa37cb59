//! Fuzz target `body_facts`: its body is `poolgate::fuzzing`'s, which the stable
//! corpus test runs over `fuzz/corpus/body_facts/` too.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    (poolgate::fuzzing::target("body_facts").expect("a target"))(data);
});
