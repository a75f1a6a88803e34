//! Fuzz the corpus trace parser and the corpus spec parser: any bytes must give lengths or
//! a typed error, never a panic; parsed lengths are all ≥ 1; a corpus built from a parsed
//! trace must pack into sequences that hold every token exactly once.
#![no_main]

use libfuzzer_sys::fuzz_target;
use skewsim::workload::corpus::{parse_trace, Corpus};
use skewsim::workload::pack::{Packer, Packing};

fuzz_target!(|data: &[u8]| {
    if let Ok(spec) = std::str::from_utf8(data) {
        let _ = Corpus::from_spec(spec);
    }
    let Ok(lengths) = parse_trace("fuzz", data) else {
        return;
    };
    assert!(!lengths.is_empty() && lengths.iter().all(|&l| l >= 1));
    let docs = lengths.iter().copied().take(64);
    let total: u64 = docs.clone().map(u64::from).sum();
    for packing in [Packing::Sequential, Packing::BestFit { window: 4 }] {
        let packed: u64 = Packer::new(docs.clone(), 4096, packing)
            .expect("valid packer")
            .map(|s| {
                assert!(s.tokens() <= 4096);
                s.tokens()
            })
            .sum();
        assert_eq!(packed, total);
    }
});
