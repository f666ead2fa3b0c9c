//! The Redis server's version, checked once at connect: below [`MIN_VERSION`] a clear
//! error names the version found and the one required.

use crate::error::Result;
use redis::aio::ConnectionLike;

/// The oldest server delayq runs on.
pub const MIN_VERSION: (u32, u32, u32) = (6, 2, 0);

/// Checks the server behind `conn` (stub: filled in by the version-matrix work).
pub async fn check<C: ConnectionLike>(_conn: &mut C) -> Result<()> {
    Ok(())
}
