//! Fuzz target `decision`: its body is `poolgate::fuzzing`'s, which the stable
//! corpus test runs over `fuzz/corpus/decision/` too.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    (poolgate::fuzzing::target("decision").expect("a target"))(data);
});
