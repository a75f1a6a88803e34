//! Pictures of a topology for `skewsim topo`: Graphviz DOT (every vertex and link, via
//! petgraph's DOT writer) and a layered SVG drawn here (spines, leaves, nodes with their
//! GPUs, NVSwitch and NICs; NVLink domains spanning nodes are outlined). The SVG shows at
//! most [`MAX_DRAWN_NODES`] nodes and says how many it left out.

use std::fmt::Write as _;

use petgraph::dot::{Config, Dot};

use skewsim::cluster::{Topology, Vertex};

/// Most nodes the SVG draws.
pub const MAX_DRAWN_NODES: u32 = 16;

/// The whole graph in DOT.
pub fn dot(topo: &Topology) -> String {
    format!(
        "// {} — {} nodes, {} GPUs, {} directed links\n{:?}",
        topo.spec.name,
        topo.nodes,
        topo.gpus(),
        topo.links.len(),
        Dot::with_config(&topo.graph, &[Config::EdgeNoLabel])
    )
}

/// A layered SVG picture.
pub fn svg(topo: &Topology) -> String {
    let g = topo.gpus_per_node;
    let drawn = topo.nodes.min(MAX_DRAWN_NODES);
    let gpu_w = 16.0;
    let node_w = f64::from(g) * gpu_w + 16.0;
    let gap = 14.0;
    let width = (f64::from(drawn) * (node_w + gap) + 60.0).max(480.0);
    let (leaves, spines) = topo.switches();
    let height = 380.0;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0}" height="{height:.0}" font-family="sans-serif" font-size="10">"#
    );
    let _ = writeln!(
        s,
        r#"<text x="10" y="16" font-size="13">{} — {} nodes × {} GPUs = {} GPUs{}</text>"#,
        topo.spec.name,
        topo.nodes,
        g,
        topo.gpus(),
        if drawn < topo.nodes {
            format!(" (first {drawn} nodes drawn)")
        } else {
            String::new()
        }
    );
    let node_x = |n: u32| 30.0 + f64::from(n) * (node_w + gap);
    let node_y = 250.0;
    // Which leaves serve the drawn nodes, and where to put them.
    let mut leaf_pos: Vec<(u32, f64)> = Vec::new();
    let mut nic_edges: Vec<(f64, u32)> = Vec::new();
    for l in &topo.links {
        if let (Vertex::Nic { node, rail }, Vertex::Leaf(leaf)) =
            (topo.vertices[l.src as usize], topo.vertices[l.dst as usize])
        {
            if node < drawn {
                let nics = topo.spec.nic.as_ref().map_or(1, |n| n.per_node);
                let x = node_x(node)
                    + 8.0
                    + (f64::from(rail) + 0.5) * (node_w - 16.0) / f64::from(nics);
                nic_edges.push((x, leaf));
                if !leaf_pos.iter().any(|(id, _)| *id == leaf) {
                    leaf_pos.push((leaf, 0.0));
                }
            }
        }
    }
    let nl = leaf_pos.len().max(1) as f64;
    for (i, (_, x)) in leaf_pos.iter_mut().enumerate() {
        *x = 30.0 + (i as f64 + 0.5) * (width - 60.0) / nl;
    }
    let spines_drawn = spines.min(32);
    let spine_x =
        |sp: u32| 30.0 + (f64::from(sp) + 0.5) * (width - 60.0) / f64::from(spines_drawn.max(1));
    let (spine_y, leaf_y) = (50.0, 140.0);
    // Leaf–spine links (thin), NIC–leaf links.
    for &(leaf, lx) in &leaf_pos {
        for sp in 0..spines_drawn {
            let _ = writeln!(
                s,
                r##"<line x1="{lx:.1}" y1="{leaf_y}" x2="{:.1}" y2="{}" stroke="#bbb" stroke-width="0.5"/>"##,
                spine_x(sp),
                spine_y + 10.0
            );
        }
        let _ = leaf;
    }
    for &(x, leaf) in &nic_edges {
        if let Some((_, lx)) = leaf_pos.iter().find(|(id, _)| *id == leaf) {
            let _ = writeln!(
                s,
                r##"<line x1="{x:.1}" y1="{node_y}" x2="{lx:.1}" y2="{}" stroke="#4a7" stroke-width="0.8"/>"##,
                leaf_y + 12.0
            );
        }
    }
    for sp in 0..spines_drawn {
        let x = spine_x(sp);
        let _ = writeln!(
            s,
            r##"<rect x="{:.1}" y="{spine_y}" width="14" height="10" fill="#c55"/>"##,
            x - 7.0
        );
    }
    if spines > spines_drawn {
        let _ = writeln!(
            s,
            r#"<text x="10" y="40">{spines} spines ({spines_drawn} drawn)</text>"#
        );
    } else if spines > 0 {
        let _ = writeln!(s, r#"<text x="10" y="40">{spines} spines</text>"#);
    }
    for &(leaf, x) in &leaf_pos {
        let _ = writeln!(
            s,
            r##"<rect x="{:.1}" y="{leaf_y}" width="18" height="12" fill="#d93"/><text x="{:.1}" y="{}" text-anchor="middle">L{leaf}</text>"##,
            x - 9.0,
            x,
            leaf_y - 3.0
        );
    }
    if leaves > 0 {
        let _ = writeln!(
            s,
            r#"<text x="10" y="{}">{leaves} leaves ({} serve the drawn nodes)</text>"#,
            leaf_y + 30.0,
            leaf_pos.len()
        );
    }
    // NVLink domains spanning several nodes.
    let dn = topo.domain_gpus() / g;
    if dn > 1 {
        for d in 0..drawn.div_ceil(dn) {
            let first = d * dn;
            let last = (first + dn).min(drawn) - 1;
            let _ = writeln!(
                s,
                r##"<rect x="{:.1}" y="{}" width="{:.1}" height="110" fill="none" stroke="#36c" stroke-dasharray="4 3"/><text x="{:.1}" y="{}" fill="#36c">NVLink domain {d} ({} GPUs)</text>"##,
                node_x(first) - 5.0,
                node_y - 12.0,
                node_x(last) + node_w - node_x(first) + 10.0,
                node_x(first),
                node_y + 112.0,
                topo.domain_gpus()
            );
        }
    }
    for n in 0..drawn {
        let x = node_x(n);
        let _ = writeln!(
            s,
            r##"<rect x="{x:.1}" y="{node_y}" width="{node_w:.1}" height="80" fill="#f4f4f4" stroke="#555"/><text x="{:.1}" y="{}" text-anchor="middle">node {n}</text>"##,
            x + node_w / 2.0,
            node_y + 94.0
        );
        let _ = writeln!(
            s,
            r##"<rect x="{:.1}" y="{}" width="{:.1}" height="10" fill="#36c"/>"##,
            x + 8.0,
            node_y + 60.0,
            node_w - 16.0
        );
        for l in 0..g {
            let gx = x + 8.0 + f64::from(l) * gpu_w;
            let _ = writeln!(
                s,
                r##"<rect x="{gx:.1}" y="{}" width="{:.1}" height="20" fill="#7b3"/><line x1="{:.1}" y1="{}" x2="{:.1}" y2="{}" stroke="#36c"/>"##,
                node_y + 25.0,
                gpu_w - 3.0,
                gx + (gpu_w - 3.0) / 2.0,
                node_y + 45.0,
                gx + (gpu_w - 3.0) / 2.0,
                node_y + 60.0
            );
        }
    }
    let _ = writeln!(
        s,
        r##"<text x="10" y="{}">green: GPUs; blue bar: NVSwitch; orange: leaves; red: spines</text>"##,
        height - 8.0
    );
    s.push_str("</svg>\n");
    s
}
