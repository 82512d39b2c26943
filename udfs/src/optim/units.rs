//! Privacy units for the model aggregates: rows grouped by unit, and the exact integer clipping
//! of a unit's summed contribution (user-level DP-SGD, McMahan, Ramage, Talwar, Zhang,
//! "Learning Differentially Private Recurrent Language Models", ICLR 2018, §3: each user's
//! update is clipped to L2 norm S before the noisy sum, so one user's whole contribution is
//! bounded whatever their number of examples).
//!
//! Under the unit-level neighbour mode `units:K:C` ([`crate::aggregates::Neighbours::Units`]) a
//! model call has one more argument after the hidden `neighbours` literal: the privacy-unit key,
//! a column of any type. The row buffer ([`super::rows::RowBuffer`]) keeps each row's key as the
//! bytes of arrow's row format (an injective, type-aware encoding: two keys get the same bytes
//! only when they are the same value, so two units are never merged, unlike a hash) and, at
//! `evaluate`, reorders the rows so that each unit's rows are contiguous ([`Units`]). The kernels
//! then sum each unit's row contributions exactly (integers) and clip the unit's sum
//! ([`clip_int`]) before adding it to the released sum: adding or removing a unit moves each
//! released sum by at most the clip bound, exactly as one row does under row-level `add_remove`.
use std::sync::Arc;

use datafusion::common::DataFusionError;
use datafusion::physical_expr::PhysicalExpr;

/// A physical argument expression.
type Expr = Arc<dyn PhysicalExpr>;

/// Rows grouped by privacy unit: unit u owns the rows `bounds[u]..bounds[u + 1]` of the
/// (reordered) [`super::rows::Rows`] it was built with. Every unit has at least one row.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Units {
    bounds: Vec<usize>,
}

impl Units {
    /// From a row → unit index map (`unit[i]` the dense unit of row i, `0..count`): returns the
    /// permutation that makes each unit's rows contiguous (new row r is old row `order[r]`; units
    /// in index order, rows of a unit in their original order) and the grouping. Units without
    /// any row are dropped.
    pub fn group(unit: &[u32], count: usize) -> (Vec<usize>, Units) {
        let mut sizes = vec![0usize; count];
        for &u in unit {
            sizes[u as usize] += 1;
        }
        // Prefix sums over the non-empty units (counting sort).
        let mut start = vec![0usize; count];
        let mut bounds = Vec::with_capacity(count + 1);
        bounds.push(0);
        let mut acc = 0;
        for (u, &s) in sizes.iter().enumerate() {
            start[u] = acc;
            if s > 0 {
                acc += s;
                bounds.push(acc);
            }
        }
        let mut order = vec![0usize; unit.len()];
        for (i, &u) in unit.iter().enumerate() {
            let slot = &mut start[u as usize];
            order[*slot] = i;
            *slot += 1;
        }
        (order, Units { bounds })
    }

    /// From the sizes of consecutive units (each > 0; zeros are dropped): unit u owns the next
    /// `sizes[u]` rows. For tests and callers whose rows are already grouped.
    pub fn from_sizes(sizes: &[usize]) -> Units {
        let mut bounds = vec![0];
        let mut acc = 0;
        for &s in sizes.iter().filter(|&&s| s > 0) {
            acc += s;
            bounds.push(acc);
        }
        Units { bounds }
    }

    /// Each of `n` rows its own unit (row-level grouping: what the kernels do without units).
    pub fn singletons(n: usize) -> Units {
        Units {
            bounds: (0..=n).collect(),
        }
    }

    /// The number of units.
    pub fn count(&self) -> usize {
        self.bounds.len().saturating_sub(1)
    }

    /// The number of rows covered.
    pub fn rows(&self) -> usize {
        self.bounds.last().copied().unwrap_or(0)
    }

    /// The rows of unit `u`.
    #[inline]
    pub fn range(&self, u: usize) -> std::ops::Range<usize> {
        self.bounds[u]..self.bounds[u + 1]
    }

    /// Bytes held.
    pub fn size(&self) -> usize {
        size_of::<Self>() + self.bounds.capacity() * size_of::<usize>()
    }
}

/// Clips the integer vector `v` to L2 norm `bound` **in integers**: afterwards Σⱼ vⱼ² ≤ bound²
/// exactly, whatever the input (saturating arithmetic). A vector already inside is unchanged;
/// otherwise it is scaled by bound/‖v‖ (floating point) and truncated toward zero
/// (|trunc(x)| ≤ |x| coordinatewise, so truncation never increases the norm), then, should float
/// rounding have left it outside, shrunk again until the exact check passes (each pass scales by
/// less than 1 and truncates, so the loop ends, at worst at 0). This is the per-user clipping of
/// McMahan et al. 2018 (§3, "clip each user's update to L2 norm S") on the kernels' integer grid.
/// Returns whether `v` was changed.
pub fn clip_int(v: &mut [i128], bound: u64) -> bool {
    let b2 = (bound as u128) * (bound as u128);
    let norm2 = super::clip::norm2_int::<i128>;
    let mut n2 = norm2(v);
    if n2 <= b2 {
        return false;
    }
    let mut first = true;
    while n2 > b2 {
        // ‖v‖ in floating point from the coordinates (n2 may have saturated).
        let nf = v
            .iter()
            .map(|&x| {
                let f = x as f64;
                f * f
            })
            .sum::<f64>()
            .sqrt();
        let s = if first {
            bound as f64 / nf
        } else {
            bound as f64 / nf * (1.0 - 1e-6)
        };
        first = false;
        for x in v.iter_mut() {
            let y = (*x as f64 * s).trunc();
            // |y| ≤ |x| since s < 1; the cast saturates and cannot grow |x|.
            *x = if y.is_finite() { y as i128 } else { 0 };
        }
        n2 = norm2(v);
    }
    true
}

/// The argument layout of a model aggregate call: `data` data columns, then `names` literal
/// parameters (the last is `neighbours`), then — only under unit-level neighbours — the
/// privacy-unit key column. Splits `exprs` into the literal part and the key expression (when
/// there is one more argument than the literal parameters).
pub(crate) fn split_unit_key(
    exprs: &[Expr],
    data: usize,
    names: usize,
) -> (&[Expr], Option<&Expr>) {
    if exprs.len() == data + names + 1 {
        (&exprs[..data + names], exprs.last())
    } else {
        (exprs, None)
    }
}

/// The privacy-unit key's type, checked at planning: any type arrow's row format can encode
/// (every scalar, string, binary, decimal, temporal, dictionary, struct and list type).
pub(crate) fn check_key_type(
    function: &str,
    t: &datafusion::arrow::datatypes::DataType,
) -> std::result::Result<(), DataFusionError> {
    use datafusion::arrow::row::{RowConverter, SortField};
    if RowConverter::supports_fields(&[SortField::new(t.clone())]) {
        Ok(())
    } else {
        Err(DataFusionError::Plan(format!(
            "{function}: the privacy-unit key cannot be of type {t} (it must be comparable by \
             value)"
        )))
    }
}

/// The planning check tying the unit key to the neighbour mode: a unit-level call
/// (`units:K:C`) needs the key (per-unit clipping is what bounds a unit's contribution), and the
/// key is accepted only in that mode.
pub(crate) fn check_unit_key(
    function: &str,
    units: bool,
    has_key: bool,
) -> std::result::Result<(), DataFusionError> {
    match (units, has_key) {
        (true, false) => Err(DataFusionError::Plan(format!(
            "{function}: unit-level neighbours ('units:K:C') need the privacy-unit key column as \
             the argument after `neighbours` (the fit clips each unit's summed contribution)"
        ))),
        (false, true) => Err(DataFusionError::Plan(format!(
            "{function}: an argument after `neighbours` (the privacy-unit key) is accepted only \
             with unit-level neighbours 'units:K:C'"
        ))),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn group_makes_units_contiguous() {
        let unit = [2u32, 0, 2, 1, 0, 2];
        let (order, u) = Units::group(&unit, 4);
        assert_eq!(order, vec![1, 4, 3, 0, 2, 5]);
        assert_eq!(u.count(), 3);
        assert_eq!(u.range(0), 0..2);
        assert_eq!(u.range(1), 2..3);
        assert_eq!(u.range(2), 3..6);
        assert_eq!(u.rows(), 6);
        assert_eq!(Units::from_sizes(&[2, 0, 1, 3]), u);
        assert_eq!(Units::singletons(3), Units::from_sizes(&[1, 1, 1]));
    }

    #[test]
    fn clip_int_is_exact() {
        let mut v = vec![3i128, 4];
        assert!(!clip_int(&mut v, 5));
        assert_eq!(v, vec![3, 4]);
        assert!(clip_int(&mut v, 4));
        assert!(v[0] * v[0] + v[1] * v[1] <= 16);
        let mut huge = vec![i128::MAX, i128::MIN, 7];
        assert!(clip_int(&mut huge, 1 << 40));
        let n2: u128 = huge.iter().map(|x| x.unsigned_abs().pow(2)).sum();
        assert!(n2 <= 1u128 << 80 && n2 > (1u128 << 80) / 2);
        for b in [1u64, 2, 3, 1000, (1 << 31) - 1, u64::MAX >> 2] {
            let mut v: Vec<i128> = (0..7).map(|j| (b as i128) * (j - 3) + 1).collect();
            clip_int(&mut v, b);
            let n2: u128 = v.iter().map(|x| x.unsigned_abs().pow(2)).sum();
            assert!(n2 <= (b as u128).pow(2), "{b}");
        }
    }
}
