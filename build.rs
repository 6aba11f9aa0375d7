//! Generates the admin API (proto/admin.proto) for the server and the CLI, and the kubelet's
//! pod-resources (proto/podresources.proto) and device plugin (proto/deviceplugin.proto) APIs,
//! servers and clients both (the tests play the other side).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/admin.proto");
    println!("cargo:rerun-if-changed=proto/podresources.proto");
    println!("cargo:rerun-if-changed=proto/deviceplugin.proto");
    tonic_prost_build::configure().compile_protos(
        &[
            "proto/admin.proto",
            "proto/podresources.proto",
            "proto/deviceplugin.proto",
        ],
        &["proto"],
    )?;
    Ok(())
}
