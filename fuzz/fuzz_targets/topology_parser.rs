//! Fuzz the topology parser: any text must give a topology or a typed error, never a panic;
//! a topology that parses must build (at a bounded node count), route every sampled pair
//! along links that exist, and resolve its own link names.
#![no_main]

use libfuzzer_sys::fuzz_target;
use skewsim::cluster::TopologySpec;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(spec) = TopologySpec::parse(text, "fuzz.toml") else {
        return;
    };
    // Keep each run small; the node count still has to satisfy the super-node divisor.
    let domain = spec.domain_nodes().max(1);
    let nodes = (spec.nodes.min(64) / domain).max(1) * domain;
    let Ok(topo) = spec.build(Some(nodes)) else {
        return;
    };
    let gpus = topo.gpus();
    for k in 0..64u32 {
        let src = k.wrapping_mul(2_654_435_761) % gpus;
        let dst = k.wrapping_mul(40_503) % gpus;
        let route = topo.route(src, dst, u64::from(k)).expect("in-range GPUs must route");
        let mut at = src;
        for &l in route.links() {
            let link = &topo.links[l as usize];
            assert_eq!(link.src, at);
            at = link.dst;
        }
        assert_eq!(at, dst);
    }
    for l in (0..topo.links.len() as u32).step_by(97) {
        assert_eq!(topo.link_by_name(&topo.link_name(l)), Some(l));
    }
});
