//! Tables: one header row and string cells, rendered as aligned text (for a terminal), as
//! GitHub Markdown (for summary.md) or as CSV (RFC 4180 quoting). Returns strings; the
//! caller writes files.

/// A table of strings.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Table {
    /// Column names.
    pub headers: Vec<String>,
    /// Cells, row by row (as many as the headers).
    pub rows: Vec<Vec<String>>,
}

impl Table {
    /// An empty table with these column names.
    pub fn new<S: Into<String>>(headers: impl IntoIterator<Item = S>) -> Table {
        Table {
            headers: headers.into_iter().map(Into::into).collect(),
            rows: Vec::new(),
        }
    }

    /// Appends a row (short rows are padded with empty cells when rendered).
    pub fn row<S: Into<String>>(&mut self, cells: impl IntoIterator<Item = S>) {
        self.rows.push(cells.into_iter().map(Into::into).collect());
    }

    fn cell(&self, r: &[String], c: usize) -> String {
        r.get(c).cloned().unwrap_or_default()
    }

    /// A column is numeric (right-aligned) when it has rows and every cell parses as a number.
    fn numeric(&self, c: usize) -> bool {
        !self.rows.is_empty() && self.rows.iter().all(|r| looks_numeric(&self.cell(r, c)))
    }

    fn widths(&self) -> Vec<usize> {
        (0..self.headers.len())
            .map(|c| {
                self.rows
                    .iter()
                    .map(|r| self.cell(r, c).chars().count())
                    .chain([self.headers[c].chars().count()])
                    .max()
                    .unwrap_or(0)
            })
            .collect()
    }

    /// Columns padded to a common width, numbers right-aligned, a dashed rule under the
    /// header.
    pub fn to_text(&self) -> String {
        let w = self.widths();
        let num: Vec<bool> = (0..w.len()).map(|c| self.numeric(c)).collect();
        let line = |cells: Vec<String>| {
            let parts: Vec<String> = cells
                .iter()
                .enumerate()
                .map(|(c, s)| {
                    let pad = w[c].saturating_sub(s.chars().count());
                    if num[c] {
                        format!("{}{s}", " ".repeat(pad))
                    } else {
                        format!("{s}{}", " ".repeat(pad))
                    }
                })
                .collect();
            parts.join("  ").trim_end().to_string() + "\n"
        };
        let mut o = line(self.headers.clone());
        o += &line(w.iter().map(|&n| "-".repeat(n)).collect());
        for r in &self.rows {
            o += &line((0..w.len()).map(|c| self.cell(r, c)).collect());
        }
        o
    }

    /// A GitHub Markdown table.
    pub fn to_markdown(&self) -> String {
        let esc = |s: &str| s.replace('|', "\\|");
        let mut o = format!(
            "| {} |\n|{}|\n",
            self.headers
                .iter()
                .map(|h| esc(h))
                .collect::<Vec<_>>()
                .join(" | "),
            self.headers
                .iter()
                .enumerate()
                .map(|(c, _)| if self.numeric(c) { "---:" } else { "---" })
                .collect::<Vec<_>>()
                .join("|")
        );
        for r in &self.rows {
            let cells: Vec<String> = (0..self.headers.len())
                .map(|c| esc(&self.cell(r, c)))
                .collect();
            o += &format!("| {} |\n", cells.join(" | "));
        }
        o
    }

    /// CSV with a header line; cells holding `,`, `"` or a line break are quoted.
    pub fn to_csv(&self) -> String {
        let q = |s: &str| {
            if s.contains([',', '"', '\n', '\r']) {
                format!("\"{}\"", s.replace('"', "\"\""))
            } else {
                s.to_string()
            }
        };
        let mut o = String::new();
        let mut emit = |cells: Vec<String>| {
            o += &cells.iter().map(|s| q(s)).collect::<Vec<_>>().join(",");
            o.push('\n');
        };
        emit(self.headers.clone());
        for r in &self.rows {
            emit((0..self.headers.len()).map(|c| self.cell(r, c)).collect());
        }
        o
    }
}

fn looks_numeric(s: &str) -> bool {
    !s.is_empty() && s.parse::<f64>().is_ok()
}

/// A float with `digits` significant digits, without exponent for ordinary magnitudes
/// (tables must print the same bytes on every machine: this only uses Rust's formatting).
pub fn sig(v: f64, digits: usize) -> String {
    if !v.is_finite() {
        return format!("{v}");
    }
    if v == 0.0 {
        return "0".into();
    }
    let mag = v.abs().log10().floor() as i32;
    if !(-5..15).contains(&mag) {
        return format!("{:.*e}", digits.saturating_sub(1), v);
    }
    let decimals = (digits as i32 - 1 - mag).max(0) as usize;
    format!("{v:.decimals$}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t() -> Table {
        let mut t = Table::new(["P", "policy", "R-1"]);
        t.row(["8", "random", "1.077"]);
        t.row(["64", "a,\"b\"", "0.09"]);
        t
    }

    #[test]
    fn text_markdown_csv_by_hand() {
        assert_eq!(
            t().to_text(),
            " P  policy    R-1\n--  ------  -----\n 8  random  1.077\n64  a,\"b\"    0.09\n"
        );
        assert_eq!(
            t().to_csv(),
            "P,policy,R-1\n8,random,1.077\n64,\"a,\"\"b\"\"\",0.09\n"
        );
        assert_eq!(
            t().to_markdown(),
            "| P | policy | R-1 |\n|---:|---|---:|\n| 8 | random | 1.077 |\n| 64 | a,\"b\" | 0.09 |\n"
        );
        // The csv crate reads back what we wrote.
        let csv_text = t().to_csv();
        let mut rd = csv::Reader::from_reader(csv_text.as_bytes());
        let rows: Vec<csv::StringRecord> = rd.records().map(|r| r.unwrap()).collect();
        assert_eq!(&rows[1][1], "a,\"b\"");
    }

    #[test]
    fn significant_digits() {
        assert_eq!(sig(1.07749, 4), "1.077");
        assert_eq!(sig(0.0050123, 3), "0.00501");
        assert_eq!(sig(123456.0, 3), "123456");
        assert_eq!(sig(0.0, 3), "0");
        assert_eq!(sig(1.5e-7, 2), "1.5e-7");
    }
}
