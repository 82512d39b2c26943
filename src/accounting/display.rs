//! How budget numbers are shown (docs/ACCOUNTING.md, "What the numbers mean"): six significant
//! digits in receipts, banners, the prompt, refusals and the budget tables ([`shown`]),
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
    num_digits(x, round, 6)
}

/// [`num`] with `digits` significant digits (6 to 17).
fn num_digits(x: f64, round: Round, digits: usize) -> String {
    let digits = digits.clamp(6, 17);
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
    let s = format!("{a:.*e}", digits - 1);
    let (mant, exp) = s.split_once('e').unwrap_or((&s, "0"));
    let mut exp: i32 = exp.parse().unwrap_or(0);
    let mut m: u64 = mant.replace('.', "").parse().unwrap_or(0);
    let shown: f64 = s.parse().unwrap_or(a);
    // Directed rounding ignores a relative excess below 1e-12: the ulps by which the accountant
    // already rounded its sums outward (0.010000000000000004 shows as 0.01, not 0.0100001). With
    // more digits than that tolerance resolves, it is exact.
    let tol = if digits <= 10 { 1e-12 } else { 0.0 };
    if round == Round::Up && shown * (1.0 + tol) < a {
        m += 1;
    } else if round == Round::Down && shown > a * (1.0 + tol) {
        m -= 1;
    }
    let top = 10u64.pow(digits as u32);
    if m >= top {
        m /= 10;
        exp += 1;
    } else if m < top / 10 {
        m = m * 10 + 9;
        exp -= 1;
    }
    let digits = format!("{m:0digits$}");
    let sign = if neg { "-" } else { "" };
    format!("{sign}{}", place(&digits, exp))
}

/// The significant `digits` (first one non-zero) of a number of decimal exponent `exp`, as
/// [`num`] writes it: plain for -4 ≤ exp < 6, scientific otherwise, without trailing zeros.
fn place(digits: &str, exp: i32) -> String {
    if (-4..6).contains(&exp) {
        // Plain: place the decimal point `exp` digits after the first.
        if exp >= 0 {
            let digits = format!("{digits:0<width$}", width = exp as usize + 1);
            let (int, frac) = digits.split_at((exp + 1) as usize);
            if frac.trim_end_matches('0').is_empty() {
                int.to_string()
            } else {
                format!("{int}.{}", frac.trim_end_matches('0'))
            }
        } else {
            let zeros = "0".repeat((-exp - 1) as usize);
            format!("0.{zeros}{}", digits.trim_end_matches('0'))
        }
    } else {
        let (first, rest) = digits.split_at(1);
        let rest = rest.trim_end_matches('0');
        if rest.is_empty() {
            format!("{first}e{exp}")
        } else {
            format!("{first}.{rest}e{exp}")
        }
    }
}

/// A budget as the data owner set it (the guarantee and the budget in force, ε and δ): the
/// number they wrote, in its shortest decimal form that reads back as the same `f64` (as SHOW
/// BUDGET's CSV and JSON give it), in [`num`]'s notation: `1.0000001`, `1e-6`, `1.0000001e-6`.
/// A budget is a policy constant, neither spent nor left: it is never rounded, so equal budgets
/// print equal on every surface (round 47, review "newuser2", C).
pub fn budget(x: f64) -> String {
    if x == 0.0 || !x.is_finite() {
        return num(x, Round::Nearest);
    }
    // `{:e}` is the shortest round-trip representation: `1.0000001e-6`.
    let s = format!("{:e}", x.abs());
    let (mant, exp) = s.split_once('e').unwrap_or((&s, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let digits = mant.replace('.', "");
    let sign = if x < 0.0 { "-" } else { "" };
    format!("{sign}{}", place(&digits, exp))
}

/// An amount used and the budget it is used of, as shown together (SHOW BUDGET's `used` and
/// `budget`, a refusal's "(x of y used)", `dpfusion ledger report`): used rounded up, the budget
/// rounded down, six significant digits, and when that would contradict the true order (the
/// used amount shown at or above the budget while it is below it), both with as many more
/// significant digits as it takes (round 47, review "newuser2", B: `2.81392 of 2.81391` on a
/// table with 0.0001% left). A used amount at or above its budget is shown as it rounds.
pub fn used_of(used: f64, budget: f64) -> (String, String) {
    let mut digits = 6;
    loop {
        let (u, b) = (
            num_digits(used, Round::Up, digits),
            num_digits(budget, Round::Down, digits),
        );
        // Only a use below its budget (NaN compares as not below) needs to stay apart.
        let below = used.partial_cmp(&budget) == Some(std::cmp::Ordering::Less);
        let apart = !below
            || match (u.parse::<f64>(), b.parse::<f64>()) {
                (Ok(su), Ok(sb)) => su < sb,
                _ => true,
            };
        if apart || digits >= 17 {
            return (u, b);
        }
        digits += 1;
    }
}

/// [`used_of`]'s pair as the numbers a table column gives (`SHOW BUDGET`'s `used` and
/// `budget`).
pub fn used_of_shown(used: f64, budget: f64) -> (f64, f64) {
    if !used.is_finite() || !budget.is_finite() {
        return (used, budget);
    }
    let (u, b) = used_of(used, budget);
    (u.parse().unwrap_or(used), b.parse().unwrap_or(budget))
}

/// The share left of a budget, `1,000,000 − used_share` millionths, as text: `< 0.0001%` when
/// something is left that is less than one millionth of the budget (never `0%` while a query
/// may still be admitted, nor a whole millionth that is not there; round 47, review
/// "newuser2", B).
pub fn percent_left(used_share: u64, used: f64, budget: f64) -> String {
    let left = SHARE_SCALE.saturating_sub(used_share);
    if used < budget && (left == 0 || (budget - used) / budget < 1.0 / SHARE_SCALE as f64) {
        "< 0.0001%".to_string()
    } else {
        percent(left)
    }
}

/// [`num`], rounded to nearest.
pub fn n6(x: f64) -> String {
    num(x, Round::Nearest)
}

/// `x` as the number [`num`] shows: six significant digits, rounded `round`. The amounts of
/// `SHOW BUDGET`, `dp_budget()`, `dp_ledger()` and `EXPLAIN PRIVACY` are given so, whatever
/// format prints them: a table printer that rounds to nearest would otherwise show more ε left
/// than there is (review r45: `remaining_epsilon 5.3175` where a query asking 5.3175 is refused
/// with "at most 5.31749").
pub fn shown(x: f64, round: Round) -> f64 {
    if !x.is_finite() || x == 0.0 {
        return x;
    }
    num(x, round).parse().unwrap_or(x)
}

/// A charge's share of the budget as [`percent`], and `< 0.0001%` for a positive cost whose share
/// rounds to 0 millionths (shares are differences of running shares, so a small charge may show
/// none of its own: review r45).
pub fn percent_of(share: u64, cost: f64) -> String {
    if share == 0 && cost > 0.0 {
        "< 0.0001%".to_string()
    } else {
        percent(share)
    }
}

/// A charge's share in millionths as a number column gives it (`dp_ledger().cost_pct`,
/// `EXPLAIN PRIVACY`): a positive cost whose share rounds to 0 millionths is one millionth,
/// 0.0001%, rounded up as [`percent_of`]'s `< 0.0001%` (round 47: a float cannot say "<", and
/// 0 read as a free charge).
pub fn charge_share(share: u64, cost: f64) -> u64 {
    if share == 0 && cost > 0.0 { 1 } else { share }
}

/// The share `used / budget` in millionths, rounded up (what is used never looks smaller than
/// it is); a full or overfull budget is [`SHARE_SCALE`], an unbounded use too. A budget not used
/// up is at most `SHARE_SCALE − 1`: `100%` used (`0%` left) only when nothing is left (round 47,
/// review "newuser2", B: `used_pct 100` on a table that still admitted queries).
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
    let cap = if used < budget {
        SHARE_SCALE - 1
    } else {
        SHARE_SCALE
    };
    (r as u64).min(cap)
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

    /// Review r45: a budget table printed to nearest showed `remaining_epsilon 5.3175` where a
    /// query asking 5.3175 was refused "at most 5.31749". The tables now carry the number as
    /// shown, rounded the safe way, and any printer shows at most it.
    #[test]
    fn amounts_are_given_as_shown_rounded_the_safe_way() {
        assert_eq!(shown(5.3174974, Round::Down), 5.31749);
        assert_eq!(shown(0.03936071, Round::Up), 0.0393608);
        assert!(shown(5.3174974, Round::Down) <= 5.3174974);
        assert!(shown(0.03936071, Round::Up) >= 0.03936071);
        assert_eq!(shown(0.0, Round::Up), 0.0);
        assert_eq!(shown(f64::INFINITY, Round::Down), f64::INFINITY);
        // Printing the shown number to six digits, to nearest, gives the same digits.
        assert_eq!(n6(shown(5.3174974, Round::Down)), "5.31749");
        // A positive charge whose share rounds to no millionth is not shown as 0%.
        assert_eq!(percent_of(0, 1e-9), "< 0.0001%");
        assert_eq!(percent_of(0, 0.0), "0%");
        assert_eq!(percent_of(123_456, 0.5), "12.3456%");
        // The same as a number: one millionth, never 0 for a positive cost.
        assert_eq!(charge_share(0, 1e-9), 1);
        assert_eq!(charge_share(0, 0.0), 0);
        assert_eq!(charge_share(123_456, 0.5), 123_456);
    }

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

    /// Round 47, review "newuser2", B: the budget rounded down (2.81391) below the used amount
    /// rounded up (2.81392) on a table with something left. Shown together, they take as many
    /// more digits as it takes to keep the true order; a spent budget shows as it rounds.
    #[test]
    fn used_is_never_shown_at_or_above_a_budget_it_is_below() {
        let (used, budget) = (2.8139125, 2.813917);
        assert_eq!(num(used, Round::Up), "2.81392");
        assert_eq!(num(budget, Round::Down), "2.81391");
        let (u, b) = used_of(used, budget);
        assert_eq!((u.as_str(), b.as_str()), ("2.813913", "2.813917"));
        let (su, sb) = used_of_shown(used, budget);
        assert!(used <= su && su < sb && sb <= budget, "{su} {sb}");
        // Apart already at six digits: unchanged.
        assert_eq!(used_of(1.5, 3.0), ("1.5".to_string(), "3".to_string()));
        // Closer than any shown digits can tell: at most 17.
        let next = f64::from_bits(budget.to_bits() - 1);
        let (u, b) = used_of(next, budget);
        assert!(
            u.parse::<f64>().unwrap() < b.parse::<f64>().unwrap(),
            "{u} {b}"
        );
        // Used up, or beyond a lowered budget: shown as they round.
        assert_eq!(used_of(3.0, 3.0), ("3".to_string(), "3".to_string()));
        assert_eq!(used_of(3.5, 3.0), ("3.5".to_string(), "3".to_string()));
        // Something left is never 0% left, nor 100% used.
        assert_eq!(share_used(0.9999995, 1.0), SHARE_SCALE - 1);
        assert_eq!(share_used(1.0, 1.0), SHARE_SCALE);
        assert_eq!(percent_left(SHARE_SCALE - 1, 0.9999995, 1.0), "< 0.0001%");
        assert_eq!(percent_left(SHARE_SCALE, 1.0, 1.0), "0%");
        assert_eq!(percent_left(500_000, 0.5, 1.0), "50%");
    }

    /// Round 47, review "newuser2", C: a budget is shown as the owner wrote it, never rounded.
    #[test]
    fn budgets_are_shown_as_written() {
        assert_eq!(budget(1.0000001), "1.0000001");
        assert_eq!(budget(1.0000001e-6), "1.0000001e-6");
        assert_eq!(budget(1e-7), "1e-7");
        assert_eq!(budget(5.0), "5");
        assert_eq!(budget(100.0), "100");
        assert_eq!(budget(0.5), "0.5");
        assert_eq!(budget(0.0005), "0.0005");
        assert_eq!(budget(123456.7), "123456.7");
        assert_eq!(budget(1e6), "1e6");
        assert_eq!(budget(2.5e-10), "2.5e-10");
        for x in [1.0000001, 1.0000001e-6, 0.1 + 0.2, 3.0, 7e-9] {
            assert_eq!(budget(x).parse::<f64>().unwrap(), x);
        }
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
