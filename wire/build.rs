//! Compiles `proto/refract/v1` with a pure-Rust protobuf compiler (protox), so a fresh machine
//! needs no `protoc`. The encoded descriptor set is kept for gRPC server reflection.
use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?).join("../proto");
    let files = [
        root.join("refract/v1/reflection.proto"),
        root.join("refract/v1/inspect.proto"),
        root.join("refract/v1/kubelet.proto"),
    ];
    for f in &files {
        println!("cargo:rerun-if-changed={}", f.display());
    }
    let fds = protox::compile(&files, [&root])?;
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    // compile_fds does not write the descriptor set itself; reflection needs it on disk.
    std::fs::write(
        out.join("refract_descriptor.bin"),
        prost::Message::encode_to_vec(&fds),
    )?;
    tonic_prost_build::configure()
        .btree_map(".")
        // Shared, not copied, between the remote agent's pod store and its outbox, which keeps
        // every pod's last status to send (see `remote-agent/src/pod_status.rs`).
        .bytes(".refract.v1.PodStatus.status_json")
        .compile_fds(fds)?;
    Ok(())
}
