//! Size limits both agents hold to, so that no single object can end a stream.
//!
//! The local agent never sends an object larger than [`MAX_OBJECT_BYTES`] (it records a
//! Warning on the origin object instead), the remote agent refuses one with a clear outcome,
//! and the stream's message limit leaves room above it, so an oversize object is a refused
//! request, not a broken stream resent forever.

/// The largest object, in bytes of JSON, either agent accepts: etcd's default request limit
/// (1.5 MiB), beyond which the provider's API server would refuse the write anyway.
pub const MAX_OBJECT_BYTES: usize = 1536 * 1024;

/// The largest gRPC message either agent decodes: one object at [`MAX_OBJECT_BYTES`] and its
/// envelope fit with room to spare.
pub const MAX_MESSAGE_BYTES: usize = 4 * 1024 * 1024;

/// HTTP/2 flow-control window of each call on the link, in both directions.
pub const STREAM_WINDOW_BYTES: u32 = 256 * 1024;

/// HTTP/2 flow-control window of the whole link, in both directions.
pub const CONNECTION_WINDOW_BYTES: u32 = 16 * 1024 * 1024;

/// The most kubelet calls one tenant may have open at once: every call may fill its window
/// (a `logs -f` nobody reads), and the reflection stream and the link's other calls still need
/// room in the connection's window, so the calls together never take more than the connection
/// window less four calls' worth.
pub const MAX_KUBELET_SESSIONS: u32 = CONNECTION_WINDOW_BYTES / STREAM_WINDOW_BYTES - 4;

const _: () = assert!(
    MAX_KUBELET_SESSIONS >= 32,
    "the default of 32 sessions fits"
);

/// An object over [`MAX_OBJECT_BYTES`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the object is {size} bytes of JSON, over the limit of {MAX_OBJECT_BYTES} bytes")]
pub struct TooLarge {
    /// The object's size.
    pub size: usize,
}

/// Refuses an object of `size` bytes of JSON over [`MAX_OBJECT_BYTES`].
pub fn check_object_size(size: usize) -> Result<(), TooLarge> {
    if size > MAX_OBJECT_BYTES {
        Err(TooLarge { size })
    } else {
        Ok(())
    }
}
