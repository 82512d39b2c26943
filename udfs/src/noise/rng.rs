//! The CSPRNG.
use rand::{RngCore, SeedableRng};
use rand_chacha::ChaCha20Rng;

/// ChaCha20, seeded from the OS. Not `Clone`: a stream of noise is never duplicated.
pub struct SecureRng {
    inner: ChaCha20Rng,
}

impl SecureRng {
    /// Seeded from the operating system's entropy source (`getrandom`).
    pub fn from_os_entropy() -> Self {
        SecureRng {
            inner: ChaCha20Rng::from_os_rng(),
        }
    }

    /// A fixed seed, for reproducible tests only. Never reachable from SQL or the REPL.
    pub fn insecure_from_seed(seed: u64) -> Self {
        SecureRng {
            inner: ChaCha20Rng::seed_from_u64(seed),
        }
    }

    pub fn next_u64(&mut self) -> u64 {
        self.inner.next_u64()
    }

    /// Uniform integer in [0, n), n > 0, without modulo bias (rejection sampling on the
    /// smallest power-of-two range that holds n).
    pub fn uniform_below(&mut self, n: u128) -> u128 {
        assert!(n > 0, "uniform_below(0)");
        if n == 1 {
            return 0;
        }
        let bits = 128 - (n - 1).leading_zeros();
        let mask = if bits == 128 {
            u128::MAX
        } else {
            (1u128 << bits) - 1
        };
        loop {
            let x = if bits <= 64 {
                self.next_u64() as u128
            } else {
                ((self.next_u64() as u128) << 64) | self.next_u64() as u128
            } & mask;
            if x < n {
                return x;
            }
        }
    }

    /// Uniform f64 in [0, 1) with 53 random bits. For non-privacy uses only (e.g. test data).
    pub fn uniform_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// A fair coin.
    pub fn coin(&mut self) -> bool {
        self.next_u64() & 1 == 1
    }
}

impl std::fmt::Debug for SecureRng {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SecureRng(..)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uniform_below_is_uniform() {
        // 60 000 draws in [0, 6): each count ~ Binomial(60000, 1/6), sd ≈ 91.3; chi-square with
        // 5 degrees of freedom must stay below 20.5 (p = 0.999).
        let mut rng = SecureRng::insecure_from_seed(1);
        let mut counts = [0u32; 6];
        for _ in 0..60_000 {
            counts[rng.uniform_below(6) as usize] += 1;
        }
        let chi2: f64 = counts
            .iter()
            .map(|&c| (c as f64 - 10_000.0).powi(2) / 10_000.0)
            .sum();
        assert!(chi2 < 20.5, "{counts:?}");
        let big = (1u128 << 100) + 3;
        assert!((0..1000).all(|_| rng.uniform_below(big) < big));
    }

    #[test]
    fn os_seeded_streams_differ() {
        let a = SecureRng::from_os_entropy().next_u64();
        let b = SecureRng::from_os_entropy().next_u64();
        assert_ne!(a, b);
        let mut x = SecureRng::insecure_from_seed(7);
        let mut y = SecureRng::insecure_from_seed(7);
        assert_eq!(x.next_u64(), y.next_u64());
    }
}
