//! Generates the admin API (proto/admin.proto) for the server and the CLI, and the kubelet's
//! pod-resources (proto/podresources.proto), device plugin (proto/deviceplugin.proto) and plugin
//! registration (proto/pluginregistration.proto) APIs, servers and clients both (the tests play
//! the other side); and the messages of the DRA plugin API (proto/dra.proto), which nodelet
//! sends to whichever of the API's versions a driver serves, and of the DRA device health API
//! (proto/drahealth.proto).

const SERVICES: [&str; 4] = [
    "proto/admin.proto",
    "proto/podresources.proto",
    "proto/deviceplugin.proto",
    "proto/pluginregistration.proto",
];
const MESSAGES: [&str; 2] = ["proto/dra.proto", "proto/drahealth.proto"];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    for proto in SERVICES.iter().chain(&MESSAGES) {
        println!("cargo:rerun-if-changed={proto}");
    }
    tonic_prost_build::configure().compile_protos(&SERVICES, &["proto"])?;
    tonic_prost_build::configure()
        .build_client(false)
        .build_server(false)
        .compile_protos(&MESSAGES, &["proto"])?;
    Ok(())
}
