//! Pull receipts: what a [`Puller`](super::Puller) hands out with each delivery and takes
//! back to settle it.
//!
//! A receipt names one delivery's stream entry and its lease: `<lane>.<entry id>.<lease
//! end, unix ms>.<attempt>.<mac>`, where the lane is the index of the shard's priority lane
//! (see [`LaneId`]), the lease end is the score the group's timers
//! ZSET holds for the entry while this delivery owns it, and the MAC is HMAC-SHA256 (first
//! 16 bytes, hex) over those fields and the queue, group and consumer, under the puller's
//! key. A receipt cannot be forged or moved to another entry, group or puller; it is
//! honoured only while the timer still holds its lease end (compare-and-set, `extend.lua`),
//! so a lease that ran out and was taken over makes it stale (`lease_lost`).

use super::LaneId;
use crate::engine::error::InvalidInput;
use hmac::{Hmac, Mac};
use sha2::Sha256;

/// Bytes of the MAC kept in a receipt (128 bits).
const MAC_BYTES: usize = 16;

/// The fields a receipt carries.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) struct Receipt {
    /// The lane.
    pub lane: LaneId,
    /// The stream entry id.
    pub entry_id: String,
    /// The lease end the timers ZSET holds for this delivery, unix ms.
    pub lease_until: i64,
    /// The delivery's attempt (its delivery count).
    pub attempt: u32,
}

/// Signs and checks receipts for one puller (queue, group, consumer) under one key.
pub(super) struct Signer {
    /// The MAC keyed and fed the receipts' prefix and scope (`queue \0 group \0 consumer
    /// \0`, which binds every receipt to its puller), made once: each receipt clones it.
    keyed: Hmac<Sha256>,
}

impl std::fmt::Debug for Signer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The key never reaches a log.
        f.debug_struct("Signer").finish_non_exhaustive()
    }
}

fn bad(reason: &'static str) -> InvalidInput {
    InvalidInput::Receipt { reason }
}

impl Signer {
    /// A signer for `queue`/`group`/`consumer` with `key`.
    pub(super) fn new(key: Vec<u8>, queue: &str, group: &str, consumer: &str) -> Self {
        let mut scope = Vec::new();
        for part in [queue, group, consumer] {
            scope.extend_from_slice(part.as_bytes());
            scope.push(0);
        }
        // HMAC takes a key of any length.
        let mut keyed = Hmac::<Sha256>::new_from_slice(&key)
            .unwrap_or_else(|_| unreachable!("HMAC accepts any key length"));
        keyed.update(b"delayq-receipt-v1\0");
        keyed.update(&scope);
        Signer { keyed }
    }

    fn mac(&self, body: &str) -> Hmac<Sha256> {
        let mut m = self.keyed.clone();
        m.update(body.as_bytes());
        m
    }

    /// The receipt text for `r`.
    pub(super) fn sign(&self, r: &Receipt) -> String {
        let body = format!(
            "{}.{}.{}.{}",
            r.lane.number(),
            r.entry_id,
            r.lease_until,
            r.attempt
        );
        let tag = self.mac(&body).finalize().into_bytes();
        let mut out = body;
        out.push('.');
        const HEX: &[u8; 16] = b"0123456789abcdef";
        for b in &tag[..MAC_BYTES] {
            out.push(char::from(HEX[usize::from(b >> 4)]));
            out.push(char::from(HEX[usize::from(b & 0xf)]));
        }
        out
    }

    /// The fields of `text`, when this signer issued it; lanes at or past `lanes` are
    /// refused.
    pub(super) fn open(&self, text: &str, lanes: usize) -> Result<Receipt, InvalidInput> {
        if text.len() > 200 {
            return Err(bad("too long"));
        }
        let (body, tag) = text.rsplit_once('.').ok_or(bad("malformed"))?;
        if tag.len() != MAC_BYTES * 2 {
            return Err(bad("malformed"));
        }
        let mut raw = [0u8; MAC_BYTES];
        for (i, b) in raw.iter_mut().enumerate() {
            *b = u8::from_str_radix(tag.get(2 * i..2 * i + 2).ok_or(bad("malformed"))?, 16)
                .map_err(|_| bad("malformed"))?;
        }
        self.mac(body)
            .verify_truncated_left(&raw)
            .map_err(|_| bad("not issued by this puller (forged, altered, or of another group)"))?;
        let mut parts = body.split('.');
        let (Some(lane), Some(entry_id), Some(lease), Some(attempt), None) = (
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
        ) else {
            return Err(bad("malformed"));
        };
        let lane: u16 = lane.parse().map_err(|_| bad("malformed"))?;
        let lane = LaneId::checked(lane, lanes)
            .ok_or_else(|| bad("names a lane this queue does not have"))?;
        Ok(Receipt {
            lane,
            entry_id: entry_id.to_owned(),
            lease_until: lease.parse().map_err(|_| bad("malformed"))?,
            attempt: attempt.parse().map_err(|_| bad("malformed"))?,
        })
    }
}

/// 32 random bytes from the operating system, for a puller's default key.
pub(super) fn random_key() -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let mut key = vec![0u8; 32];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut key)?;
    Ok(key)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn signer() -> Signer {
        Signer::new(b"k".to_vec(), "q", "g", "c")
    }

    fn sample() -> Receipt {
        Receipt {
            lane: LaneId(1),
            entry_id: "1700000000000-3".into(),
            lease_until: 1_700_000_030_000,
            attempt: 2,
        }
    }

    #[test]
    fn a_signed_receipt_opens_to_its_fields() {
        let text = signer().sign(&sample());
        assert_eq!(signer().open(&text, 3), Ok(sample()));
    }

    #[test]
    fn a_receipt_is_the_documented_hmac_so_every_version_of_a_deployment_reads_it() {
        // HMAC-SHA256(key, "delayq-receipt-v1\0" queue\0 group\0 consumer\0 body), first
        // 16 bytes in hex, computed outside (Python's hmac module).
        assert_eq!(
            signer().sign(&sample()),
            "1.1700000000000-3.1700000030000.2.7a960bfadf4a1cf65eab4fab43277441"
        );
    }

    #[test]
    fn altered_foreign_and_malformed_receipts_are_refused() {
        let text = signer().sign(&sample());
        // Another lease end, same MAC.
        let altered = text.replacen("1700000030000", "1700000099000", 1);
        assert!(signer().open(&altered, 3).is_err());
        // Another group's or consumer's signer, or another key.
        assert!(
            Signer::new(b"k".to_vec(), "q", "h", "c")
                .open(&text, 3)
                .is_err()
        );
        assert!(
            Signer::new(b"k".to_vec(), "q", "g", "d")
                .open(&text, 3)
                .is_err()
        );
        assert!(
            Signer::new(b"x".to_vec(), "q", "g", "c")
                .open(&text, 3)
                .is_err()
        );
        for junk in ["", "a.b", "1.2.3.4.zz", &"9".repeat(300)] {
            let e = signer().open(junk, 3).unwrap_err();
            assert!(matches!(e, InvalidInput::Receipt { .. }), "{junk:?}: {e}");
            assert_eq!(e.code(), "invalid_receipt");
        }
        // A lane past the queue's.
        assert!(signer().open(&text, 1).is_err());
    }
}
