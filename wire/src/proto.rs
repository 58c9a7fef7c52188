//! The generated `refract.v1` wire types, clients and servers.
#![allow(missing_docs, clippy::all)]

tonic::include_proto!("refract.v1");

/// The encoded file descriptor set of `refract.v1`, served by gRPC server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("refract_descriptor");

/// The wire protocol version this build speaks (see `Hello.protocol_version`).
pub const PROTOCOL_VERSION: u32 = 1;

impl ObjectRef {
    /// A short `kind ns/name` form for logs and errors.
    pub fn display(&self) -> String {
        format!("{} {}/{}", self.kind, self.namespace, self.name)
    }
}
