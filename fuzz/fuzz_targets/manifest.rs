//! Any bytes as a manifest file: decoded, defaulted, validated and made static, or refused with
//! reasons; never a panic, a hang or an unbounded allocation.
#![no_main]

use libfuzzer_sys::fuzz_target;
use nodelet::pod::StaticOrigin;

fuzz_target!(|data: &[u8]| {
    let _ = nodelet::sources::manifest(
        data,
        "node",
        (
            StaticOrigin::File("/etc/kubernetes/manifests/fuzz.yaml"),
            nodelet::sources::ApiReferences::Refused,
        ),
        "2026-01-01T00:00:00Z",
    );
});
