//! Corpora: sources of document lengths in tokens.
//!
//! A corpus is either a *trace* (a list of real document lengths, read in arrival order)
//! or a *distribution* (lognormal, Pareto, fixed, or a weighted mixture of these). Built-in
//! named corpora ship in `traces/` (see `traces/README.md` for provenance and fit errors).
//!
//! # Spec grammar
//!
//! ```text
//! spec      := mixture | component
//! mixture   := weight '*' component ('+' weight '*' component)*
//! component := kind [':' key '=' value (',' key '=' value)*]
//! kind      := wlbllm | libra-256k | libra-1m | lognormal | pareto | fixed
//! ```
//!
//! `lognormal:mu=..,sigma=..` or `lognormal:median=..,p99=..` (fitted: μ = ln median,
//! σ = (ln p99 − μ)/z₀.₉₉), `pareto:scale=..,shape=..` (x_m and α), `fixed:N`
//! (or `fixed:len=N`). Every component takes `max=N`, which caps each length at N tokens.
//!
//! # Determinism
//!
//! [`Corpus::documents`] is a pure function of `(corpus, seed, trial)`. A distribution draws
//! i.i.d. lengths from `rng::stream(seed, "corpus-docs", trial)`; a trace is read in its
//! arrival order (a production loader's order) starting at an offset drawn from
//! `rng::stream(seed, "corpus-offset", trial)` and wrapping around, so different trials see
//! different windows of the same real order.
//!
//! No I/O: trace *bytes* are parsed here ([`Corpus::from_trace`]); files are read by the CLI.

use std::io::Read;
use std::sync::Arc;

use rand::Rng as _;
use rand_distr::{Distribution, LogNormal, Pareto};

use crate::error::{invalid, parse_error, Result};
use crate::rng::{self, Rng};

/// The standard normal quantile at 0.99, used to fit a lognormal from its median and p99.
pub const Z99: f64 = 2.326_347_874_040_841;

/// How far a mixture's weights may sum from 1 (decimal rounding of the weights).
const MIXTURE_SUM_TOLERANCE: f64 = 1e-6;

/// Names of the built-in corpora.
pub const BUILTIN: &[&str] = &["wlbllm", "libra-256k", "libra-1m"];

/// Bytes of a trace, read and once decompressed: 128 MiB holds tens of millions of
/// document lengths (the built-in `wlbllm` trace is 582 KB), and bounds a gzip bomb.
pub const MAX_TRACE_BYTES: u64 = 128 << 20;

const WLBLLM_JSON: &str = include_str!("../../traces/wlbllm.json");

/// A parametric distribution of document lengths.
#[derive(Clone, Debug, PartialEq)]
pub enum LengthDist {
    /// ln(length) ~ N(mu, sigma²).
    LogNormal {
        /// Mean of ln(length).
        mu: f64,
        /// Standard deviation of ln(length).
        sigma: f64,
    },
    /// Pareto with scale x_m and shape α (heavier tail for smaller α).
    Pareto {
        /// The minimum length x_m.
        scale: f64,
        /// The tail index α.
        shape: f64,
    },
    /// Every document has the same length.
    Fixed(u32),
}

/// One component of a corpus: a trace or a distribution, with an optional cap.
#[derive(Clone, Debug)]
enum Source {
    Trace(Arc<[u32]>),
    Dist(LengthDist),
}

#[derive(Clone, Debug)]
struct Component {
    source: Source,
    max: Option<u32>,
}

/// A source of document lengths in tokens.
#[derive(Clone, Debug)]
pub struct Corpus {
    name: String,
    /// (cumulative weight, component); one entry with weight 1 unless a mixture.
    parts: Vec<(f64, Component)>,
    default_seq_len: Option<u32>,
}

impl Corpus {
    /// A built-in corpus name or a parametric spec (see the module docs).
    pub fn from_spec(spec: &str) -> Result<Corpus> {
        let spec = spec.trim();
        if spec.is_empty() {
            return Err(invalid(
                "corpus",
                "\"\"",
                format!(
                    "a built-in name ({}), a parametric spec or a trace file",
                    BUILTIN.join(", ")
                ),
            ));
        }
        let mut default_seq_len = None;
        let parts = if spec.contains('*') {
            let mut parts = Vec::new();
            let mut total = 0.0;
            for term in spec.split('+') {
                let (w, comp) = term
                    .split_once('*')
                    .filter(|(_, comp)| !comp.contains('*'))
                    .ok_or_else(|| {
                        invalid(
                            "corpus mixture term",
                            term.trim(),
                            "WEIGHT*COMPONENT with one weight, e.g. 0.3*fixed:4096",
                        )
                    })?;
                let w: f64 = w
                    .trim()
                    .parse()
                    .map_err(|_| invalid("corpus mixture weight", w.trim(), "a number ≥ 0"))?;
                if !(w >= 0.0 && w.is_finite()) {
                    return Err(invalid("corpus mixture weight", w, "a finite number ≥ 0"));
                }
                total += w;
                parts.push((total, parse_component(comp.trim())?.0));
            }
            if (total - 1.0).abs() > MIXTURE_SUM_TOLERANCE {
                return Err(invalid(
                    "corpus mixture weights",
                    format!("sum {total}"),
                    "weights that sum to 1 (within 1e-6), e.g. 0.75*fixed:10+0.25*fixed:20",
                ));
            }
            for p in &mut parts {
                p.0 /= total;
            }
            parts
        } else {
            let (comp, seq_len) = parse_component(spec)?;
            default_seq_len = seq_len;
            vec![(1.0, comp)]
        };
        Ok(Corpus {
            name: spec.to_string(),
            parts,
            default_seq_len,
        })
    }

    /// A trace: the bytes of a JSON list of integers, a CSV with a `length` column, or one
    /// integer per line (blank lines and `#` comments skipped); gzip is detected by its magic
    /// number. `name` is used in messages (the file name).
    pub fn from_trace(name: &str, bytes: &[u8]) -> Result<Corpus> {
        let lengths = parse_trace(name, bytes)?;
        Ok(Corpus {
            name: name.to_string(),
            parts: vec![(
                1.0,
                Component {
                    source: Source::Trace(lengths.into()),
                    max: None,
                },
            )],
            default_seq_len: None,
        })
    }

    /// The corpus's name: the spec or the trace's file name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The sequence length a built-in corpus was measured at (256K, 1M), if any.
    pub fn default_seq_len(&self) -> Option<u32> {
        self.default_seq_len
    }

    /// The trace's lengths when the corpus is a single uncapped trace.
    pub fn trace(&self) -> Option<&[u32]> {
        match self.parts.as_slice() {
            [(
                _,
                Component {
                    source: Source::Trace(t),
                    max: None,
                },
            )] => Some(t),
            _ => None,
        }
    }

    /// An endless, deterministic stream of document lengths for `(seed, trial)`.
    pub fn documents(&self, seed: u64, trial: u64) -> Documents<'_> {
        let mut offset_rng = rng::stream(seed, "corpus-offset", trial);
        let cursors = self
            .parts
            .iter()
            .map(|(_, c)| match &c.source {
                Source::Trace(t) => offset_rng.random_range(0..t.len()),
                Source::Dist(_) => 0,
            })
            .collect();
        Documents {
            corpus: self,
            rng: rng::stream(seed, "corpus-docs", trial),
            cursors,
        }
    }
}

/// The iterator of [`Corpus::documents`].
pub struct Documents<'a> {
    corpus: &'a Corpus,
    rng: Rng,
    cursors: Vec<usize>,
}

impl Iterator for Documents<'_> {
    type Item = u32;

    fn next(&mut self) -> Option<u32> {
        let parts = &self.corpus.parts;
        let i = if parts.len() == 1 {
            0
        } else {
            let u: f64 = self.rng.random();
            parts
                .iter()
                .position(|(cum, _)| u < *cum)
                .unwrap_or(parts.len() - 1)
        };
        let comp = &parts[i].1;
        let len = match &comp.source {
            Source::Trace(t) => {
                let len = t[self.cursors[i]];
                self.cursors[i] = (self.cursors[i] + 1) % t.len();
                len
            }
            Source::Dist(d) => d.sample(&mut self.rng),
        };
        Some(comp.max.map_or(len, |m| len.min(m)))
    }
}

impl LengthDist {
    /// One length, rounded to the nearest token and at least 1.
    pub fn sample(&self, rng: &mut Rng) -> u32 {
        let x = match *self {
            LengthDist::LogNormal { mu, sigma } => match LogNormal::new(mu, sigma) {
                Ok(d) => d.sample(rng),
                Err(_) => mu.exp(),
            },
            LengthDist::Pareto { scale, shape } => match Pareto::new(scale, shape) {
                Ok(d) => d.sample(rng),
                Err(_) => scale,
            },
            LengthDist::Fixed(n) => return n,
        };
        x.round().clamp(1.0, f64::from(u32::MAX)) as u32
    }

    /// Lognormal fitted to a median and a p99: μ = ln median, σ = (ln p99 − μ)/z₀.₉₉.
    pub fn lognormal_from_quantiles(median: f64, p99: f64) -> Result<LengthDist> {
        if !(median >= 1.0 && median.is_finite()) {
            return Err(invalid("median", median, "a length ≥ 1 token"));
        }
        if !(p99 > median && p99.is_finite()) {
            return Err(invalid("p99", p99, format!("a length > median ({median})")));
        }
        let mu = median.ln();
        Ok(LengthDist::LogNormal {
            mu,
            sigma: (p99.ln() - mu) / Z99,
        })
    }
}

/// Parse `kind[:k=v,...]`; returns the component and, for built-ins, their sequence length.
fn parse_component(spec: &str) -> Result<(Component, Option<u32>)> {
    let (kind, params) = match spec.split_once(':') {
        Some((k, p)) => (k.trim(), p.trim()),
        None => (spec.trim(), ""),
    };
    let mut kv: Vec<(&str, &str)> = Vec::new();
    if !params.is_empty() {
        for item in params.split(',') {
            match item.split_once('=') {
                Some((k, v)) => kv.push((k.trim(), v.trim())),
                // `fixed:4096` is the one positional form.
                None if kind == "fixed" => kv.push(("len", item.trim())),
                None => {
                    return Err(invalid(
                        format!("{kind} parameter"),
                        item.trim(),
                        "KEY=VALUE",
                    ))
                }
            }
        }
    }
    let mut take = |key: &str| -> Option<&str> {
        let pos = kv.iter().position(|(k, _)| *k == key)?;
        Some(kv.remove(pos).1)
    };
    let max = take("max").map(|v| parse_len(kind, "max", v)).transpose()?;
    let (source, seq_len) = match kind {
        "wlbllm" => (Source::Trace(builtin_wlbllm()?), None),
        "libra-256k" => (Source::Dist(libra_256k()), Some(262_144)),
        "libra-1m" => (Source::Dist(libra_1m()), Some(1_048_576)),
        "lognormal" => {
            let mu = take("mu");
            let sigma = take("sigma");
            let median = take("median");
            let p99 = take("p99");
            let dist = match (mu, sigma, median, p99) {
                (Some(mu), Some(sigma), None, None) => {
                    let mu = parse_f64(kind, "mu", mu)?;
                    let sigma = parse_f64(kind, "sigma", sigma)?;
                    if sigma <= 0.0 {
                        return Err(invalid("lognormal sigma", sigma, "a number > 0"));
                    }
                    LengthDist::LogNormal { mu, sigma }
                }
                (None, None, Some(median), Some(p99)) => LengthDist::lognormal_from_quantiles(
                    parse_f64(kind, "median", median)?,
                    parse_f64(kind, "p99", p99)?,
                )?,
                _ => {
                    return Err(invalid(
                        "lognormal parameters",
                        params,
                        "either mu=..,sigma=.. or median=..,p99=.. (plus optional max=..)",
                    ))
                }
            };
            (Source::Dist(dist), None)
        }
        "pareto" => {
            let (Some(scale), Some(shape)) = (take("scale"), take("shape")) else {
                return Err(invalid(
                    "pareto parameters",
                    params,
                    "scale=X_MIN,shape=ALPHA (plus optional max=..)",
                ));
            };
            let scale = parse_f64(kind, "scale", scale)?;
            let shape = parse_f64(kind, "shape", shape)?;
            if scale < 1.0 {
                return Err(invalid("pareto scale", scale, "a length ≥ 1 token"));
            }
            if shape <= 0.0 {
                return Err(invalid("pareto shape", shape, "a number > 0"));
            }
            (Source::Dist(LengthDist::Pareto { scale, shape }), None)
        }
        "fixed" => {
            let len = take("len").ok_or_else(|| invalid("fixed", params, "fixed:N with N ≥ 1"))?;
            (Source::Dist(LengthDist::Fixed(parse_len(kind, "len", len)?)), None)
        }
        other => {
            return Err(invalid(
                "corpus",
                other,
                format!(
                    "a built-in name ({}), lognormal:…, pareto:…, fixed:N, a WEIGHT*SPEC+… mixture, or an existing trace file",
                    BUILTIN.join(", ")
                ),
            ))
        }
    };
    if let Some((k, _)) = kv.first() {
        return Err(invalid(format!("{kind} parameter"), k, allowed_keys(kind)));
    }
    // The Libra corpora's tails reach the sequence length and stop there.
    let max = max.or(seq_len);
    Ok((Component { source, max }, seq_len))
}

fn allowed_keys(kind: &str) -> &'static str {
    match kind {
        "lognormal" => "one of mu, sigma, median, p99, max",
        "pareto" => "one of scale, shape, max",
        "fixed" => "one of len, max",
        _ => "max",
    }
}

fn parse_f64(kind: &str, key: &str, v: &str) -> Result<f64> {
    match v.parse::<f64>() {
        Ok(x) if x.is_finite() => Ok(x),
        _ => Err(invalid(format!("{kind} {key}"), v, "a finite number")),
    }
}

fn parse_len(kind: &str, key: &str, v: &str) -> Result<u32> {
    match v.parse::<u32>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(invalid(
            format!("{kind} {key}"),
            v,
            "an integer number of tokens ≥ 1",
        )),
    }
}

fn builtin_wlbllm() -> Result<Arc<[u32]>> {
    Ok(parse_trace("traces/wlbllm.json (built in)", WLBLLM_JSON.as_bytes())?.into())
}

/// `libra-256k`: lognormal fitted to the Libra paper's 256K corpus (median ≈ 607 tokens,
/// p99 ≈ 33K); lengths capped at the 256K sequence length. Fit and errors: traces/README.md.
fn libra_256k() -> LengthDist {
    LengthDist::LogNormal {
        mu: 607f64.ln(),
        sigma: (33_000f64.ln() - 607f64.ln()) / Z99,
    }
}

/// `libra-1m`: lognormal fitted to the Libra paper's 1M corpus (median 644, p99 71,006),
/// tail up to the 1M sequence length. Fit and errors: traces/README.md.
fn libra_1m() -> LengthDist {
    LengthDist::LogNormal {
        mu: 644f64.ln(),
        sigma: (71_006f64.ln() - 644f64.ln()) / Z99,
    }
}

/// Parse trace bytes into lengths (see [`Corpus::from_trace`]).
pub fn parse_trace(name: &str, bytes: &[u8]) -> Result<Vec<u32>> {
    let decompressed;
    let bytes = if bytes.starts_with(&[0x1f, 0x8b]) {
        let mut out = Vec::new();
        flate2::read::MultiGzDecoder::new(bytes)
            .take(MAX_TRACE_BYTES + 1)
            .read_to_end(&mut out)
            .map_err(|e| parse_error(name, format!("not a valid gzip stream: {e}")))?;
        if out.len() as u64 > MAX_TRACE_BYTES {
            return Err(parse_error(
                name,
                format!(
                    "decompresses to more than {} MiB; a trace holds at most that much text",
                    MAX_TRACE_BYTES >> 20
                ),
            ));
        }
        decompressed = out;
        &decompressed[..]
    } else {
        bytes
    };
    let text = std::str::from_utf8(bytes)
        .map_err(|e| parse_error(name, format!("not UTF-8 text: {e}")))?;
    let trimmed = text.trim_start_matches('\u{feff}').trim();
    let lengths = if trimmed.starts_with('[') {
        parse_json_list(name, trimmed)?
    } else if trimmed
        .lines()
        .next()
        .is_some_and(|l| l.chars().any(|c| c.is_ascii_alphabetic()))
    {
        parse_csv(name, trimmed)?
    } else {
        parse_lines(name, trimmed)?
    };
    if lengths.is_empty() {
        return Err(parse_error(name, "the trace holds no document lengths"));
    }
    Ok(lengths)
}

fn check_len(name: &str, at: &str, value: &str) -> Result<u32> {
    match value.trim().parse::<i128>() {
        Ok(n) if n >= 1 && n <= i128::from(u32::MAX) => Ok(n as u32),
        Ok(n) if n < 1 => Err(parse_error(
            name,
            format!("{at}: length {n}; document lengths must be ≥ 1 token"),
        )),
        Ok(n) => Err(parse_error(
            name,
            format!(
                "{at}: length {n} exceeds the largest supported length {}",
                u32::MAX
            ),
        )),
        Err(_) => Err(parse_error(
            name,
            format!("{at}: {:?} is not an integer length", value.trim()),
        )),
    }
}

fn parse_json_list(name: &str, text: &str) -> Result<Vec<u32>> {
    let values: Vec<serde_json::Value> = serde_json::from_str(text)
        .map_err(|e| parse_error(name, format!("not a JSON list of integers: {e}")))?;
    values
        .iter()
        .enumerate()
        .map(|(i, v)| check_len(name, &format!("item {i}"), &v.to_string()))
        .collect()
}

fn parse_csv(name: &str, text: &str) -> Result<Vec<u32>> {
    let mut reader = csv::ReaderBuilder::new()
        .trim(csv::Trim::All)
        .from_reader(text.as_bytes());
    let headers = reader
        .headers()
        .map_err(|e| parse_error(name, format!("unreadable CSV header: {e}")))?
        .clone();
    let col = headers
        .iter()
        .position(|h| h.eq_ignore_ascii_case("length"))
        .ok_or_else(|| {
            parse_error(
                name,
                format!(
                    "CSV header has no `length` column (found: {})",
                    headers.iter().collect::<Vec<_>>().join(", ")
                ),
            )
        })?;
    let mut out = Vec::new();
    for (i, rec) in reader.records().enumerate() {
        let rec = rec.map_err(|e| parse_error(name, format!("CSV row {}: {e}", i + 2)))?;
        let field = rec.get(col).unwrap_or("");
        out.push(check_len(name, &format!("line {}", i + 2), field)?);
    }
    Ok(out)
}

fn parse_lines(name: &str, text: &str) -> Result<Vec<u32>> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| {
            let l = l.trim();
            !l.is_empty() && !l.starts_with('#')
        })
        .map(|(i, l)| check_len(name, &format!("line {}", i + 1), l))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn draw(c: &Corpus, n: usize) -> Vec<u32> {
        c.documents(1, 0).take(n).collect()
    }

    #[test]
    fn trace_formats_agree() {
        let want = vec![5, 7, 11];
        assert_eq!(parse_trace("j", b"[5, 7, 11]").unwrap(), want);
        assert_eq!(parse_trace("l", b"5\n\n# c\n7\n11\n").unwrap(), want);
        assert_eq!(
            parse_trace("c", b"doc,length\na,5\nb,7\nc,11\n").unwrap(),
            want
        );
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        std::io::Write::write_all(&mut gz, b"[5,7,11]").unwrap();
        assert_eq!(parse_trace("g", &gz.finish().unwrap()).unwrap(), want);
    }

    #[test]
    fn bad_traces_name_the_place() {
        let e = parse_trace("t.txt", b"5\nabc\n").unwrap_err().to_string();
        assert!(
            e.contains("t.txt") && e.contains("line 2") && e.contains("abc"),
            "{e}"
        );
        let e = parse_trace("t.txt", b"5\n-3\n").unwrap_err().to_string();
        assert!(e.contains("line 2") && e.contains("≥ 1"), "{e}");
        let e = parse_trace("t.json", b"[1, 0]").unwrap_err().to_string();
        assert!(e.contains("item 1"), "{e}");
        let e = parse_trace("t.json", b"[1, 2.5]").unwrap_err().to_string();
        assert!(e.contains("item 1") && e.contains("2.5"), "{e}");
        let e = parse_trace("e", b"  \n").unwrap_err().to_string();
        assert!(e.contains("no document lengths"), "{e}");
        let e = parse_trace("c.csv", b"doc,len\na,5\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("no `length` column"), "{e}");
    }

    #[test]
    fn builtin_wlbllm_matches_its_provenance() {
        let c = Corpus::from_spec("wlbllm").unwrap();
        let t = c.trace().unwrap();
        assert_eq!(t.len(), 99_519);
        let mut s = t.to_vec();
        s.sort_unstable();
        assert_eq!(*s.last().unwrap(), 124_913);
        assert_eq!(s[s.len() / 2], 3_227);
    }

    #[test]
    fn specs_parse_and_reject() {
        assert!(matches!(
            Corpus::from_spec("fixed:4096").unwrap().parts[0].1.source,
            Source::Dist(LengthDist::Fixed(4096))
        ));
        assert_eq!(
            draw(&Corpus::from_spec("fixed:4096").unwrap(), 3),
            vec![4096; 3]
        );
        assert_eq!(
            draw(&Corpus::from_spec("fixed:4096,max=100").unwrap(), 2),
            vec![100; 2]
        );
        let c = Corpus::from_spec("lognormal:median=1000,p99=20000").unwrap();
        match c.parts[0].1.source {
            Source::Dist(LengthDist::LogNormal { mu, sigma }) => {
                assert!((mu - 1000f64.ln()).abs() < 1e-12);
                assert!((mu + sigma * Z99 - 20000f64.ln()).abs() < 1e-9);
            }
            _ => panic!("not lognormal"),
        }
        for bad in [
            "",
            "nope",
            "lognormal:mu=1",
            "lognormal:mu=1,sigma=-1",
            "lognormal:mu=1,sigma=1,foo=2",
            "pareto:scale=0,shape=1",
            "fixed:0",
            "fixed:-5",
            "0*fixed:1+0*fixed:2",
            "-1*fixed:1+2*fixed:2",
            "0.7*fixed:1+0.7*fixed:2",
            "x*fixed:1",
            "lognormal:median=100,p99=50",
        ] {
            assert!(Corpus::from_spec(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn mixture_weights_are_honoured() {
        let c = Corpus::from_spec("0.75*fixed:10 + 0.25*fixed:20").unwrap();
        let d = draw(&c, 40_000);
        let tens = d.iter().filter(|&&x| x == 10).count() as f64 / d.len() as f64;
        assert!((tens - 0.75).abs() < 0.01, "{tens}");
        assert!(d.iter().all(|&x| x == 10 || x == 20));
        // a second weight on one component is refused as the term it is
        for spec in ["1*1*fixed:10", "0.5*fixed:10+0.5*2*fixed:20"] {
            let e = Corpus::from_spec(spec).err().unwrap();
            assert!(
                matches!(&e, crate::Error::Invalid { field, allowed, .. }
                    if field == "corpus mixture term" && allowed.contains("one weight")),
                "{spec}: {e}"
            );
        }
    }

    #[test]
    fn documents_are_deterministic_per_seed_and_trial() {
        let c = Corpus::from_spec("libra-1m").unwrap();
        assert_eq!(draw(&c, 100), draw(&c, 100));
        let other: Vec<u32> = c.documents(1, 1).take(100).collect();
        assert_ne!(draw(&c, 100), other);
        let w = Corpus::from_spec("wlbllm").unwrap();
        let a: Vec<u32> = w.documents(9, 3).take(5).collect();
        let t = w.trace().unwrap();
        let start = t.iter().position(|&x| x == a[0]).unwrap();
        // A trace window is read in arrival order (from the first match of its first value).
        assert!(t.windows(5).any(|win| win == a.as_slice()), "start {start}");
    }

    #[test]
    fn lognormal_fit_lands_on_its_quantiles() {
        let c = Corpus::from_spec("lognormal:median=644,p99=71006").unwrap();
        let mut d = draw(&c, 200_000);
        d.sort_unstable();
        let med = f64::from(d[d.len() / 2]);
        let p99 = f64::from(d[d.len() * 99 / 100]);
        assert!((med / 644.0 - 1.0).abs() < 0.02, "median {med}");
        assert!((p99 / 71006.0 - 1.0).abs() < 0.05, "p99 {p99}");
    }

    mod props {
        use super::super::*;
        use proptest::prelude::*;

        proptest! {
            #[test]
            fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
                let _ = parse_trace("fuzz", &bytes);
            }

            #[test]
            fn arbitrary_specs_never_panic(spec in "[a-z0-9:=,.*+ -]{0,40}") {
                let _ = Corpus::from_spec(&spec);
            }

            #[test]
            fn every_format_round_trips(lens in proptest::collection::vec(1u32..=u32::MAX, 1..50)) {
                let json = serde_json::to_string(&lens).unwrap();
                let lines: String = lens.iter().map(|l| format!("{l}\n")).collect();
                let csv = format!("length\n{lines}");
                prop_assert_eq!(&parse_trace("j", json.as_bytes()).unwrap(), &lens);
                prop_assert_eq!(&parse_trace("l", lines.as_bytes()).unwrap(), &lens);
                prop_assert_eq!(&parse_trace("c", csv.as_bytes()).unwrap(), &lens);
            }

            #[test]
            fn zero_or_negative_lengths_are_rejected(good in 1u32..1000, bad in -1000i64..=0) {
                let text = format!("{good}\n{bad}\n");
                let msg = parse_trace("t", text.as_bytes()).unwrap_err().to_string();
                prop_assert!(msg.contains("line 2"), "{}", msg);
            }
        }
    }
}
