//! C `printf`-compatible number formatting (`%g`, `%e`, `%.Nf`) and nccl-tests' "fit a
//! number into a column" rule. Pure functions, no I/O.

/// `%.{prec}e` as C prints it: mantissa, `e`, sign, at least two exponent digits.
pub fn c_exp(value: f64, prec: usize) -> String {
    if !value.is_finite() {
        return c_nonfinite(value);
    }
    let s = format!("{value:.prec$e}");
    // Rust prints e.g. "1.5e5" / "-1.5e-7"; C wants "1.5e+05" / "-1.5e-07".
    match s.split_once('e') {
        Some((mant, exp)) => {
            let (sign, digits) = match exp.strip_prefix('-') {
                Some(d) => ('-', d),
                None => ('+', exp),
            };
            let digits = if digits.len() < 2 {
                format!("0{digits}")
            } else {
                digits.to_string()
            };
            format!("{mant}e{sign}{digits}")
        }
        None => s,
    }
}

fn c_nonfinite(value: f64) -> String {
    if value.is_nan() {
        if value.is_sign_negative() {
            "-nan".to_string()
        } else {
            "nan".to_string()
        }
    } else if value > 0.0 {
        "inf".to_string()
    } else {
        "-inf".to_string()
    }
}

/// `%.{prec}f` as C prints it.
pub fn c_fixed(value: f64, prec: usize) -> String {
    if !value.is_finite() {
        return c_nonfinite(value);
    }
    format!("{value:.prec$}")
}

/// `%g` (precision 6) as C prints it.
pub fn c_g(value: f64) -> String {
    c_g_prec(value, 6)
}

/// `%.{prec}g` as C prints it.
pub fn c_g_prec(value: f64, prec: usize) -> String {
    if !value.is_finite() {
        return c_nonfinite(value);
    }
    let p = prec.max(1);
    if value == 0.0 {
        return if value.is_sign_negative() {
            "-0".to_string()
        } else {
            "0".to_string()
        };
    }
    // The exponent after rounding to p significant digits decides the style.
    let e_form = format!("{value:.prec$e}", prec = p - 1);
    let exp: i64 = e_form
        .split_once('e')
        .and_then(|(_, e)| e.parse().ok())
        .unwrap_or(0);
    if exp < -4 || exp >= p as i64 {
        let s = c_exp(value, p - 1);
        match s.split_once('e') {
            Some((mant, rest)) => format!("{}e{}", strip_zeros(mant), rest),
            None => s,
        }
    } else {
        let decimals = (p as i64 - 1 - exp).max(0) as usize;
        strip_zeros(&c_fixed(value, decimals))
    }
}

fn strip_zeros(s: &str) -> String {
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s.to_string()
    }
}

/// Right-justifies `s` in `width` columns (`%*s`); longer strings are kept whole.
pub fn pad(s: &str, width: usize) -> String {
    format!("{s:>width$}")
}

/// nccl-tests' column rule: count the integer digits of `value` (0 below 1), then print
/// with 2 decimals if that leaves room, else 1, else 0, else in exponent form, right
/// justified in `width` columns (the exponent form is `%.1e` for widths of 7 or more and
/// `%.0e` below).
pub fn fit(value: f64, width: usize) -> String {
    let mut power: usize = 0;
    let mut bound = 1.0f64;
    // `value >= bound` is false for NaN, which then prints as "nan" like C.
    while value >= bound && power < 400 {
        power += 1;
        bound *= 10.0;
    }
    let w = width;
    let s = if power + 2 < w {
        c_fixed(value, 2)
    } else if power + 1 < w {
        c_fixed(value, 1)
    } else if power < w + 1 {
        c_fixed(value, 0)
    } else if w >= 7 {
        c_exp(value, 1)
    } else {
        c_exp(value, 0)
    };
    pad(&s, w)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn g_matches_c() {
        // Values checked against glibc printf("%g").
        let cases: &[(f64, &str)] = &[
            (0.0, "0"),
            (1.0, "1"),
            (123.456, "123.456"),
            (123.4567, "123.457"),
            (1e6, "1e+06"),
            (999999.0, "999999"),
            (9999995.0, "1e+07"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (12.5, "12.5"),
            (-3.25, "-3.25"),
            (2.0e-7, "2e-07"),
            (1234567.0, "1.23457e+06"),
            (100.0, "100"),
        ];
        for (v, want) in cases {
            assert_eq!(c_g(*v), *want, "{v}");
        }
        assert_eq!(c_g(f64::NAN), "nan");
        assert_eq!(c_g(f64::INFINITY), "inf");
    }

    #[test]
    fn exp_matches_c() {
        assert_eq!(c_exp(123456.0, 1), "1.2e+05");
        assert_eq!(c_exp(1e100, 1), "1.0e+100");
        assert_eq!(c_exp(0.000123, 0), "1e-04");
        assert_eq!(c_exp(-5.0, 2), "-5.00e+00");
    }

    #[test]
    fn fit_time_column() {
        assert_eq!(fit(0.0, 7), "   0.00");
        assert_eq!(fit(12.345, 7), "  12.35");
        assert_eq!(fit(9999.994, 7), "9999.99");
        assert_eq!(fit(10000.0, 7), "10000.0");
        assert_eq!(fit(99999.94, 7), "99999.9");
        assert_eq!(fit(100000.0, 7), " 100000");
        assert_eq!(fit(9999999.0, 7), "9999999");
        assert_eq!(fit(10000000.0, 7), "1.0e+07");
        assert_eq!(fit(123456789.0, 7), "1.2e+08");
    }

    #[test]
    fn fit_bandwidth_column() {
        assert_eq!(fit(0.0, 6), "  0.00");
        assert_eq!(fit(0.004, 6), "  0.00");
        assert_eq!(fit(5.5, 6), "  5.50");
        assert_eq!(fit(999.99, 6), "999.99");
        assert_eq!(fit(1000.0, 6), "1000.0");
        assert_eq!(fit(9999.9, 6), "9999.9");
        assert_eq!(fit(10000.0, 6), " 10000");
        assert_eq!(fit(999999.0, 6), "999999");
        assert_eq!(fit(1000000.0, 6), " 1e+06");
        assert_eq!(fit(f64::NAN, 6), "   nan");
    }
}
