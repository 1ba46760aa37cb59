//! Fuzz target `replica_merge`: its body is `poolgate::fuzzing`'s, which the stable
//! corpus test runs over `fuzz/corpus/replica_merge/` too.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    (poolgate::fuzzing::target("replica_merge").expect("a target"))(data);
});
