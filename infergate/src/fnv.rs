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
}
