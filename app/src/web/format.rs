//! Numbers as the dashboard writes them, one way each: a duration in milliseconds with one
//! decimal at most (never `326.09999999999997 ms`, which is what an `f64` prints after a
//! subtraction), and a count with thousands separators (`12,480`), so that figures read at a
//! glance from the back of a room. Amounts of money are [`super::money`]'s.
//!
//! Templates use them as filters: `{{ run.p99_ms|ms }}`, `{{ total|count }}` (askama finds a
//! template's filters in the `filters` module in scope where it is derived: `use
//! crate::web::format::filters;`).

use std::fmt::Display;

/// A duration in milliseconds, rounded to a tenth and written with its unit: `326.1 ms`,
/// `278 ms` (no `.0`), `0.5 ms`, `12,345.6 ms`.
pub fn ms(millis: f64) -> String {
    if !millis.is_finite() {
        return "– ms".to_owned();
    }
    let tenths = (millis * 10.0).round();
    let sign = if tenths < 0.0 { "-" } else { "" };
    let tenths = tenths.abs() as u64;
    match tenths % 10 {
        0 => format!("{sign}{} ms", count(tenths / 10)),
        tenth => format!("{sign}{}.{tenth} ms", count(tenths / 10)),
    }
}

/// A whole number with a comma between each group of three digits: `1,234,567`. Anything
/// that does not print as an integer is written as it prints.
pub fn count(number: impl Display) -> String {
    let written = number.to_string();
    let (sign, digits) = written.strip_prefix('-').map_or(("", written.as_str()), |digits| ("-", digits));
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return written;
    }
    let mut grouped = String::with_capacity(written.len() + digits.len() / 3);
    grouped.push_str(sign);
    for (i, digit) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            grouped.push(',');
        }
        grouped.push(digit);
    }
    grouped
}

/// [`ms`] and [`count`] as askama filters.
pub mod filters {
    use std::fmt::Display;

    /// `{{ millis|ms }}`: see [`super::ms`].
    #[askama::filter_fn]
    pub fn ms(millis: &f64, _: &dyn askama::Values) -> askama::Result<String> {
        Ok(super::ms(*millis))
    }

    /// `{{ number|count }}`: see [`super::count`].
    #[askama::filter_fn]
    pub fn count(number: impl Display, _: &dyn askama::Values) -> askama::Result<String> {
        Ok(super::count(number))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One decimal at most, none when it is zero, the float noise of a subtraction gone.
    #[test]
    fn milliseconds() {
        assert_eq!(ms(326.099_999_999_999_97), "326.1 ms");
        assert_eq!(ms(305.3 - 0.7), "304.6 ms");
        assert_eq!(ms(278.0), "278 ms");
        assert_eq!(ms(0.44), "0.4 ms");
        assert_eq!(ms(0.05), "0.1 ms");
        assert_eq!(ms(0.0), "0 ms");
        assert_eq!(ms(999.96), "1,000 ms");
        assert_eq!(ms(12_345.64), "12,345.6 ms");
        assert_eq!(ms(-2.5), "-2.5 ms");
        assert_eq!(ms(f64::NAN), "– ms");
    }

    /// Thousands separators from 1,000 up, for every integer type; other text as it is.
    #[test]
    fn counts() {
        assert_eq!(count(0), "0");
        assert_eq!(count(999), "999");
        assert_eq!(count(1000), "1,000");
        assert_eq!(count(12_480_i64), "12,480");
        assert_eq!(count(1_234_567_usize), "1,234,567");
        assert_eq!(count(-1_234_567_i64), "-1,234,567");
        assert_eq!(count(u64::MAX), "18,446,744,073,709,551,615");
        assert_eq!(count("n/a"), "n/a");
        assert_eq!(count(1.5), "1.5");
    }
}
