//! Aligned plain-text tables for human output.

/// Column alignment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Align {
    /// Pad on the right.
    Left,
    /// Pad on the left (numbers).
    Right,
}

/// Renders `rows` under `headers` with columns padded to their widest cell (counted in
/// characters), two spaces between columns, no trailing spaces.
pub fn render(headers: &[(&str, Align)], rows: &[Vec<String>]) -> String {
    let n = headers.len();
    let mut w: Vec<usize> = headers.iter().map(|(h, _)| h.chars().count()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate().take(n) {
            w[i] = w[i].max(c.chars().count());
        }
    }
    let mut out = String::new();
    let mut line = |cells: &mut dyn Iterator<Item = &str>| {
        let mut s = String::new();
        for (i, c) in cells.enumerate().take(n) {
            if i > 0 {
                s.push_str("  ");
            }
            let pad = w[i].saturating_sub(c.chars().count());
            match headers[i].1 {
                Align::Left => {
                    s.push_str(c);
                    s.push_str(&" ".repeat(pad));
                }
                Align::Right => {
                    s.push_str(&" ".repeat(pad));
                    s.push_str(c);
                }
            }
        }
        out.push_str(s.trim_end());
        out.push('\n');
    };
    line(&mut headers.iter().map(|(h, _)| *h));
    for r in rows {
        line(&mut r.iter().map(String::as_str));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligns_columns() {
        let t = render(
            &[
                ("NAME", Align::Left),
                ("N", Align::Right),
                ("NOTE", Align::Left),
            ],
            &[
                vec!["a".into(), "1".into(), "x".into()],
                vec!["longer".into(), "1234".into(), "".into()],
            ],
        );
        assert_eq!(t, "NAME       N  NOTE\na          1  x\nlonger  1234\n");
    }
}
