//! Exact wide-integer arithmetic for the relative Gaussian mechanism: the exact sum of positive
//! `f64` values (a "superaccumulator"), the correctly rounded mean, and the correctly rounded sum
//! of a mean and a noise sample that lives on a very fine dyadic lattice.
//!
//! Why exact: PRIVACY.md ("Numbers on a computer") asks for sums whose sensitivity is proven and
//! independent of the partitioning (Casacuberta, Shoemate, Vadhan, Wagaman, CCS 2022). The other
//! aggregates clamp to [lower, upper] and sum in fixed point ([`crate::mechanisms::exact`]).
//! `rgm_mean_by` has no bounds (it exists because each group's scale is unknown), so it sums the
//! exact values: every positive finite `f64` is M·2^e with an integer M < 2^53 and
//! e ≥ −1074, i.e. an integer number of units 2^−1074, and integer addition is exact and
//! associative. The total is a function of the multiset of values alone, whatever the order or
//! the partitioning of the plan.
use std::cmp::Ordering;

use crate::mechanisms::exact::pow2;

/// A non-negative integer, little-endian 64-bit limbs, without high zero limbs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Wide {
    limbs: Vec<u64>,
}

impl Wide {
    pub fn zero() -> Self {
        Wide { limbs: vec![] }
    }

    pub fn from_u128(x: u128) -> Self {
        let mut w = Wide {
            limbs: vec![x as u64, (x >> 64) as u64],
        };
        w.trim();
        w
    }

    fn trim(&mut self) {
        while self.limbs.last() == Some(&0) {
            self.limbs.pop();
        }
    }

    pub fn is_zero(&self) -> bool {
        self.limbs.is_empty()
    }

    /// Number of significant bits (0 for zero).
    pub fn bit_len(&self) -> u64 {
        match self.limbs.last() {
            None => 0,
            Some(&top) => 64 * (self.limbs.len() as u64 - 1) + (64 - top.leading_zeros() as u64),
        }
    }

    pub fn bit(&self, i: u64) -> bool {
        let (l, b) = ((i / 64) as usize, i % 64);
        self.limbs.get(l).is_some_and(|x| (x >> b) & 1 == 1)
    }

    /// Whether any bit below position `i` is set.
    pub fn any_below(&self, i: u64) -> bool {
        let (l, b) = ((i / 64) as usize, i % 64);
        if self.limbs[..l.min(self.limbs.len())]
            .iter()
            .any(|&x| x != 0)
        {
            return true;
        }
        b > 0
            && self
                .limbs
                .get(l)
                .is_some_and(|x| x & ((1u64 << b) - 1) != 0)
    }

    /// self · 2^k.
    pub fn shl(&self, k: u64) -> Wide {
        if self.is_zero() {
            return Wide::zero();
        }
        let (limbs, bits) = ((k / 64) as usize, (k % 64) as u32);
        let mut out = vec![0u64; limbs];
        let mut carry = 0u64;
        for &x in &self.limbs {
            if bits == 0 {
                out.push(x);
            } else {
                out.push((x << bits) | carry);
                carry = x >> (64 - bits);
            }
        }
        if carry != 0 {
            out.push(carry);
        }
        let mut w = Wide { limbs: out };
        w.trim();
        w
    }

    /// ⌊self / 2^k⌋ (the low 64 bits of it are all callers need).
    fn shr_low_u64(&self, k: u64) -> u64 {
        let (l, b) = ((k / 64) as usize, (k % 64) as u32);
        let lo = self.limbs.get(l).copied().unwrap_or(0);
        let hi = self.limbs.get(l + 1).copied().unwrap_or(0);
        if b == 0 {
            lo
        } else {
            (lo >> b) | (hi << (64 - b))
        }
    }

    /// Adds `x · 2^(64·limb)`.
    fn add_at(&mut self, limb: usize, x: u128) {
        let mut i = limb;
        let mut carry = x;
        while carry != 0 {
            if self.limbs.len() <= i {
                self.limbs.resize(i + 1, 0);
            }
            let s = self.limbs[i] as u128 + (carry as u64) as u128;
            self.limbs[i] = s as u64;
            carry = (carry >> 64) + (s >> 64);
            i += 1;
        }
    }

    pub fn add(&mut self, other: &Wide) {
        for (i, &x) in other.limbs.iter().enumerate() {
            self.add_at(i, x as u128);
        }
    }

    /// self − other, for self ≥ other.
    pub fn sub(&mut self, other: &Wide) {
        debug_assert!(Ord::cmp(&*self, other) != Ordering::Less);
        let mut borrow = 0u64;
        for i in 0..self.limbs.len() {
            let o = other.limbs.get(i).copied().unwrap_or(0);
            let (d1, b1) = self.limbs[i].overflowing_sub(o);
            let (d2, b2) = d1.overflowing_sub(borrow);
            self.limbs[i] = d2;
            borrow = (b1 || b2) as u64;
        }
        self.trim();
    }

    /// (⌊self / d⌋, self mod d) for d > 0.
    pub fn div_rem_u64(&self, d: u64) -> (Wide, u64) {
        assert!(d > 0);
        let mut q = vec![0u64; self.limbs.len()];
        let mut r: u128 = 0;
        for i in (0..self.limbs.len()).rev() {
            let cur = (r << 64) | self.limbs[i] as u128;
            q[i] = (cur / d as u128) as u64;
            r = cur % d as u128;
        }
        let mut w = Wide { limbs: q };
        w.trim();
        (w, r as u64)
    }

    /// The `f64` nearest to (self + f)·2^exp, ties to even, where f ∈ (0, 1) if `sticky` and
    /// f = 0 otherwise. With `sticky`, self must have at least 2 bits below the result's last
    /// mantissa bit (callers guarantee it; debug-asserted). Overflow gives +∞.
    pub fn to_f64(&self, exp: i64, sticky: bool) -> f64 {
        let bl = self.bit_len() as i64;
        if bl == 0 {
            // Only f·2^exp with f < 1: callers never get here with exp ≥ −1075.
            debug_assert!(!sticky || exp < -1076);
            return 0.0;
        }
        let top = exp + bl - 1; // value in [2^top, 2^(top+1))
        if top > 1023 {
            return f64::INFINITY;
        }
        let mut q = (top - 52).max(-1074); // exponent of the result's last mantissa bit
        let shift = q - exp; // low bits of self to drop
        let mut mant: u64;
        if shift <= 0 {
            debug_assert!(!sticky, "not enough bits below the rounding position");
            mant = self.shr_low_u64(0) << (-shift) as u32; // < 2^53: exact
        } else {
            let s = shift as u64;
            debug_assert!(!sticky || s >= 2);
            mant = self.shr_low_u64(s);
            let half = self.bit(s - 1);
            let rest = sticky || self.any_below(s - 1);
            if half && (rest || mant & 1 == 1) {
                mant += 1;
                if mant == 1u64 << 53 {
                    mant >>= 1;
                    q += 1;
                    if q + 52 > 1023 {
                        return f64::INFINITY;
                    }
                }
            }
        }
        // mant < 2^53 and q ∈ [−1074, 971]: the product is exact.
        mant as f64 * pow2(q as i32)
    }
}

impl PartialOrd for Wide {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Wide {
    fn cmp(&self, other: &Self) -> Ordering {
        self.limbs
            .len()
            .cmp(&other.limbs.len())
            .then_with(|| self.limbs.iter().rev().cmp(other.limbs.iter().rev()))
    }
}

/// A signed wide integer (sign, magnitude); zero is never negative.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignedWide {
    pub negative: bool,
    pub magnitude: Wide,
}

impl SignedWide {
    pub fn from_i128_shifted(x: i128, k: u64) -> Self {
        SignedWide {
            negative: x < 0,
            magnitude: Wide::from_u128(x.unsigned_abs()).shl(k),
        }
    }

    pub fn positive(w: Wide) -> Self {
        SignedWide {
            negative: false,
            magnitude: w,
        }
    }

    pub fn plus(self, other: SignedWide) -> SignedWide {
        let (mut a, b) = (self, other);
        if a.negative == b.negative {
            a.magnitude.add(&b.magnitude);
            return a;
        }
        let (mut big, small, negative) = if a.magnitude >= b.magnitude {
            (a.magnitude, b.magnitude, a.negative)
        } else {
            (b.magnitude, a.magnitude, b.negative)
        };
        big.sub(&small);
        let negative = negative && !big.is_zero();
        SignedWide {
            negative,
            magnitude: big,
        }
    }

    /// The `f64` nearest to self·2^exp (ties to even).
    pub fn to_f64(&self, exp: i64) -> f64 {
        let m = self.magnitude.to_f64(exp, false);
        if self.negative { -m } else { m }
    }
}

/// The exact sum of positive finite `f64` values, in units of 2^−1074, stored from limb `base`
/// up (so that sums of ordinary magnitudes take two or three limbs, not 34).
///
/// A sum of k values is below k·2^1024, so it needs at most 2098 + log2(k) bits: no overflow is
/// possible for any k a plan can count.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExactSum {
    base: usize,
    limbs: Vec<u64>,
}

impl ExactSum {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds x · 2^(64·(abs_limb)) (absolute limb index, in units of 2^−1074).
    fn add_abs(&mut self, abs_limb: usize, x: u128) {
        if x == 0 {
            return;
        }
        if self.limbs.is_empty() {
            self.base = abs_limb;
        } else if abs_limb < self.base {
            let extra = self.base - abs_limb;
            self.limbs.splice(0..0, std::iter::repeat_n(0u64, extra));
            self.base = abs_limb;
        }
        let mut i = abs_limb - self.base;
        let mut carry = x;
        while carry != 0 {
            if self.limbs.len() <= i {
                self.limbs.resize(i + 1, 0);
            }
            let s = self.limbs[i] as u128 + (carry as u64) as u128;
            self.limbs[i] = s as u64;
            carry = (carry >> 64) + (s >> 64);
            i += 1;
        }
    }

    /// Adds a positive finite value (callers check; anything else is ignored and must have been
    /// reported as a contract violation).
    pub fn add_value(&mut self, v: f64) {
        if !(v.is_finite() && v > 0.0) {
            return;
        }
        let bits = v.to_bits();
        let e = ((bits >> 52) & 0x7ff) as u32;
        let frac = bits & ((1u64 << 52) - 1);
        // v = M·2^(p − 1074) with p ≥ 0 (IEEE 754 binary64).
        let (m, p) = if e == 0 {
            (frac, 0u32)
        } else {
            (frac | (1u64 << 52), e - 1)
        };
        let x = (m as u128) << (p % 64);
        self.add_abs((p / 64) as usize, x);
    }

    pub fn merge(&mut self, other: &ExactSum) {
        for (j, &l) in other.limbs.iter().enumerate() {
            self.add_abs(other.base + j, l as u128);
        }
    }

    pub fn is_zero(&self) -> bool {
        self.limbs.iter().all(|&l| l == 0)
    }

    /// (W, e) with sum = W · 2^e.
    fn wide(&self) -> (Wide, i64) {
        let mut w = Wide {
            limbs: self.limbs.clone(),
        };
        w.trim();
        (w, 64 * self.base as i64 - 1074)
    }

    /// sum / n, correctly rounded to the nearest `f64` (ties to even); 0 for an empty sum.
    pub fn mean(&self, n: u64) -> f64 {
        assert!(n > 0);
        let (w, e) = self.wide();
        if w.is_zero() {
            return 0.0;
        }
        // 128 extra bits: the quotient has ≥ 65 bits, so ≥ 12 bits lie below the rounding
        // position and the remainder only acts as a sticky bit.
        let (q, r) = w.shl(128).div_rem_u64(n);
        q.to_f64(e - 128, r != 0)
    }

    /// The exact sum rounded to the nearest `f64` (tests and display).
    pub fn to_f64(&self) -> f64 {
        let (w, e) = self.wide();
        w.to_f64(e, false)
    }

    /// Serialised state: `base` (u32, little-endian) then the limbs (u64, little-endian), without
    /// zero limbs at either end.
    pub fn to_bytes(&self) -> Vec<u8> {
        let first = self.limbs.iter().position(|&l| l != 0);
        let Some(first) = first else {
            return 0u32.to_le_bytes().to_vec();
        };
        let last = self.limbs.iter().rposition(|&l| l != 0).unwrap_or(first);
        let mut out = Vec::with_capacity(4 + 8 * (last + 1 - first));
        out.extend_from_slice(&((self.base + first) as u32).to_le_bytes());
        for l in &self.limbs[first..=last] {
            out.extend_from_slice(&l.to_le_bytes());
        }
        out
    }

    /// Inverse of [`Self::to_bytes`]; `None` for a malformed state.
    pub fn from_bytes(b: &[u8]) -> Option<Self> {
        if b.len() < 4 || !(b.len() - 4).is_multiple_of(8) {
            return None;
        }
        let base = u32::from_le_bytes(b[..4].try_into().ok()?) as usize;
        if base > 64 {
            return None; // 2^(64·64 − 1074) is far above any sum of f64 values
        }
        let limbs = b[4..]
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
            .collect();
        Some(ExactSum { base, limbs })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_sum_is_order_independent_and_exact() {
        // 1e16 + 1 + 1 loses both ones in f64 arithmetic; the exact sum keeps them.
        let vals = [1e16, 1.0, 1.0, 0.1, 3.3, 7.7e-300, 1e300, 5e-324];
        let mut fwd = ExactSum::new();
        vals.iter().for_each(|&v| fwd.add_value(v));
        let mut rev = ExactSum::new();
        vals.iter().rev().for_each(|&v| rev.add_value(v));
        assert_eq!(fwd.to_bytes(), rev.to_bytes());
        // Split into partitions and merged: same state.
        let mut a = ExactSum::new();
        let mut b = ExactSum::new();
        vals[..3].iter().for_each(|&v| a.add_value(v));
        vals[3..].iter().for_each(|&v| b.add_value(v));
        b.merge(&a);
        assert_eq!(b.to_bytes(), fwd.to_bytes());
        let mut s = ExactSum::new();
        [1e16, 1.0, 1.0].iter().for_each(|&v| s.add_value(v));
        assert_eq!(s.to_f64(), 1e16 + 2.0);
        assert_eq!(1e16 + 1.0 + 1.0, 1e16, "the f64 sum loses the ones");
        let back = ExactSum::from_bytes(&fwd.to_bytes()).unwrap();
        assert_eq!(back.to_bytes(), fwd.to_bytes());
        assert!(ExactSum::from_bytes(&[1, 2, 3]).is_none());
        assert!(ExactSum::new().is_zero());
        assert_eq!(
            ExactSum::from_bytes(&ExactSum::new().to_bytes()),
            Some(ExactSum::new())
        );
    }

    #[test]
    fn means_are_correctly_rounded() {
        // Integers below 2^53 are exact doubles and their sum is exact, so the IEEE division
        // (sum as f64)/(n as f64) is the correctly rounded mean: both must agree bit for bit.
        let mut x: u64 = 0x9e37_79b9;
        for n in [1u64, 2, 3, 7, 10, 1000] {
            let mut s = ExactSum::new();
            let mut total: u64 = 0;
            for _ in 0..n {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let v = (x >> 40) + 1; // < 2^24
                total += v;
                s.add_value(v as f64);
            }
            assert_eq!(s.mean(n), total as f64 / n as f64, "n = {n}");
        }
        let mut s = ExactSum::new();
        for v in [0.1, 0.2, 0.3] {
            s.add_value(v);
        }
        let m = s.mean(3);
        assert!((m - 0.2).abs() <= f64::EPSILON * 0.2, "{m}");
        // Equal values: the mean is the value, exactly.
        for v in [1.5, 123456.789, 1e-310, 1.7e308] {
            let mut s = ExactSum::new();
            for _ in 0..7 {
                s.add_value(v);
            }
            assert_eq!(s.mean(7), v, "{v}");
        }
        // Ties to even: (1 + (1 + 2^-52))/2 = 1 + 2^-53 is a tie between 1 and 1 + 2^-52.
        let mut s = ExactSum::new();
        s.add_value(1.0);
        s.add_value(1.0 + f64::EPSILON);
        assert_eq!(s.mean(2), 1.0);
        // … and with a third value just above, it rounds up.
        let mut s = ExactSum::new();
        s.add_value(1.0);
        s.add_value(1.0 + f64::EPSILON);
        s.add_value(1.0 + 2.0 * f64::EPSILON);
        assert_eq!(s.mean(3), 1.0 + f64::EPSILON);
    }

    #[test]
    fn wide_rounding_and_signs() {
        let w = Wide::from_u128((1u128 << 60) + 3);
        // (2^60 + 3)·2^-60 = 1 + 3·2^-60 → 1.0
        assert_eq!(w.to_f64(-60, false), 1.0);
        // 2^53 + 1 is a tie → even (2^53); 2^53 + 3 → 2^53 + 4.
        assert_eq!(
            Wide::from_u128((1 << 53) + 1).to_f64(0, false),
            9007199254740992.0
        );
        assert_eq!(
            Wide::from_u128((1 << 53) + 3).to_f64(0, false),
            9007199254740996.0
        );
        // sticky breaks the tie upward
        assert_eq!(
            Wide::from_u128((1 << 54) + 2).to_f64(-1, true),
            9007199254740994.0
        );
        // subnormals and overflow
        assert_eq!(Wide::from_u128(3).to_f64(-1075, false), 2.0 * 5e-324);
        assert_eq!(Wide::from_u128(1).to_f64(1024, false), f64::INFINITY);
        let a = SignedWide::from_i128_shifted(-5, 3); // −40
        let b = SignedWide::positive(Wide::from_u128(25));
        assert_eq!(a.clone().plus(b.clone()).to_f64(0), -15.0);
        assert_eq!(b.clone().plus(a.clone()).to_f64(0), -15.0);
        let z = SignedWide::from_i128_shifted(-25, 0).plus(b);
        assert!(!z.negative && z.magnitude.is_zero());
        let (q, r) = Wide::from_u128(1000).shl(100).div_rem_u64(7);
        assert_eq!(r, ((1000u128 << 100) % 7) as u64);
        assert_eq!(q, Wide::from_u128((1000u128 << 100) / 7));
        assert!(Wide::from_u128(8).any_below(4) && !Wide::from_u128(16).any_below(4));
    }
}
