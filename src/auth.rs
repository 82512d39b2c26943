//! Analysts' bearer tokens. The catalog stores no token, only `sha256:<salt>:<hash>`: a random
//! salt per analyst and SHA-256(salt ‖ token), both hex. A presented token is hashed with every
//! analyst's salt and compared in constant time, with every analyst compared, so neither the
//! time nor the error tells which analyst or how much of a hash matched.
use rand::RngCore;
use sha2::{Digest, Sha256};

/// A stored token hash (`[[analyst]] token_hash`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenHash {
    salt: Vec<u8>,
    hash: [u8; 32],
}

/// A malformed `token_hash`.
#[derive(Debug, thiserror::Error)]
#[error(
    "token_hash must be 'sha256:<salt hex>:<64 hex digits>', as 'dpfusion token' prints it ({0})"
)]
pub struct BadTokenHash(&'static str);

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) || !s.is_ascii() {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).ok())
        .collect()
}

fn digest(salt: &[u8], token: &[u8]) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(salt);
    h.update(token);
    h.finalize().into()
}

/// Equal bytes, in time that depends only on the lengths.
fn constant_time_eq(a: &[u8; 32], b: &[u8; 32]) -> bool {
    let diff = a
        .iter()
        .zip(b.iter())
        .fold(0u8, |acc, (x, y)| acc | std::hint::black_box(x ^ y));
    std::hint::black_box(diff) == 0
}

impl TokenHash {
    /// The hash of `token` under a fresh random 16-byte salt.
    pub fn new(token: &str) -> Self {
        let mut salt = vec![0u8; 16];
        rand::rng().fill_bytes(&mut salt);
        let hash = digest(&salt, token.as_bytes());
        Self { salt, hash }
    }

    pub fn parse(s: &str) -> Result<Self, BadTokenHash> {
        let mut parts = s.trim().split(':');
        let (Some("sha256"), Some(salt), Some(hash), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(BadTokenHash("three parts separated by ':'"));
        };
        let salt = unhex(salt).ok_or(BadTokenHash("the salt is not hex"))?;
        if salt.len() < 8 {
            return Err(BadTokenHash("the salt must have at least 8 bytes"));
        }
        let hash: [u8; 32] = unhex(hash)
            .and_then(|h| h.try_into().ok())
            .ok_or(BadTokenHash("the hash is not 64 hex digits"))?;
        Ok(Self { salt, hash })
    }

    /// Whether `token` hashes to this (in constant time).
    pub fn matches(&self, token: &str) -> bool {
        constant_time_eq(&digest(&self.salt, token.as_bytes()), &self.hash)
    }
}

impl std::fmt::Display for TokenHash {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "sha256:{}:{}", hex(&self.salt), hex(&self.hash))
    }
}

/// A fresh random token: 32 random bytes, hex.
pub fn new_token() -> String {
    let mut b = [0u8; 32];
    rand::rng().fill_bytes(&mut b);
    hex(&b)
}

/// The analysts of a server and their token hashes.
#[derive(Debug, Clone, Default)]
pub struct Analysts(Vec<(String, TokenHash)>);

impl Analysts {
    pub fn new(list: Vec<(String, TokenHash)>) -> Self {
        Self(list)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// How many analysts.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// The analyst whose token this is. Every analyst's hash is computed and compared, whatever
    /// matches first.
    pub fn authenticate(&self, token: &str) -> Option<&str> {
        // No token is this long (`dpfusion token` makes 64 characters): refused unhashed, so a
        // stranger's header costs no work in its length.
        if token.len() > 1024 {
            return None;
        }
        let mut found = None;
        for (name, hash) in &self.0 {
            if hash.matches(token) && found.is_none() {
                found = Some(name.as_str());
            }
        }
        found
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hash_round_trips_and_matches_only_its_token() {
        let t = new_token();
        let h = TokenHash::new(&t);
        let parsed = TokenHash::parse(&h.to_string()).unwrap();
        assert_eq!(parsed, h);
        assert!(parsed.matches(&t));
        assert!(!parsed.matches(&format!("{t}x")));
        assert!(!parsed.matches(""));
        // Salted: the same token hashes differently twice.
        assert_ne!(TokenHash::new(&t).to_string(), h.to_string());
        let a = Analysts::new(vec![
            ("alice".into(), h),
            ("bob".into(), TokenHash::new("bob-token")),
        ]);
        assert_eq!(a.authenticate(&t), Some("alice"));
        assert_eq!(a.authenticate("bob-token"), Some("bob"));
        assert_eq!(a.authenticate("nobody"), None);
    }

    #[test]
    fn malformed_hashes_are_refused_with_the_expected_form() {
        for bad in [
            "",
            "sha1:00:00",
            "sha256:zz:00",
            "sha256:0011223344556677:00",
            "sha256:00:".to_string().as_str(),
            "sha256:0011223344556677:00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff:x",
        ] {
            let e = TokenHash::parse(bad).unwrap_err().to_string();
            assert!(e.contains("dpfusion token"), "{e}");
        }
    }
}
