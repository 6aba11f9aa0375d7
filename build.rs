//! Generates the admin API (proto/admin.proto) for the server and the CLI, and the kubelet's
//! pod-resources (proto/podresources.proto), device plugin (proto/deviceplugin.proto), plugin
//! registration (proto/pluginregistration.proto) and DRA plugin (proto/dra.proto) APIs, servers
//! and clients both (the tests play the other side).

const PROTOS: [&str; 5] = [
    "proto/admin.proto",
    "proto/podresources.proto",
    "proto/deviceplugin.proto",
    "proto/pluginregistration.proto",
    "proto/dra.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    for proto in PROTOS {
        println!("cargo:rerun-if-changed={proto}");
    }
    tonic_prost_build::configure().compile_protos(&PROTOS, &["proto"])?;
    Ok(())
}
