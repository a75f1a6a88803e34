//! Importer for PyTorch-profiler Chrome traces (`torch.profiler.profile(record_shapes=True)`,
//! `export_chrome_trace`): the attention kernels a user already ran, with their durations and the
//! input shapes of the ATen operator that launched them — raw material for calibrating the
//! kernel-efficiency table without re-running anything.
//!
//! A GPU kernel event (`cat == "kernel"`) carries `args["External id"]`, the id of the CPU
//! operator (`cat == "cpu_op"`) that launched it; that operator carries `args["Input Dims"]`.

use std::collections::HashMap;

use serde_json::Value;

use crate::error::{parse_error, Error};

/// One GPU kernel from the trace, joined with its launching operator.
#[derive(Clone, Debug, PartialEq)]
pub struct KernelEvent {
    /// Kernel (device function) name.
    pub name: String,
    /// Start, microseconds on the trace clock.
    pub ts_us: f64,
    /// Duration in microseconds.
    pub dur_us: f64,
    /// Name of the launching CPU operator (e.g. `aten::_flash_attention_forward`), if found.
    pub op: Option<String>,
    /// The operator's `Input Dims` (one list per input; empty lists for non-tensors).
    pub input_dims: Vec<Vec<i64>>,
}

/// Parses a Chrome trace and returns every GPU kernel whose name contains `name_filter`
/// (case-insensitive; empty = all kernels), in trace order of start time.
pub fn parse_kernels(json: &str, name_filter: &str) -> Result<Vec<KernelEvent>, Error> {
    let root: Value = serde_json::from_str(json).map_err(|e| parse_error("chrome trace", e))?;
    let events = root
        .get("traceEvents")
        .and_then(Value::as_array)
        .ok_or_else(|| parse_error("chrome trace", "no `traceEvents` array"))?;
    let ext_id = |e: &Value| {
        e.get("args")
            .and_then(|a| a.get("External id"))
            .and_then(Value::as_i64)
    };
    let mut ops: HashMap<i64, (String, Vec<Vec<i64>>)> = HashMap::new();
    for e in events {
        if e.get("cat").and_then(Value::as_str) != Some("cpu_op") {
            continue;
        }
        let (Some(id), Some(name)) = (ext_id(e), e.get("name").and_then(Value::as_str)) else {
            continue;
        };
        let dims = e
            .get("args")
            .and_then(|a| a.get("Input Dims"))
            .and_then(Value::as_array)
            .map(|lists| {
                lists
                    .iter()
                    .map(|l| {
                        l.as_array()
                            .map(|xs| xs.iter().filter_map(Value::as_i64).collect())
                            .unwrap_or_default()
                    })
                    .collect()
            })
            .unwrap_or_default();
        ops.insert(id, (name.to_string(), dims));
    }
    let filter = name_filter.to_lowercase();
    let mut out = Vec::new();
    for (i, e) in events.iter().enumerate() {
        if e.get("cat").and_then(Value::as_str) != Some("kernel") {
            continue;
        }
        let name = e
            .get("name")
            .and_then(Value::as_str)
            .ok_or_else(|| parse_error(format!("traceEvents[{i}]"), "kernel without a name"))?;
        if !name.to_lowercase().contains(&filter) {
            continue;
        }
        let num = |k: &str| {
            e.get(k).and_then(Value::as_f64).ok_or_else(|| {
                parse_error(
                    format!("traceEvents[{i}] ({name})"),
                    format!("no numeric `{k}`"),
                )
            })
        };
        let (ts_us, dur_us) = (num("ts")?, num("dur")?);
        let (op, input_dims) = match ext_id(e).and_then(|id| ops.get(&id)) {
            Some((n, d)) => (Some(n.clone()), d.clone()),
            None => (None, Vec::new()),
        };
        out.push(KernelEvent {
            name: name.to_string(),
            ts_us,
            dur_us,
            op,
            input_dims,
        });
    }
    out.sort_by(|a, b| a.ts_us.total_cmp(&b.ts_us));
    Ok(out)
}

impl KernelEvent {
    /// Causal-attention FLOPs of a FlashAttention forward kernel launched by
    /// `aten::_flash_attention_forward`, whose first input is the query `[batch, seq, heads,
    /// head_dim]`: `4·d·h·b·l(l+1)/2` (the count of the reference CSV). `None` for another
    /// operator or shape.
    pub fn causal_flash_fwd_flops(&self) -> Option<f64> {
        if self.op.as_deref() != Some("aten::_flash_attention_forward") {
            return None;
        }
        match self.input_dims.first()?.as_slice() {
            &[b, l, h, d] if b > 0 && l > 0 && h > 0 && d > 0 => {
                let (b, l, h, d) = (b as f64, l as f64, h as f64, d as f64);
                Some(4.0 * d * h * b * l * (l + 1.0) / 2.0)
            }
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn joins_kernels_to_their_operator_shapes() {
        let json = r#"{"traceEvents": [
          {"ph":"X","cat":"cpu_op","name":"aten::_flash_attention_forward","ts":1,"dur":9,
           "args":{"External id":7,"Input Dims":[[2,1024,32,128],[2,1024,32,128],[],[]]}},
          {"ph":"X","cat":"kernel","name":"void pytorch_flash::flash_fwd_kernel<X>","ts":5,"dur":42.5,
           "args":{"External id":7,"correlation":99}},
          {"ph":"X","cat":"kernel","name":"elementwise_kernel","ts":3,"dur":1.0,"args":{"External id":8}},
          {"ph":"X","cat":"kernel","name":"flash_fwd_orphan","ts":2,"dur":3.0,"args":{}}
        ]}"#;
        let k = parse_kernels(json, "FLASH").unwrap();
        assert_eq!(k.len(), 2);
        assert_eq!(k[0].name, "flash_fwd_orphan");
        assert_eq!(k[0].op, None);
        assert_eq!(k[1].dur_us, 42.5);
        assert_eq!(k[1].op.as_deref(), Some("aten::_flash_attention_forward"));
        assert_eq!(k[1].input_dims[0], vec![2, 1024, 32, 128]);
        assert!(k[1].input_dims[2].is_empty());
        assert_eq!(parse_kernels(json, "").unwrap().len(), 3);
        // 4·128·32·2·1024·1025/2
        assert_eq!(
            k[1].causal_flash_fwd_flops(),
            Some(4.0 * 128.0 * 32.0 * 2.0 * 1024.0 * 1025.0 / 2.0)
        );
        assert_eq!(k[0].causal_flash_fwd_flops(), None);
    }

    #[test]
    fn malformed_traces_are_errors_not_panics() {
        assert!(parse_kernels("{", "").is_err());
        assert!(parse_kernels("{\"x\":1}", "")
            .unwrap_err()
            .to_string()
            .contains("traceEvents"));
        let bad = r#"{"traceEvents":[{"cat":"kernel","name":"k","ts":"a","dur":1}]}"#;
        assert!(parse_kernels(bad, "")
            .unwrap_err()
            .to_string()
            .contains("ts"));
    }
}
