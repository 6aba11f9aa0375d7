//! Facts about the host the agent runs on and checks of them: the kernel settings the kubelet
//! expects (upstream's setupKernelTunables).

/// The kernel settings the kubelet expects, with their /proc/sys paths and values.
const KERNEL_DEFAULTS: [(&str, &str, i64); 6] = [
    ("vm.overcommit_memory", "vm/overcommit_memory", 1),
    ("vm.panic_on_oom", "vm/panic_on_oom", 0),
    ("kernel.panic", "kernel/panic", 10),
    ("kernel.panic_on_oops", "kernel/panic_on_oops", 1),
    (
        "kernel.keys.root_maxkeys",
        "kernel/keys/root_maxkeys",
        1_000_000,
    ),
    (
        "kernel.keys.root_maxbytes",
        "kernel/keys/root_maxbytes",
        25_000_000,
    ),
];

/// Each kernel setting that differs from what the kubelet expects (or cannot be read), as
/// "name is X, expected Y", reading each through `read` (a /proc/sys path).
fn kernel_differences(read: impl Fn(&str) -> std::io::Result<String>) -> Vec<String> {
    KERNEL_DEFAULTS
        .iter()
        .filter_map(|(name, path, expected)| match read(path) {
            Ok(text) => match text.trim().parse::<i64>() {
                Ok(v) if v == *expected => None,
                _ => Some(format!("{name} is {}, expected {expected}", text.trim())),
            },
            Err(e) => Some(format!("{name} cannot be read ({e}), expected {expected}")),
        })
        .collect()
}

/// This host's kernel settings that differ from what the kubelet expects.
pub fn kernel_defaults_differences() -> Vec<String> {
    kernel_differences(|path| std::fs::read_to_string(std::path::Path::new("/proc/sys").join(path)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kernel_setting_that_differs_is_named_with_both_values() {
        let host = |path: &str| -> std::io::Result<String> {
            match path {
                "vm/overcommit_memory" => Ok("0\n".into()),
                "kernel/panic" => Ok("10\n".into()),
                "kernel/panic_on_oops" => Err(std::io::Error::from(std::io::ErrorKind::NotFound)),
                "vm/panic_on_oom" => Ok("0".into()),
                "kernel/keys/root_maxkeys" => Ok("1000000".into()),
                _ => Ok("200".into()),
            }
        };
        let found = kernel_differences(host);
        assert_eq!(found.len(), 3, "{found:?}");
        assert_eq!(found[0], "vm.overcommit_memory is 0, expected 1");
        assert!(found[1].starts_with("kernel.panic_on_oops cannot be read ("));
        assert_eq!(
            found[2],
            "kernel.keys.root_maxbytes is 200, expected 25000000"
        );
    }
}
