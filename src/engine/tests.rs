use super::stub_net::StubNet;
use super::*;

fn lab(class: OpClass) -> OpLabel {
    OpLabel {
        class,
        mb: 0,
        layer: 0,
    }
}

/// 1 µs latency, 1 byte/ps = 1e12 B/s inside a node, half that across.
fn net() -> StubNet {
    StubNet::new(2, 1_000_000, 1e12, 0.5e12)
}

#[test]
fn one_stream_runs_in_issue_order_back_to_back() {
    let mut b = GraphBuilder::default();
    let s = b.add_stream(0, StreamKind::Compute);
    let ops: Vec<_> = [5, 7, 11]
        .iter()
        .map(|&d| b.add_op(s, OpKind::Compute(d), lab(OpClass::LinearFwd), &[]))
        .collect();
    let g = b.build().unwrap();
    let t = run(&g, &mut net()).unwrap();
    assert_eq!(t.start, vec![0, 5, 12]);
    assert_eq!(t.end, vec![5, 12, 23]);
    assert_eq!(t.makespan, 23);
    assert_eq!(t.events, 3);
    assert_eq!(ops, vec![0, 1, 2]);
}

#[test]
fn compute_and_communication_streams_overlap() {
    let mut b = GraphBuilder::default();
    let c = b.add_stream(0, StreamKind::Compute);
    let m = b.add_stream(0, StreamKind::PpComm);
    let a = b.add_op(c, OpKind::Compute(100), lab(OpClass::LinearFwd), &[]);
    let x = b.add_xfer(Xfer {
        src: 0,
        dst: 2,
        bytes: 1_000_000,
    }); // inter-node: 2e6 ps + 1e6 alpha
    let send = b.add_op(m, OpKind::Send(x), lab(OpClass::PpSendFwd), &[a]);
    let next = b.add_op(c, OpKind::Compute(5_000_000), lab(OpClass::LinearFwd), &[]);
    let after = b.add_op(c, OpKind::Compute(1), lab(OpClass::LinearFwd), &[send]);
    let g = b.build().unwrap();
    let t = run(&g, &mut net()).unwrap();
    assert_eq!(t.start[send as usize], 100);
    assert_eq!(t.end[send as usize], 100 + 3_000_000);
    // `next` runs while the send is in flight.
    assert_eq!(t.start[next as usize], 100);
    assert_eq!(t.end[next as usize], 5_000_100);
    assert_eq!(t.start[after as usize], 5_000_100);
}

#[test]
fn collective_starts_when_the_last_part_arrives() {
    let mut b = GraphBuilder::default();
    let c0 = b.add_stream(0, StreamKind::Compute);
    let m0 = b.add_stream(0, StreamKind::CpComm);
    let c1 = b.add_stream(1, StreamKind::Compute);
    let m1 = b.add_stream(1, StreamKind::CpComm);
    let w0 = b.add_op(c0, OpKind::Compute(10), lab(OpClass::AttnFwd), &[]);
    let w1 = b.add_op(c1, OpKind::Compute(400), lab(OpClass::AttnFwd), &[]);
    let coll = b.add_collective(&[
        Xfer {
            src: 0,
            dst: 1,
            bytes: 2_000_000,
        },
        Xfer {
            src: 1,
            dst: 0,
            bytes: 1_000_000,
        },
    ]);
    let p0 = b.add_op(m0, OpKind::Coll(coll), lab(OpClass::A2aOut), &[w0]);
    let p1 = b.add_op(m1, OpKind::Coll(coll), lab(OpClass::A2aOut), &[w1]);
    let g = b.build().unwrap();
    let t = run(&g, &mut net()).unwrap();
    assert_eq!(t.start[p0 as usize], 10, "GPU 0 arrives early and waits");
    assert_eq!(t.start[p1 as usize], 400);
    assert_eq!(t.coll_start[coll as usize], 400);
    // Slowest transfer: 1 µs + 2e6 bytes at 1 B/ps.
    let end = 400 + 1_000_000 + 2_000_000;
    assert_eq!((t.end[p0 as usize], t.end[p1 as usize]), (end, end));
    assert_eq!(t.makespan, end);
}

#[test]
fn late_dependency_edges_count() {
    let mut b = GraphBuilder::default();
    let s0 = b.add_stream(0, StreamKind::Compute);
    let s1 = b.add_stream(1, StreamKind::Compute);
    let a = b.add_op(s0, OpKind::Compute(10), lab(OpClass::LinearFwd), &[]);
    let c = b.add_op(s1, OpKind::Compute(5), lab(OpClass::LinearFwd), &[]);
    let d = b.add_op(s0, OpKind::Compute(1), lab(OpClass::LinearFwd), &[]);
    b.add_dep(c, a);
    let t = run(&b.build().unwrap(), &mut net()).unwrap();
    assert_eq!((t.start[a as usize], t.end[d as usize]), (5, 16));
}

#[test]
fn empty_collective_finishes_at_the_last_arrival() {
    let mut b = GraphBuilder::default();
    let s0 = b.add_stream(0, StreamKind::CpComm);
    let s1 = b.add_stream(1, StreamKind::Compute);
    let w = b.add_op(s1, OpKind::Compute(42), lab(OpClass::AttnFwd), &[]);
    let coll = b.add_collective(&[]);
    let p0 = b.add_op(s0, OpKind::Coll(coll), lab(OpClass::DpAllReduce), &[]);
    let p1 = b.add_op(s1, OpKind::Coll(coll), lab(OpClass::DpAllReduce), &[w]);
    let t = run(&b.build().unwrap(), &mut net()).unwrap();
    assert_eq!((t.end[p0 as usize], t.end[p1 as usize]), (42, 42));
}

#[test]
fn crossed_collectives_are_reported_as_a_deadlock() {
    let mut b = GraphBuilder::default();
    let s0 = b.add_stream(0, StreamKind::CpComm);
    let s1 = b.add_stream(1, StreamKind::CpComm);
    let a = b.add_collective(&[]);
    let c = b.add_collective(&[]);
    b.add_op(s0, OpKind::Coll(a), lab(OpClass::A2aIn), &[]);
    b.add_op(s0, OpKind::Coll(c), lab(OpClass::A2aIn), &[]);
    b.add_op(s1, OpKind::Coll(c), lab(OpClass::A2aIn), &[]);
    b.add_op(s1, OpKind::Coll(a), lab(OpClass::A2aIn), &[]);
    let e = run(&b.build().unwrap(), &mut net()).unwrap_err();
    assert!(
        matches!(
            e,
            crate::Error::Deadlock { gpu: 0 | 1, stream, class, .. }
                if stream == StreamKind::CpComm.name() && class == OpClass::A2aIn.name()
        ),
        "{e}"
    );
}

#[test]
fn dependencies_on_missing_ops_are_rejected() {
    let mut b = GraphBuilder::default();
    let s = b.add_stream(0, StreamKind::Compute);
    b.add_op(s, OpKind::Compute(1), lab(OpClass::LinearFwd), &[3]);
    assert!(b.build().is_err());
}

/// A many-GPU ring of compute → send → compute: every op's time by hand, and the same
/// timeline twice.
#[test]
fn ring_pipeline_by_hand_and_deterministic() {
    let gpus = 16u32;
    let build = || {
        let mut b = GraphBuilder::default();
        let comp: Vec<_> = (0..gpus)
            .map(|g| b.add_stream(g, StreamKind::Compute))
            .collect();
        let comm: Vec<_> = (0..gpus)
            .map(|g| b.add_stream(g, StreamKind::PpComm))
            .collect();
        let mut prev = None;
        for g in 0..gpus {
            let deps: Vec<OpId> = prev.into_iter().collect();
            let w = b.add_op(
                comp[g as usize],
                OpKind::Compute(1_000),
                lab(OpClass::LinearFwd),
                &deps,
            );
            let x = b.add_xfer(Xfer {
                src: g,
                dst: (g + 1) % gpus,
                bytes: 500,
            });
            prev = Some(b.add_op(
                comm[g as usize],
                OpKind::Send(x),
                lab(OpClass::PpSendFwd),
                &[w],
            ));
        }
        b.build().unwrap()
    };
    let g = build();
    let t1 = run(&g, &mut net()).unwrap();
    let t2 = run(&build(), &mut net()).unwrap();
    assert_eq!(t1, t2);
    // Hop g→g+1 is intra-node when g is even (2 GPUs per node): 1e6 + 500 ps, else 1e6 + 1000.
    let mut now = 0;
    for g in 0..gpus {
        now += 1_000;
        now += if g % 2 == 0 { 1_000_500 } else { 1_001_000 };
    }
    assert_eq!(t1.makespan, now);
}

mod prop {
    use super::*;
    use proptest::prelude::*;

    /// A random op: 0 = compute, 1 = send, 2 = collective over a GPU subset (bitmask);
    /// a duration or byte count; a GPU; an optional dependency (back-reference).
    type Spec = (u8, u64, u32, u32, u16);

    fn build(gpus: u32, specs: &[Spec]) -> (Graph, Vec<Vec<OpId>>) {
        let mut b = GraphBuilder::default();
        let comp: Vec<_> = (0..gpus)
            .map(|g| b.add_stream(g, StreamKind::Compute))
            .collect();
        let comm: Vec<_> = (0..gpus)
            .map(|g| b.add_stream(g, StreamKind::CpComm))
            .collect();
        let mut deps: Vec<Vec<OpId>> = Vec::new();
        for &(kind, amount, gpu, mask, back) in specs {
            let g = gpu % gpus;
            let n = b.len() as u32;
            let dep: Vec<OpId> = if n > 0 && back % 3 != 0 {
                vec![n - 1 - u32::from(back) % n]
            } else {
                vec![]
            };
            match kind % 3 {
                0 => {
                    b.add_op(
                        comp[g as usize],
                        OpKind::Compute(amount % 5_000),
                        lab(OpClass::LinearFwd),
                        &dep,
                    );
                    deps.push(dep);
                }
                1 => {
                    let x = b.add_xfer(Xfer {
                        src: g,
                        dst: (g + 1) % gpus,
                        bytes: amount % 10_000_000,
                    });
                    b.add_op(
                        comm[g as usize],
                        OpKind::Send(x),
                        lab(OpClass::PpSendFwd),
                        &dep,
                    );
                    deps.push(dep);
                }
                _ => {
                    let members: Vec<u32> = (0..gpus)
                        .filter(|m| mask & (1 << m) != 0 || *m == g)
                        .collect();
                    let xf: Vec<Xfer> = members
                        .iter()
                        .map(|&m| Xfer {
                            src: m,
                            dst: members[(members.iter().position(|&x| x == m).unwrap() + 1)
                                % members.len()],
                            bytes: amount % 10_000_000,
                        })
                        .collect();
                    let c = b.add_collective(&xf);
                    // Parts are added consecutively, so the graph cannot deadlock.
                    for &m in &members {
                        let d = if m == g { dep.clone() } else { vec![] };
                        b.add_op(comm[m as usize], OpKind::Coll(c), lab(OpClass::A2aIn), &d);
                        deps.push(d);
                    }
                }
            }
        }
        (b.build().unwrap(), deps)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        #[test]
        fn timelines_respect_streams_deps_and_durations(
            gpus in 1u32..6,
            specs in proptest::collection::vec((0u8..3, 0u64..u64::MAX, 0u32..8, 0u32..64, 0u16..40), 1..60),
        ) {
            let (g, deps) = build(gpus, &specs);
            let stub = net();
            let t = run(&g, &mut net()).unwrap();
            prop_assert_eq!(t.clone(), run(&g, &mut net()).unwrap());
            for (i, op) in g.ops.iter().enumerate() {
                for &d in &deps[i] {
                    prop_assert!(t.start[i] >= t.end[d as usize], "op {} starts before dep {}", i, d);
                }
                match op.kind() {
                    OpKind::Compute(d) => prop_assert_eq!(t.end[i] - t.start[i], d),
                    OpKind::Send(x) => {
                        let x = g.xfers[x as usize];
                        prop_assert_eq!(t.end[i] - t.start[i], stub.duration(x.src, x.dst, x.bytes));
                    }
                    OpKind::Coll(c) => {
                        let cs = t.coll_start[c as usize];
                        prop_assert!(cs >= t.start[i]);
                        let longest = g.coll_xfers(c).iter().map(|x| stub.duration(x.src, x.dst, x.bytes)).max().unwrap_or(0);
                        prop_assert_eq!(t.end[i], cs + longest);
                    }
                }
            }
            for s in 0..g.streams.len() as StreamId {
                let ops = g.stream_ops(s);
                for w in ops.windows(2) {
                    prop_assert!(w[0] < w[1]);
                    prop_assert!(t.start[w[1] as usize] >= t.end[w[0] as usize]);
                }
            }
            prop_assert_eq!(t.makespan, t.end.iter().copied().max().unwrap_or(0));
        }
    }
}

/// GPUs 0–4 with a compute and a CP stream each; GPU g's part of `coll` arrives after a
/// compute op of `arrive[g]` ps.
fn p2p_graph(
    pairs: &[(GpuId, GpuId)],
    xfers: &[Xfer],
    arrive: [Ps; 5],
) -> Result<(Graph, Vec<OpId>)> {
    let mut b = GraphBuilder::default();
    let coll = b.add_grouped_p2p(xfers, pairs);
    let mut parts = Vec::new();
    for (g, &a) in arrive.iter().enumerate() {
        let c = b.add_stream(g as GpuId, StreamKind::Compute);
        let m = b.add_stream(g as GpuId, StreamKind::CpComm);
        let w = b.add_op(c, OpKind::Compute(a), lab(OpClass::AttnFwd), &[]);
        parts.push(b.add_op(m, OpKind::Coll(coll), lab(OpClass::A2aIn), &[w]));
    }
    Ok((b.build()?, parts))
}

#[test]
fn grouped_p2p_couples_only_peers() {
    // {0, 1} and {2, 3} exchange; 4 only takes part. GPU 3 arrives late.
    let xfers = [
        Xfer {
            src: 0,
            dst: 1,
            bytes: 2_000_000,
        },
        Xfer {
            src: 3,
            dst: 2,
            bytes: 1000,
        },
    ];
    let (g, p) = p2p_graph(&[(0, 1), (2, 3)], &xfers, [0, 100, 50, 5_000_000, 7]).unwrap();
    let t = run(&g, &mut net()).unwrap();
    let end = |i: usize| t.end[p[i] as usize];
    // 0 → 1 starts when both arrived (100) and takes 1 µs + 2e6 ps; GPU 1 (nothing to
    // send) ends with it: it receives.
    assert_eq!((end(0), end(1)), (3_000_100, 3_000_100));
    // 3 → 2 waits for GPU 3 (5 µs) and lands 1 µs + 1000 ps later; GPU 0's pair does not.
    assert_eq!((end(2), end(3)), (6_001_000, 6_001_000));
    // No peers, no transfers: ends when it arrives.
    assert_eq!((t.start[p[4] as usize], end(4)), (7, 7));
    assert_eq!(t.coll_start[0], 7, "the first part to start its transfers");
    // The same transfers as one whole-group collective: everyone waits for GPU 3.
    let mut b = GraphBuilder::default();
    let coll = b.add_collective(&xfers);
    let mut parts = Vec::new();
    for (gpu, a) in [0, 100, 50, 5_000_000, 7].into_iter().enumerate() {
        let c = b.add_stream(gpu as GpuId, StreamKind::Compute);
        let m = b.add_stream(gpu as GpuId, StreamKind::CpComm);
        let w = b.add_op(c, OpKind::Compute(a), lab(OpClass::AttnFwd), &[]);
        parts.push(b.add_op(m, OpKind::Coll(coll), lab(OpClass::A2aIn), &[w]));
    }
    let t = run(&b.build().unwrap(), &mut net()).unwrap();
    assert!(parts
        .iter()
        .all(|&o| t.end[o as usize] == 5_000_000 + 3_000_000));
}

#[test]
fn grouped_p2p_hot_sender_delays_only_its_receivers() {
    // GPU 0 sends a lot to 1 and 2; GPU 3 sends little to 4. Receivers 1 and 2 end with
    // GPU 0's last transfer; 3 and 4 do not wait for it.
    let x = |src, dst, bytes| Xfer { src, dst, bytes };
    let (g, p) = p2p_graph(
        &[(0, 1), (0, 2), (3, 4)],
        &[x(0, 1, 4_000_000), x(0, 2, 1_000_000), x(3, 4, 10)],
        [0; 5],
    )
    .unwrap();
    let t = run(&g, &mut net()).unwrap();
    let end = |i: usize| t.end[p[i] as usize];
    let hot = 1_000_000 + 4_000_000; // 0 → 1 inside node 0
    assert_eq!((end(0), end(1), end(2)), (hot, hot, hot));
    let cold = 1_000_000 + 20; // 3 → 4 across nodes at half speed
    assert_eq!((end(3), end(4)), (cold, cold));
}

#[test]
fn grouped_p2p_part_after_a_part_of_its_own_collective_runs() {
    // GPU 2's part (no peers) waits for GPU 0's part to end: the collective cannot be
    // swept whole once all its parts have arrived, and is swept part by part, as the event
    // engine runs it.
    let mut b = GraphBuilder::default();
    let x = Xfer {
        src: 0,
        dst: 1,
        bytes: 1000,
    };
    let coll = b.add_grouped_p2p(&[x], &[(0, 1)]);
    let mut parts = Vec::new();
    for g in 0..3 {
        let c = b.add_stream(g, StreamKind::CpComm);
        let deps: Vec<OpId> = parts
            .first()
            .copied()
            .filter(|_| g == 2)
            .into_iter()
            .collect();
        parts.push(b.add_op(c, OpKind::Coll(coll), lab(OpClass::A2aIn), &deps));
    }
    let g = b.build().unwrap();
    let t = run(&g, &mut net()).unwrap();
    assert_eq!(t, run_events(&g, &mut net()).unwrap());
    let landed = 1_000_000 + 1000;
    assert_eq!(t.end[parts[0] as usize], landed);
    assert_eq!(
        (t.start[parts[2] as usize], t.end[parts[2] as usize]),
        (landed, landed)
    );
}

#[test]
fn grouped_p2p_rejects_unknown_gpus() {
    let e = p2p_graph(&[(0, 7)], &[], [0; 5]).unwrap_err().to_string();
    assert!(
        e.contains("GPU 7") && e.contains("a GPU with a part"),
        "{e}"
    );
    let x = Xfer {
        src: 9,
        dst: 0,
        bytes: 1,
    };
    let e = p2p_graph(&[], &[x], [0; 5]).unwrap_err().to_string();
    assert!(e.contains("GPU 9"), "{e}");
}

#[test]
fn grouped_p2p_wait_ends_when_the_last_peer_arrives() {
    let x = Xfer {
        src: 0,
        dst: 1,
        bytes: 10,
    };
    let (g, p) = p2p_graph(&[(0, 1)], &[x], [0, 300, 5, 0, 0]).unwrap();
    let t = run(&g, &mut net()).unwrap();
    // GPU 0 arrives at 0 and waits for GPU 1 (300); GPU 2 has no peer and waits not at all.
    assert_eq!(g.xfer_start(&t, p[0]), 300);
    assert_eq!(g.xfer_start(&t, p[1]), 300);
    assert_eq!(g.xfer_start(&t, p[2]), 5);
}

/// The DAG sweep against the event engine on random graphs: compute ops (some of zero
/// time), sends (some local or empty), whole-group collectives and grouped send/recv over
/// random GPU subsets, random dependencies (some forward, so some graphs deadlock), on the
/// stub and on the analytical model of a topology with random links slowed (faults) and
/// ECMP routes picked by tag. Timelines (or errors) must be equal, and equal at 1 and 4
/// threads.
mod differential {
    use super::*;
    use crate::cluster::Topology;
    use crate::net::AnalyticalModel;
    use rand::Rng;
    use std::sync::Arc;

    fn random_graph(seed: u64, gpus: u32) -> Graph {
        let mut rng = crate::rng::stream(seed, "engine-differential", 0);
        let mut b = GraphBuilder::default();
        let streams: Vec<[StreamId; 3]> = (0..gpus)
            .map(|g| {
                [
                    b.add_stream(g, StreamKind::Compute),
                    b.add_stream(g, StreamKind::CpComm),
                    b.add_stream(g, StreamKind::DpComm),
                ]
            })
            .collect();
        let bytes = |rng: &mut rand_chacha::ChaCha8Rng| match rng.random_range(0..8) {
            0 => 0,
            1 => 1,
            _ => rng.random_range(1..50_000_000u64),
        };
        let steps = rng.random_range(1..40);
        let mut late: Vec<(OpId, OpId)> = Vec::new();
        // The last grouped send/recv's members, transfers and pairs: sometimes added again
        // (the same exchange one layer on), sometimes with its members in reverse order.
        type Exchange = (Vec<GpuId>, Vec<Xfer>, Vec<(GpuId, GpuId)>);
        let mut again: Option<Exchange> = None;
        for _ in 0..steps {
            let n = b.len() as u32;
            let dep = |rng: &mut rand_chacha::ChaCha8Rng| -> Vec<OpId> {
                (0..rng.random_range(0..3))
                    .filter(|_| n > 0)
                    .map(|_| rng.random_range(0..n))
                    .collect::<std::collections::BTreeSet<_>>()
                    .into_iter()
                    .collect()
            };
            let g = rng.random_range(0..gpus);
            match rng.random_range(0..6) {
                0 | 1 => {
                    let d = match rng.random_range(0..5) {
                        0 => 0,
                        _ => rng.random_range(1..3_000_000u64),
                    };
                    let deps = dep(&mut rng);
                    b.add_op(
                        streams[g as usize][0],
                        OpKind::Compute(d),
                        lab(OpClass::LinearFwd),
                        &deps,
                    );
                }
                2 => {
                    let x = b.add_xfer(Xfer {
                        src: g,
                        dst: rng.random_range(0..gpus),
                        bytes: bytes(&mut rng),
                    });
                    let s = streams[g as usize][rng.random_range(1..3)];
                    let deps = dep(&mut rng);
                    b.add_op(s, OpKind::Send(x), lab(OpClass::PpSendFwd), &deps);
                }
                k => {
                    let mut members: Vec<GpuId> = (0..gpus)
                        .filter(|&m| m == g || rng.random_bool(0.5))
                        .collect();
                    let mut xfers = Vec::new();
                    let mut pairs = Vec::new();
                    let repeat = match &again {
                        Some(_) if k == 5 => rng.random_range(0..4),
                        _ => 3,
                    };
                    let fresh = match (repeat, &again) {
                        (0..=2, Some((m, x, p))) => {
                            (members, xfers, pairs) = (m.clone(), x.clone(), p.clone());
                            if repeat == 2 {
                                members.reverse();
                            }
                            0
                        }
                        _ => rng.random_range(0..2 * members.len()),
                    };
                    for _ in 0..fresh {
                        let (s, d) = (
                            members[rng.random_range(0..members.len())],
                            members[rng.random_range(0..members.len())],
                        );
                        xfers.push(Xfer {
                            src: s,
                            dst: d,
                            bytes: bytes(&mut rng),
                        });
                        pairs.push((s, d));
                    }
                    let c = if k == 5 {
                        let c = b.add_grouped_p2p(&xfers, &pairs);
                        again = Some((members.clone(), xfers.clone(), pairs));
                        c
                    } else {
                        b.add_collective(&xfers)
                    };
                    // Now and then the same exchange again (as a step's next layer): the
                    // collectives share one transfer list.
                    let twice = k != 5 && rng.random_bool(0.3);
                    let kind = rng.random_range(1..3);
                    for c in std::iter::once(c).chain(twice.then(|| b.add_collective(&xfers))) {
                        for &m in &members {
                            let deps = dep(&mut rng);
                            b.add_op(
                                streams[m as usize][kind],
                                OpKind::Coll(c),
                                lab(OpClass::A2aIn),
                                &deps,
                            );
                        }
                    }
                }
            }
            if n > 1 && rng.random_bool(0.03) {
                // A dependency on a later op: may close a cycle.
                late.push((rng.random_range(n / 2..n), rng.random_range(0..n / 2)));
            }
        }
        for (d, s) in late {
            b.add_dep(d, s);
        }
        b.build().unwrap()
    }

    fn topo() -> Arc<Topology> {
        crate::cluster::topology::test_small()
    }

    fn both(g: &Graph, net: &mut dyn NetworkModel) -> (Result<Timeline>, Result<Timeline>) {
        let d = net.fixed_durations().expect("a model with fixed durations");
        let in_pool = |threads| {
            rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap()
                .install(|| dag::run_dag(g, d))
        };
        let (one, four) = (in_pool(1), in_pool(4));
        assert_eq!(one, four, "the DAG sweep depends on the thread count");
        (one, run_events(g, net))
    }

    #[test]
    fn grouped_p2p_layouts_shared_or_not_are_each_collectives_own() {
        // Every part's peers and transfers, from its collective's pairs and transfers
        // alone, whether the collective repeats an earlier one or not.
        let mut shared = 0;
        for seed in 0..200u64 {
            let g = random_graph(seed, 1 + (seed % 16) as u32);
            let gpu = |k: usize| g.part_gpu(k);
            let mut seen = std::collections::BTreeSet::new();
            for (ci, c) in g.colls.iter().enumerate() {
                let Some((pa, pl)) = c.p2p else { continue };
                let pairs = &g.p2p_pairs[pa as usize..(pa + pl) as usize];
                let (a, b) = (
                    g.coll_part_off[ci] as usize,
                    g.coll_part_off[ci + 1] as usize,
                );
                let key = (
                    c.xfer_start,
                    c.xfer_len,
                    pairs.to_vec(),
                    (a..b).map(gpu).collect::<Vec<_>>(),
                );
                shared += usize::from(!seen.insert(key));
                for k in a..b {
                    let peers: Vec<u32> = (a..b)
                        .filter(|&q| {
                            q != k
                                && pairs.iter().any(|&(s, d)| {
                                    (s, d) == (gpu(k), gpu(q)) || (d, s) == (gpu(k), gpu(q))
                                })
                        })
                        .map(|q| q as u32)
                        .collect();
                    assert_eq!(
                        g.part_nbrs(k as u32),
                        peers,
                        "seed {seed} collective {ci} part {k}"
                    );
                    let own: Vec<u32> = (c.xfer_start..c.xfer_start + c.xfer_len)
                        .filter(|&i| g.xfers[i as usize].src == gpu(k))
                        .collect();
                    assert_eq!(
                        g.part_xfers(k as u32),
                        own,
                        "seed {seed} collective {ci} part {k}"
                    );
                }
            }
        }
        assert!(shared > 50, "{shared} repeated collectives");
    }

    #[test]
    fn dag_sweep_equals_the_event_engine_on_random_graphs() {
        let topo = topo();
        let (mut ok, mut stuck) = (0, 0);
        for seed in 0..400u64 {
            let gpus = 1 + (seed % 16) as u32;
            let g = random_graph(seed, gpus);
            let (dag, ev) = both(&g, &mut net());
            assert_eq!(dag, ev, "stub network, seed {seed}");
            let mut a = AnalyticalModel::new(topo.clone());
            let mut rng = crate::rng::stream(seed, "engine-differential-faults", 0);
            for _ in 0..rng.random_range(0..6) {
                let l = rng.random_range(0..topo.links.len() as u32);
                a.set_link_scale(0, l, rng.random_range(0.05..1.0));
            }
            let (dag, ev) = both(&g, &mut a);
            assert_eq!(dag, ev, "analytical network, seed {seed}");
            match ev {
                Ok(_) => ok += 1,
                Err(_) => stuck += 1,
            }
        }
        // Both outcomes are exercised.
        assert!(ok > 100 && stuck > 20, "{ok} finished, {stuck} stuck");
    }
}

/// An op is 16 bytes (a step holds hundreds of millions), and its label and kind survive
/// the packing.
#[test]
fn an_op_is_16_bytes() {
    assert_eq!(std::mem::size_of::<super::Op>(), 16);
    for (i, &class) in OpClass::ALL.iter().enumerate() {
        let label = OpLabel {
            class,
            mb: i as u16,
            layer: u16::MAX - i as u16,
        };
        for kind in [
            OpKind::Compute(MAX_OP_PS),
            OpKind::Send(u32::MAX),
            OpKind::Coll(COLL_BIT - 1),
        ] {
            let op = Op::new(kind, 7, label);
            assert_eq!((op.kind(), op.label(), op.stream), (kind, label, 7));
        }
    }
}

/// A compute op longer than an op holds is an error naming the op and the limit.
#[test]
fn an_op_too_long_to_hold_is_a_named_error() {
    let mut b = GraphBuilder::default();
    let s = b.add_stream(0, StreamKind::Compute);
    b.add_op(s, OpKind::Compute(5), lab(OpClass::LinearFwd), &[]);
    b.add_op(
        s,
        OpKind::Compute(MAX_OP_PS + 1),
        lab(OpClass::LinearFwd),
        &[],
    );
    let e = b.build().unwrap_err().to_string();
    assert!(
        e.contains("op 1 duration") && e.contains(&MAX_OP_PS.to_string()),
        "{e}"
    );
}

/// Collectives with equal transfers share one list; the timeline is that of separate
/// lists (two all-reduces of the same bytes, then one of other bytes).
#[test]
fn collectives_with_equal_transfers_share_them() {
    let mut b = GraphBuilder::default();
    let s: Vec<_> = (0..2)
        .map(|g| b.add_stream(g, StreamKind::CpComm))
        .collect();
    let xf = |bytes| {
        [
            Xfer {
                src: 0,
                dst: 1,
                bytes,
            },
            Xfer {
                src: 1,
                dst: 0,
                bytes,
            },
        ]
    };
    let cs: Vec<_> = [1000, 1000, 3000, 1000]
        .map(|bytes| b.add_collective(&xf(bytes)))
        .to_vec();
    for &c in &cs {
        for &st in &s {
            b.add_op(st, OpKind::Coll(c), lab(OpClass::A2aIn), &[]);
        }
    }
    let g = b.build().unwrap();
    assert_eq!(g.xfers.len(), 4, "two lists of two");
    assert_eq!(g.coll_xfers(cs[1]), &xf(1000));
    assert_eq!(g.coll_xfers(cs[2]), &xf(3000));
    assert_eq!(g.coll_xfers(cs[3]), &xf(1000));
    let t = run(&g, &mut net()).unwrap();
    // Each all-reduce: 1 µs latency + bytes at 1 byte/ps, one after another.
    assert_eq!(t.makespan, 4 * 1_000_000 + 1000 + 1000 + 3000 + 1000);
}

/// The first bad item is found in order, in one chunk or across many.
#[test]
fn the_first_bad_item_is_found_in_order() {
    let v: Vec<u32> = (0..300_000).collect();
    let bad = |&x: &u32| x % 70_000 == 69_999;
    assert_eq!(super::first_in_chunks(&v, bad), Some((69_999, &69_999)));
    assert_eq!(super::first_in_chunks(&v[..1000], bad), None);
    assert_eq!(super::first_in_chunks(&v[..0], bad), None);
}
