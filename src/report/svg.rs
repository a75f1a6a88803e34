//! A small SVG chart writer: line and scatter series on linear or log axes, with ticks,
//! tick labels, axis labels, a legend and a title; [`Grid`] puts several charts side by
//! side as small multiples under one title. Returns the document as a `String`; the
//! caller writes it (the library does no I/O).
//!
//! # Example
//! ```
//! use skewsim::report::svg::{Chart, Scale, Series};
//! let svg = Chart::new("R − 1 vs pool size")
//!     .x("pool size P", Scale::Log)
//!     .y("R − 1", Scale::Log)
//!     .series(Series::line("random", vec![(2.0, 1.5), (8.0, 0.6), (64.0, 0.1)]))
//!     .series(Series::scatter("vrsp", vec![(8.0, 0.005)]))
//!     .render();
//! assert!(svg.starts_with("<svg"));
//! ```
//!
//! Points that a log axis cannot show (x ≤ 0 or y ≤ 0) and non-finite points are left out
//! (a line breaks there); [`Chart::render`] notes how many in a comment, never silently
//! moves them.

use std::fmt::Write as _;

/// How an axis maps values to positions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scale {
    /// Evenly spaced values.
    Linear,
    /// Evenly spaced decades (values > 0).
    Log,
}

/// How a series is drawn.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mark {
    /// A polyline through the points in the given order.
    Line,
    /// A dot per point.
    Scatter,
    /// Both.
    LinePoints,
    /// A hollow ring per point (e.g. reference values from a paper, over a line).
    Ring,
}

/// One named series.
#[derive(Clone, Debug, PartialEq)]
pub struct Series {
    /// Legend label.
    pub name: String,
    /// (x, y) points, drawn in order.
    pub points: Vec<(f64, f64)>,
    /// How the points are drawn.
    pub mark: Mark,
    /// A CSS colour; `None` picks the next colour of the palette.
    pub color: Option<String>,
    /// Draw the line dashed.
    pub dashed: bool,
}

impl Series {
    /// A series of `points` named `name`, drawn as `mark`.
    pub fn new(name: impl Into<String>, points: Vec<(f64, f64)>, mark: Mark) -> Series {
        Series {
            name: name.into(),
            points,
            mark,
            color: None,
            dashed: false,
        }
    }
    /// A solid line with points.
    pub fn line(name: impl Into<String>, points: Vec<(f64, f64)>) -> Series {
        Series::new(name, points, Mark::LinePoints)
    }
    /// Unconnected points.
    pub fn scatter(name: impl Into<String>, points: Vec<(f64, f64)>) -> Series {
        Series::new(name, points, Mark::Scatter)
    }
    /// Draw dashed (e.g. a theory curve).
    pub fn dashed(mut self) -> Series {
        self.dashed = true;
        self
    }
    /// The series in colour `c` (CSS colour) instead of the palette's.
    pub fn color(mut self, c: impl Into<String>) -> Series {
        self.color = Some(c.into());
        self
    }
}

/// An axis: its label, scale and optional fixed range.
#[derive(Clone, Debug, PartialEq)]
pub struct Axis {
    /// Axis label.
    pub label: String,
    /// How values map to positions.
    pub scale: Scale,
    /// Fixed (min, max), else fitted to the data.
    pub range: Option<(f64, f64)>,
    /// Tick values to use instead of the automatic ones (those outside the range are
    /// dropped).
    pub ticks: Option<Vec<f64>>,
}

/// A chart: build with the chained setters, then [`Chart::render`].
#[derive(Clone, Debug, PartialEq)]
pub struct Chart {
    /// Title above the plot.
    pub title: String,
    /// The horizontal axis.
    pub x: Axis,
    /// The vertical axis.
    pub y: Axis,
    /// The data series, in legend order.
    pub series: Vec<Series>,
    /// Width in pixels.
    pub width: f64,
    /// Height in pixels.
    pub height: f64,
}

/// The palette colour series `i` gets when it names none.
pub fn palette(i: usize) -> &'static str {
    PALETTE[i % PALETTE.len()]
}

/// Colour-blind-safe palette (Okabe–Ito).
const PALETTE: [&str; 8] = [
    "#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000", "#F0E442",
];

const MARGIN_LEFT: f64 = 70.0;
const MARGIN_RIGHT: f64 = 170.0;
const MARGIN_TOP: f64 = 40.0;
const MARGIN_BOTTOM: f64 = 55.0;

/// The mapping from data to pixel coordinates of a rendered chart (public so callers and
/// tests can check where a value lands).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Frame {
    /// The x axis's scale.
    pub x_scale: Scale,
    /// The y axis's scale.
    pub y_scale: Scale,
    /// The x axis's data range.
    pub x_range: (f64, f64),
    /// The y axis's data range.
    pub y_range: (f64, f64),
    /// Plot area in pixels: left, top, right, bottom.
    pub plot: (f64, f64, f64, f64),
}

fn to_axis(v: f64, scale: Scale) -> f64 {
    match scale {
        Scale::Linear => v,
        Scale::Log => v.log10(),
    }
}

impl Frame {
    /// Pixel x of data value `x`.
    pub fn px(&self, x: f64) -> f64 {
        let (a, b) = (
            to_axis(self.x_range.0, self.x_scale),
            to_axis(self.x_range.1, self.x_scale),
        );
        let t = (to_axis(x, self.x_scale) - a) / (b - a);
        self.plot.0 + t * (self.plot.2 - self.plot.0)
    }
    /// Pixel y of data value `y` (SVG y grows downwards).
    pub fn py(&self, y: f64) -> f64 {
        let (a, b) = (
            to_axis(self.y_range.0, self.y_scale),
            to_axis(self.y_range.1, self.y_scale),
        );
        let t = (to_axis(y, self.y_scale) - a) / (b - a);
        self.plot.3 - t * (self.plot.3 - self.plot.1)
    }
}

fn shown(p: (f64, f64), xs: Scale, ys: Scale) -> bool {
    p.0.is_finite()
        && p.1.is_finite()
        && (xs == Scale::Linear || p.0 > 0.0)
        && (ys == Scale::Linear || p.1 > 0.0)
}

/// A data range padded to something an axis can show: never empty, never ≤ 0 on log.
fn auto_range(values: impl Iterator<Item = f64>, scale: Scale) -> (f64, f64) {
    let (mut lo, mut hi) = (f64::INFINITY, f64::NEG_INFINITY);
    for v in values {
        lo = lo.min(v);
        hi = hi.max(v);
    }
    if !lo.is_finite() {
        return match scale {
            Scale::Linear => (0.0, 1.0),
            Scale::Log => (1.0, 10.0),
        };
    }
    match scale {
        Scale::Log => {
            // Whole decades, so the ticks sit on the frame.
            let (a, b) = (lo.log10().floor(), hi.log10().ceil());
            let b = if b <= a { a + 1.0 } else { b };
            (10f64.powf(a), 10f64.powf(b))
        }
        Scale::Linear => {
            if hi == lo {
                let pad = if lo == 0.0 { 1.0 } else { lo.abs() * 0.1 };
                return (lo - pad, hi + pad);
            }
            let step = nice_step((hi - lo) / 5.0);
            ((lo / step).floor() * step, (hi / step).ceil() * step)
        }
    }
}

/// The 1-2-5 step nearest above `raw`.
fn nice_step(raw: f64) -> f64 {
    let mag = 10f64.powf(raw.log10().floor());
    let f = raw / mag;
    let n = if f <= 1.0 {
        1.0
    } else if f <= 2.0 {
        2.0
    } else if f <= 5.0 {
        5.0
    } else {
        10.0
    };
    n * mag
}

/// Tick values inside `range` for `scale`.
pub fn ticks(range: (f64, f64), scale: Scale) -> Vec<f64> {
    let (lo, hi) = range;
    let eps = 1e-9;
    match scale {
        Scale::Linear => {
            let step = nice_step((hi - lo) / 5.0);
            let first = (lo / step - eps).ceil() as i64;
            let last = (hi / step + eps).floor() as i64;
            (first..=last).map(|i| i as f64 * step).collect()
        }
        Scale::Log => {
            let (a, b) = (
                (lo.log10() - eps).ceil() as i32,
                (hi.log10() + eps).floor() as i32,
            );
            let decades: Vec<f64> = (a..=b).map(|e| 10f64.powi(e)).collect();
            if decades.len() >= 3 {
                return decades;
            }
            // A narrow range: add 2× and 5× ticks.
            let mut t = Vec::new();
            for e in (a - 1)..=b {
                for m in [1.0, 2.0, 5.0] {
                    let v = m * 10f64.powi(e);
                    if v >= lo * (1.0 - eps) && v <= hi * (1.0 + eps) {
                        t.push(v);
                    }
                }
            }
            t
        }
    }
}

/// A short label for a tick value: integers plainly, 10^k on wide log ranges as 1e-3.
pub fn tick_label(v: f64) -> String {
    if v == 0.0 {
        return "0".into();
    }
    let a = v.abs();
    if (1e-3..1e6).contains(&a) {
        let s = format!("{v:.6}");
        let s = s.trim_end_matches('0').trim_end_matches('.');
        s.to_string()
    } else {
        let e = a.log10().floor() as i32;
        let m = v / 10f64.powi(e);
        if (m - m.round()).abs() < 1e-9 {
            format!("{}e{e}", m.round())
        } else {
            format!("{m:.2}e{e}")
        }
    }
}

/// Escapes text for XML content and attribute values.
pub fn escape(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&apos;"),
            _ => o.push(c),
        }
    }
    o
}

impl Chart {
    /// An empty chart titled `title` (linear axes, default size).
    pub fn new(title: impl Into<String>) -> Chart {
        Chart {
            title: title.into(),
            x: Axis {
                label: String::new(),
                scale: Scale::Linear,
                range: None,
                ticks: None,
            },
            y: Axis {
                label: String::new(),
                scale: Scale::Linear,
                range: None,
                ticks: None,
            },
            series: Vec::new(),
            width: 720.0,
            height: 440.0,
        }
    }
    /// The x axis labelled `label` on `scale`.
    pub fn x(mut self, label: impl Into<String>, scale: Scale) -> Chart {
        self.x.label = label.into();
        self.x.scale = scale;
        self
    }
    /// The y axis labelled `label` on `scale`.
    pub fn y(mut self, label: impl Into<String>, scale: Scale) -> Chart {
        self.y.label = label.into();
        self.y.scale = scale;
        self
    }
    /// Fix the x range (otherwise fitted to the data).
    pub fn x_range(mut self, lo: f64, hi: f64) -> Chart {
        self.x.range = Some((lo, hi));
        self
    }
    /// Fix the y range (otherwise fitted to the data).
    pub fn y_range(mut self, lo: f64, hi: f64) -> Chart {
        self.y.range = Some((lo, hi));
        self
    }
    /// Put x ticks at these values (e.g. the pool sizes swept) instead of the automatic ones.
    pub fn x_ticks(mut self, ticks: Vec<f64>) -> Chart {
        self.x.ticks = Some(ticks);
        self
    }
    /// Put y ticks at these values instead of the automatic ones.
    pub fn y_ticks(mut self, ticks: Vec<f64>) -> Chart {
        self.y.ticks = Some(ticks);
        self
    }
    /// The chart's size in pixels.
    pub fn size(mut self, width: f64, height: f64) -> Chart {
        self.width = width;
        self.height = height;
        self
    }
    /// Add the series `s`.
    pub fn series(mut self, s: Series) -> Chart {
        self.series.push(s);
        self
    }

    fn visible(&self) -> impl Iterator<Item = (f64, f64)> + '_ {
        let (xs, ys) = (self.x.scale, self.y.scale);
        self.series
            .iter()
            .flat_map(|s| s.points.iter().copied())
            .filter(move |&p| shown(p, xs, ys))
    }

    /// The data-to-pixel mapping `render` uses.
    pub fn frame(&self) -> Frame {
        let valid = |r: (f64, f64), s: Scale| {
            r.0.is_finite() && r.1.is_finite() && r.1 > r.0 && (s == Scale::Linear || r.0 > 0.0)
        };
        let x_range = match self.x.range {
            Some(r) if valid(r, self.x.scale) => r,
            _ => auto_range(self.visible().map(|p| p.0), self.x.scale),
        };
        let y_range = match self.y.range {
            Some(r) if valid(r, self.y.scale) => r,
            _ => auto_range(self.visible().map(|p| p.1), self.y.scale),
        };
        Frame {
            x_scale: self.x.scale,
            y_scale: self.y.scale,
            x_range,
            y_range,
            plot: (
                MARGIN_LEFT,
                MARGIN_TOP,
                (self.total_width() - self.margin_right()).max(MARGIN_LEFT + 10.0),
                (self.height - MARGIN_BOTTOM).max(MARGIN_TOP + 10.0),
            ),
        }
    }

    /// The right margin: room for the legend's longest name (about 7 px a character at
    /// 12 px sans-serif, after the 36 px sample line), at least [`MARGIN_RIGHT`].
    fn margin_right(&self) -> f64 {
        let longest = self
            .series
            .iter()
            .map(|s| s.name.chars().count())
            .max()
            .unwrap_or(0);
        MARGIN_RIGHT.max(46.0 + 7.0 * longest as f64)
    }

    /// The document's width: `width`, widened by whatever a long legend needs beyond the
    /// default margin, so the plot area keeps its size.
    fn total_width(&self) -> f64 {
        self.width + self.margin_right() - MARGIN_RIGHT
    }

    /// The SVG document.
    pub fn render(&self) -> String {
        let mut o = String::new();
        let _ = writeln!(
            o,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="12">"#,
            w = self.total_width(),
            h = self.height
        );
        self.body(&mut o, "plot");
        o.push_str("</svg>\n");
        o
    }

    /// The chart's elements (everything inside the `<svg>` element), its plot area clipped
    /// by a clip path of id `clip` (unique in the document).
    fn body(&self, o: &mut String, clip: &str) {
        let f = self.frame();
        let (l, t, r, b) = f.plot;
        let _ = writeln!(
            o,
            r#"<rect x="0" y="0" width="{}" height="{}" fill="white"/>"#,
            self.total_width(),
            self.height
        );
        let _ = writeln!(
            o,
            r#"<text x="{}" y="22" text-anchor="middle" font-size="15">{}</text>"#,
            (l + r) / 2.0,
            escape(&self.title)
        );
        // Grid, ticks and tick labels.
        let pick = |axis: &Axis, range: (f64, f64), scale: Scale| -> Vec<f64> {
            match &axis.ticks {
                Some(t) => t
                    .iter()
                    .copied()
                    .filter(|&v| {
                        shown((v, v), scale, scale)
                            && v >= range.0 * (1.0 - 1e-12)
                            && v <= range.1 * (1.0 + 1e-12)
                    })
                    .collect(),
                None => ticks(range, scale),
            }
        };
        for v in pick(&self.x, f.x_range, f.x_scale) {
            let x = f.px(v);
            let _ = writeln!(
                o,
                r##"<line x1="{x:.2}" y1="{t:.2}" x2="{x:.2}" y2="{b:.2}" stroke="#e0e0e0"/><line x1="{x:.2}" y1="{b:.2}" x2="{x:.2}" y2="{:.2}" stroke="black"/><text x="{x:.2}" y="{:.2}" text-anchor="middle">{}</text>"##,
                b + 5.0,
                b + 19.0,
                escape(&tick_label(v))
            );
        }
        for v in pick(&self.y, f.y_range, f.y_scale) {
            let y = f.py(v);
            let _ = writeln!(
                o,
                r##"<line x1="{l:.2}" y1="{y:.2}" x2="{r:.2}" y2="{y:.2}" stroke="#e0e0e0"/><line x1="{:.2}" y1="{y:.2}" x2="{l:.2}" y2="{y:.2}" stroke="black"/><text x="{:.2}" y="{:.2}" text-anchor="end">{}</text>"##,
                l - 5.0,
                l - 8.0,
                y + 4.0,
                escape(&tick_label(v))
            );
        }
        let _ = writeln!(
            o,
            r#"<rect x="{l:.2}" y="{t:.2}" width="{:.2}" height="{:.2}" fill="none" stroke="black"/>"#,
            r - l,
            b - t
        );
        let _ = writeln!(
            o,
            r#"<text x="{:.2}" y="{:.2}" text-anchor="middle">{}</text>"#,
            (l + r) / 2.0,
            self.height - 12.0,
            escape(&self.x.label)
        );
        let _ = writeln!(
            o,
            r#"<text x="16" y="{:.2}" text-anchor="middle" transform="rotate(-90 16 {:.2})">{}</text>"#,
            (t + b) / 2.0,
            (t + b) / 2.0,
            escape(&self.y.label)
        );
        // Series, clipped to the plot area.
        let _ = writeln!(
            o,
            r#"<clipPath id="{clip}"><rect x="{l:.2}" y="{t:.2}" width="{:.2}" height="{:.2}"/></clipPath>"#,
            r - l,
            b - t
        );
        let mut hidden = 0usize;
        for (i, s) in self.series.iter().enumerate() {
            let color = s
                .color
                .clone()
                .unwrap_or_else(|| PALETTE[i % PALETTE.len()].to_string());
            let color = escape(&color);
            let dash = if s.dashed {
                r#" stroke-dasharray="6 4""#
            } else {
                ""
            };
            let _ = writeln!(
                o,
                r#"<g clip-path="url(#{clip})" data-series="{}">"#,
                escape(&s.name)
            );
            // Runs of consecutive drawable points become one polyline each.
            let mut runs: Vec<Vec<(f64, f64)>> = vec![Vec::new()];
            for &p in &s.points {
                if shown(p, f.x_scale, f.y_scale) {
                    if let Some(run) = runs.last_mut() {
                        run.push((f.px(p.0), f.py(p.1)));
                    }
                } else {
                    hidden += 1;
                    runs.push(Vec::new());
                }
            }
            if matches!(s.mark, Mark::Line | Mark::LinePoints) {
                for run in runs.iter().filter(|r| r.len() >= 2) {
                    let pts: Vec<String> =
                        run.iter().map(|(x, y)| format!("{x:.2},{y:.2}")).collect();
                    let _ = writeln!(
                        o,
                        r#"<polyline points="{}" fill="none" stroke="{color}" stroke-width="2"{dash}/>"#,
                        pts.join(" ")
                    );
                }
            }
            if matches!(s.mark, Mark::Scatter | Mark::LinePoints) {
                for (x, y) in runs.iter().flatten() {
                    let _ = writeln!(
                        o,
                        r#"<circle cx="{x:.2}" cy="{y:.2}" r="3" fill="{color}"/>"#
                    );
                }
            }
            if s.mark == Mark::Ring {
                for (x, y) in runs.iter().flatten() {
                    let _ = writeln!(
                        o,
                        r#"<circle cx="{x:.2}" cy="{y:.2}" r="6" fill="none" stroke="{color}" stroke-width="2"/>"#
                    );
                }
            }
            let _ = writeln!(o, "</g>");
            // Legend entry.
            let ly = t + 10.0 + 18.0 * i as f64;
            let lx = r + 12.0;
            if s.mark == Mark::Ring {
                let _ = writeln!(
                    o,
                    r#"<circle cx="{:.2}" cy="{ly:.2}" r="5" fill="none" stroke="{color}" stroke-width="2"/><text x="{:.2}" y="{:.2}">{}</text>"#,
                    lx + 11.0,
                    lx + 28.0,
                    ly + 4.0,
                    escape(&s.name)
                );
                continue;
            }
            let _ = writeln!(
                o,
                r#"<line x1="{lx:.2}" y1="{ly:.2}" x2="{:.2}" y2="{ly:.2}" stroke="{color}" stroke-width="2"{dash}/><text x="{:.2}" y="{:.2}">{}</text>"#,
                lx + 22.0,
                lx + 28.0,
                ly + 4.0,
                escape(&s.name)
            );
        }
        if hidden > 0 {
            let _ = writeln!(
                o,
                "<!-- {hidden} point(s) not drawable on these axes (non-finite, or ≤ 0 on a log axis) -->"
            );
        }
    }
}

/// Small multiples: charts side by side in rows of `columns`, under one title, in one
/// document (e.g. one panel per corpus and topology, the same series in each). Each panel
/// keeps its own axes, labels and legend; every cell is as large as the largest panel.
#[derive(Clone, Debug, PartialEq)]
pub struct Grid {
    /// Title above every panel.
    pub title: String,
    /// Panels per row.
    pub columns: usize,
    /// The panels, row by row.
    pub panels: Vec<Chart>,
}

/// Height of the band above the panels that holds the grid's title.
const GRID_TITLE: f64 = 36.0;

impl Grid {
    /// An empty grid titled `title`.
    pub fn new(title: impl Into<String>) -> Grid {
        Grid {
            title: title.into(),
            columns: 2,
            panels: Vec::new(),
        }
    }
    /// Panels per row (at least 1).
    pub fn columns(mut self, n: usize) -> Grid {
        self.columns = n.max(1);
        self
    }
    /// Add the panel `c`.
    pub fn panel(mut self, c: Chart) -> Grid {
        self.panels.push(c);
        self
    }

    /// The (width, height) of one cell.
    fn cell(&self) -> (f64, f64) {
        self.panels.iter().fold((0.0f64, 0.0f64), |(w, h), c| {
            (w.max(c.total_width()), h.max(c.height))
        })
    }

    /// Where panel `i`'s top-left corner lands in the document.
    pub fn origin(&self, i: usize) -> (f64, f64) {
        let (w, h) = self.cell();
        let cols = self.columns.max(1);
        ((i % cols) as f64 * w, GRID_TITLE + (i / cols) as f64 * h)
    }

    /// The SVG document: the title, then each panel translated to its cell, its clip path
    /// named `plot-{i}`.
    pub fn render(&self) -> String {
        let (w, h) = self.cell();
        let cols = self.columns.max(1).min(self.panels.len().max(1));
        let rows = self.panels.len().div_ceil(cols).max(1);
        let (width, height) = (w * cols as f64, GRID_TITLE + h * rows as f64);
        let mut o = String::new();
        let _ = writeln!(
            o,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">"#
        );
        let _ = writeln!(
            o,
            r#"<rect x="0" y="0" width="{width}" height="{height}" fill="white"/>"#
        );
        let _ = writeln!(
            o,
            r#"<text x="{:.2}" y="24" text-anchor="middle" font-size="17">{}</text>"#,
            width / 2.0,
            escape(&self.title)
        );
        for (i, c) in self.panels.iter().enumerate() {
            let (x, y) = self.origin(i);
            let _ = writeln!(o, r#"<g transform="translate({x:.2} {y:.2})">"#);
            c.body(&mut o, &format!("plot-{i}"));
            let _ = writeln!(o, "</g>");
        }
        o.push_str("</svg>\n");
        o
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A minimal XML well-formedness check: tags nest and close, attributes are quoted,
    /// no bare `&` or `<` in text. Returns the element names in document order.
    pub(crate) fn well_formed(doc: &str) -> Result<Vec<String>, String> {
        let mut stack: Vec<String> = Vec::new();
        let mut names = Vec::new();
        let mut rest = doc;
        while let Some(i) = rest.find(['<', '&']) {
            let (text, tail) = rest.split_at(i);
            let _ = text;
            if tail.starts_with('&') {
                let end = tail.find(';').ok_or("bare &")?;
                let ent = &tail[1..end];
                if !["amp", "lt", "gt", "quot", "apos"].contains(&ent) {
                    return Err(format!("unknown entity &{ent};"));
                }
                rest = &tail[end + 1..];
                continue;
            }
            if let Some(after) = tail.strip_prefix("<!--") {
                let end = after.find("-->").ok_or("open comment")?;
                rest = &after[end + 3..];
                continue;
            }
            let end = tail.find('>').ok_or("unclosed tag")?;
            let tag = &tail[1..end];
            if tag.contains('<') {
                return Err(format!("'<' inside tag {tag}"));
            }
            if let Some(name) = tag.strip_prefix('/') {
                match stack.pop() {
                    Some(open) if open == name.trim() => {}
                    other => return Err(format!("</{name}> closes {other:?}")),
                }
            } else {
                let self_closing = tag.ends_with('/');
                let body = tag.trim_end_matches('/');
                let name = body
                    .split_whitespace()
                    .next()
                    .ok_or("empty tag")?
                    .to_string();
                if body.matches('"').count() % 2 != 0 {
                    return Err(format!("unbalanced quotes in <{body}>"));
                }
                names.push(name.clone());
                if !self_closing {
                    stack.push(name);
                }
            }
            rest = &tail[end + 1..];
        }
        if stack.is_empty() {
            Ok(names)
        } else {
            Err(format!("unclosed {stack:?}"))
        }
    }

    #[test]
    fn checker_rejects_broken_xml() {
        assert!(well_formed("<a><b></a>").is_err());
        assert!(well_formed("<a>x & y</a>").is_err());
        assert!(well_formed("<a x=\"1></a>").is_err());
        assert!(well_formed("<a><b/></a>").is_ok());
    }

    fn sample() -> Chart {
        Chart::new("R − 1 <vs> P & theory")
            .x("pool size P", Scale::Log)
            .y("R − 1", Scale::Log)
            .series(Series::line(
                "random",
                vec![(2.0, 1.5), (8.0, 0.6), (64.0, 0.1)],
            ))
            .series(Series::line(
                "vrsp",
                vec![(2.0, 0.01), (8.0, 0.0), (64.0, 0.002)],
            ))
            .series(Series::line("LLN bound", vec![(2.0, 2.0), (64.0, 0.05)]).dashed())
    }

    #[test]
    fn renders_well_formed_svg_with_legend_and_escaped_text() {
        let svg = sample().render();
        let names = well_formed(&svg).unwrap();
        assert_eq!(names[0], "svg");
        assert!(svg.contains("R − 1 &lt;vs&gt; P &amp; theory"));
        for s in ["random", "vrsp", "LLN bound"] {
            assert!(svg.contains(&format!(">{s}</text>")), "legend lacks {s}");
        }
        assert_eq!(svg.matches("stroke-dasharray").count(), 2); // line + legend
                                                                // The zero R − 1 point is left out and counted; vrsp breaks into two runs of one
                                                                // point each, so it draws no polyline, only two circles.
        assert!(svg.contains("1 point(s) not drawable"));
        assert_eq!(svg.matches("<polyline").count(), 2);
        assert_eq!(svg.matches("<circle").count(), 3 + 2 + 2);
    }

    #[test]
    fn a_long_legend_widens_the_document_not_the_plot() {
        let short = sample();
        let mut long = sample();
        long.series[0].name = "wlbllm · nvl72 · libra-256k (a long legend name)".into();
        assert_eq!(short.frame().plot, long.frame().plot);
        let width = |svg: &str| -> f64 {
            let at = svg.find("width=\"").unwrap() + 7;
            svg[at..].split('"').next().unwrap().parse().unwrap()
        };
        let (ws, wl) = (width(&short.render()), width(&long.render()));
        assert_eq!(ws, short.width);
        // 36 px line + 10 px gap + 7 px per character must fit right of the plot.
        let chars = long.series[0].name.chars().count() as f64;
        assert!(wl - long.frame().plot.2 >= 46.0 + 7.0 * chars, "{wl}");
    }

    #[test]
    fn points_land_where_the_scale_says() {
        let c = sample();
        let f = c.frame();
        // Log x over whole decades [1, 100]; log y over [0.001, 10].
        assert_eq!(f.x_range, (1.0, 100.0));
        assert!((f.y_range.0 - 0.001).abs() < 1e-15 && (f.y_range.1 - 10.0).abs() < 1e-12);
        let (l, t, r, b) = f.plot;
        assert!((f.px(1.0) - l).abs() < 1e-9 && (f.px(100.0) - r).abs() < 1e-9);
        assert!((f.px(10.0) - (l + r) / 2.0).abs() < 1e-9);
        assert!((f.py(10.0) - t).abs() < 1e-9 && (f.py(0.001) - b).abs() < 1e-9);
        // 0.1 is two decades of four above the bottom.
        assert!((f.py(0.1) - (b - 0.5 * (b - t))).abs() < 1e-9);
        // The random series' point (8, 0.6) is drawn at those coordinates.
        let svg = c.render();
        let want = format!("{:.2},{:.2}", f.px(8.0), f.py(0.6));
        assert!(svg.contains(&want), "no vertex at {want}");

        let lin = Chart::new("t")
            .series(Series::scatter("s", vec![(0.0, 0.0), (10.0, 3.0)]))
            .frame();
        assert_eq!(lin.x_range, (0.0, 10.0));
        assert_eq!(lin.y_range, (0.0, 3.0));
        assert!((lin.px(5.0) - (lin.plot.0 + lin.plot.2) / 2.0).abs() < 1e-9);
        let fixed = Chart::new("t").y_range(-1.0, 1.0).frame();
        assert_eq!(fixed.y_range, (-1.0, 1.0));
        assert!((fixed.py(0.0) - (fixed.plot.1 + fixed.plot.3) / 2.0).abs() < 1e-9);
    }

    #[test]
    fn ticks_and_labels() {
        assert_eq!(
            ticks((0.0, 10.0), Scale::Linear),
            vec![0.0, 2.0, 4.0, 6.0, 8.0, 10.0]
        );
        assert_eq!(
            ticks((1e-3, 10.0), Scale::Log),
            vec![1e-3, 1e-2, 1e-1, 1.0, 10.0]
        );
        assert_eq!(ticks((1.0, 10.0), Scale::Log), vec![1.0, 2.0, 5.0, 10.0]);
        assert_eq!(tick_label(0.5), "0.5");
        assert_eq!(tick_label(64.0), "64");
        assert_eq!(tick_label(1e-4), "1e-4");
        assert_eq!(tick_label(2.5e7), "2.50e7");
        // Custom ticks replace the automatic ones; those outside the range are dropped.
        let svg = Chart::new("t")
            .x("P", Scale::Log)
            .x_ticks(vec![2.0, 8.0, 64.0, 1000.0])
            .series(Series::line("s", vec![(2.0, 1.0), (64.0, 2.0)]))
            .render();
        for l in [">2</text>", ">8</text>", ">64</text>"] {
            assert!(svg.contains(l), "{l}");
        }
        assert!(!svg.contains(">1000</text>") && !svg.contains(">10</text>"));
        // Rings: hollow markers, also in the legend, in the colour asked for.
        let svg = Chart::new("t")
            .series(
                Series::new("paper", vec![(1.0, 1.0), (2.0, 2.0)], Mark::Ring).color(palette(1)),
            )
            .render();
        well_formed(&svg).unwrap();
        assert_eq!(svg.matches(r##"fill="none" stroke="#D55E00""##).count(), 3);
        assert!(!svg.contains("<polyline"));
        // An empty chart still renders a valid document.
        well_formed(&Chart::new("empty").x("x", Scale::Log).render()).unwrap();
    }

    #[test]
    fn grid_places_panels_with_their_own_clip_paths() {
        let grid = Grid::new("two & two")
            .columns(2)
            .panel(sample())
            .panel(Chart::new("b").series(Series::line("s", vec![(1.0, 1.0), (2.0, 2.0)])))
            .panel(Chart::new("c"));
        let svg = grid.render();
        let names = well_formed(&svg).unwrap();
        assert_eq!(names[0], "svg");
        assert!(svg.contains(">two &amp; two</text>"));
        // three panels, each clipped by its own path and referring to it
        for i in 0..3 {
            assert_eq!(svg.matches(&format!(r#"id="plot-{i}""#)).count(), 1);
            assert!(svg.contains(&format!("url(#plot-{i})")) || i == 2);
        }
        assert!(!svg.contains(r#"id="plot""#));
        // cells as large as the largest panel (the sample: 720 × 440), two per row, below
        // a 36 px title band: panel 2 starts the second row
        let (w, h) = (sample().total_width(), 440.0);
        assert_eq!(grid.origin(1), (w, 36.0));
        assert_eq!(grid.origin(2), (0.0, 36.0 + h));
        assert!(svg.contains(&format!(r#"<g transform="translate({w:.2} 36.00)">"#)));
        assert!(svg.starts_with(&format!(
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{}" height="{}""#,
            2.0 * w,
            36.0 + 2.0 * h
        )));
        // a panel draws exactly what it draws alone, inside its group
        let alone = sample().render();
        let inner: String = alone
            .lines()
            .skip(1)
            .filter(|l| *l != "</svg>")
            .collect::<Vec<_>>()
            .join("\n");
        let inner = inner
            .replace("url(#plot)", "url(#plot-0)")
            .replace(r#"id="plot""#, r#"id="plot-0""#);
        assert!(svg.contains(&inner));
    }
}
