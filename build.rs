//! Generates the admin API (proto/admin.proto) for the server and the CLI.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/admin.proto");
    tonic_prost_build::configure().compile_protos(&["proto/admin.proto"], &["proto"])?;
    Ok(())
}
