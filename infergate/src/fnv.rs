//! FNV-1a (64-bit): the one byte hash the router's keys are built from (prefix blocks, session lineages, KV-event
//! block hashes, the tokenizer's kept prefixes). Deterministic across processes and builds: a session's lineage is
//! written to the state file.

/// FNV-1a's 64-bit offset basis: the hash of no bytes.
pub const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const PRIME: u64 = 0x0000_0100_0000_01b3;

/// `h` extended by `bytes`.
pub fn fnv1a(h: u64, bytes: &[u8]) -> u64 {
    bytes
        .iter()
        .fold(h, |h, &b| (h ^ u64::from(b)).wrapping_mul(PRIME))
}

/// FNV-1a as a `Hasher`, for maps keyed by the router's own ids (no client-chosen keys, so nothing for SipHash's
/// keyed defence to defend against; SipHash costs several times more per lookup).
#[derive(Debug, Clone, Copy)]
pub struct FnvHasher(u64);

impl Default for FnvHasher {
    fn default() -> FnvHasher {
        FnvHasher(OFFSET)
    }
}

impl std::hash::Hasher for FnvHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        self.0 = fnv1a(self.0, bytes);
    }
}

/// Builds [`FnvHasher`]s: `HashMap<K, V, BuildFnv>`.
pub type BuildFnv = std::hash::BuildHasherDefault<FnvHasher>;

#[cfg(test)]
mod tests {
    #[test]
    fn it_is_fnv1a_64() {
        // The published test vectors.
        assert_eq!(super::fnv1a(super::OFFSET, b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(super::fnv1a(super::OFFSET, b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(
            super::fnv1a(super::OFFSET, b"foobar"),
            0x8594_4171_f739_67e8
        );
    }

    #[test]
    fn the_hasher_is_fnv1a_of_the_written_bytes() {
        use std::hash::{BuildHasher, Hasher};
        let mut h = super::FnvHasher::default();
        h.write(b"foobar");
        assert_eq!(h.finish(), 0x8594_4171_f739_67e8);
        let b = super::BuildFnv::default();
        assert_eq!(
            b.hash_one(7u64),
            super::fnv1a(super::OFFSET, &7u64.to_ne_bytes())
        );
    }
}
