//! How budget numbers are shown (docs/ACCOUNTING.md, "What the numbers mean"): six significant
//! digits in receipts, banners, the prompt and refusals (CSV/JSON results keep full precision),
//! rounded in the direction that never flatters the budget, and shares of a table's budget in
//! whole millionths, so that the shares of a sequence of charges add up exactly to the total.

/// Millionths of a table's budget: the unit of every share shown (`12.3456%` is 123,456).
pub const SHARE_SCALE: u64 = 1_000_000;

/// Which way a shown number is rounded: costs and spent amounts up, what is left down.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Round {
    Nearest,
    Up,
    Down,
}

/// `x` with at most six significant digits, without trailing zeros: `0.5`, `2.22543`, `5`,
/// `1e-7`, `1.5e-10`, `123457`. Plain notation for 1e-4 ≤ |x| < 1e6, scientific otherwise. Zero is
/// `0`; non-finite values print as `∞`, `-∞` or `NaN`.
pub fn num(x: f64, round: Round) -> String {
    if x == 0.0 {
        return "0".to_string();
    }
    if x.is_nan() {
        return "NaN".to_string();
    }
    if x.is_infinite() {
        return if x > 0.0 { "∞" } else { "-∞" }.to_string();
    }
    // Work on |x|: rounding a negative number up is rounding its magnitude down.
    let neg = x < 0.0;
    let a = x.abs();
    let round = match (round, neg) {
        (Round::Up, true) => Round::Down,
        (Round::Down, true) => Round::Up,
        (r, _) => r,
    };
    let s = format!("{a:.5e}");
    let (mant, exp) = s.split_once('e').unwrap_or((&s, "0"));
    let mut exp: i32 = exp.parse().unwrap_or(0);
    let mut m: u64 = mant.replace('.', "").parse().unwrap_or(0);
    let shown: f64 = s.parse().unwrap_or(a);
    // Directed rounding ignores a relative excess below 1e-12: the ulps by which the accountant
    // already rounded its sums outward (0.010000000000000004 shows as 0.01, not 0.0100001).
    if round == Round::Up && shown * (1.0 + 1e-12) < a {
        m += 1;
    } else if round == Round::Down && shown > a * (1.0 + 1e-12) {
        m -= 1;
    }
    if m >= 1_000_000 {
        m /= 10;
        exp += 1;
    } else if m < 100_000 {
        m = m * 10 + 9;
        exp -= 1;
    }
    let digits = format!("{m:06}");
    let sign = if neg { "-" } else { "" };
    if (-4..6).contains(&exp) {
        // Plain: place the decimal point `exp` digits after the first.
        let s = if exp >= 0 {
            let (int, frac) = digits.split_at((exp + 1) as usize);
            if frac.trim_end_matches('0').is_empty() {
                int.to_string()
            } else {
                format!("{int}.{}", frac.trim_end_matches('0'))
            }
        } else {
            let zeros = "0".repeat((-exp - 1) as usize);
            format!("0.{zeros}{}", digits.trim_end_matches('0'))
        };
        format!("{sign}{s}")
    } else {
        let (first, rest) = digits.split_at(1);
        let rest = rest.trim_end_matches('0');
        if rest.is_empty() {
            format!("{sign}{first}e{exp}")
        } else {
            format!("{sign}{first}.{rest}e{exp}")
        }
    }
}

/// [`num`], rounded to nearest.
pub fn n6(x: f64) -> String {
    num(x, Round::Nearest)
}

/// The share `used / budget` in millionths, rounded up (what is used never looks smaller than
/// it is); a full or overfull budget is [`SHARE_SCALE`], an unbounded use too.
pub fn share_used(used: f64, budget: f64) -> u64 {
    if used <= 0.0 {
        return 0;
    }
    if used.is_nan() || budget.is_nan() || budget <= 0.0 || !used.is_finite() {
        return SHARE_SCALE;
    }
    let scale = SHARE_SCALE as f64;
    let mut r = (used / budget * scale).ceil();
    // The quotient is rounded: never let the share shown fall below used / budget.
    if r / scale * budget < used {
        r += 1.0;
    }
    (r as u64).min(SHARE_SCALE)
}

/// A share in millionths as a percentage with four decimals: `12.3456%`, `0%`, `100%`.
pub fn percent(share: u64) -> String {
    let whole = share / 10_000;
    let frac = share % 10_000;
    if frac == 0 {
        format!("{whole}%")
    } else {
        let f = format!("{frac:04}");
        format!("{whole}.{}%", f.trim_end_matches('0'))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn six_significant_digits() {
        assert_eq!(n6(1.0000000000000001e-7), "1e-7");
        assert_eq!(n6(0.0), "0");
        assert_eq!(n6(6.370317963702527), "6.37032");
        assert_eq!(n6(5.0), "5");
        assert_eq!(n6(0.5), "0.5");
        assert_eq!(n6(2.2254), "2.2254");
        assert_eq!(n6(1e-300), "1e-300");
        assert_eq!(n6(4.999999999999968e-8), "5e-8");
        assert_eq!(n6(123456789.0), "1.23457e8");
        assert_eq!(n6(0.000123456789), "0.000123457");
        assert_eq!(n6(-2.5), "-2.5");
        assert_eq!(n6(100.0), "100");
        assert_eq!(n6(1000.0), "1000");
        assert_eq!(n6(999999.5), "1e6");
        assert_eq!(n6(f64::INFINITY), "∞");
        // Outward and inward rounding.
        assert_eq!(num(2.2254301, Round::Up), "2.22544");
        assert_eq!(num(2.2254399, Round::Down), "2.22543");
        assert_eq!(num(0.1, Round::Up), "0.1");
        assert_eq!(num(0.1, Round::Down), "0.1");
        assert_eq!(num(3e-9, Round::Down), "3e-9");
    }

    #[test]
    fn shares_and_percentages() {
        assert_eq!(share_used(0.0, 1.0), 0);
        assert_eq!(share_used(1.0, 4.0), 250_000);
        assert_eq!(
            share_used(1e-12, 1.0),
            1,
            "a positive use is never shown as 0"
        );
        assert_eq!(share_used(2.0, 1.0), SHARE_SCALE);
        assert_eq!(share_used(f64::INFINITY, 1.0), SHARE_SCALE);
        assert_eq!(percent(123_456), "12.3456%");
        assert_eq!(percent(0), "0%");
        assert_eq!(percent(SHARE_SCALE), "100%");
        assert_eq!(percent(1), "0.0001%");
        assert_eq!(percent(500_000), "50%");
    }
}
