//! Signal names as `lifecycle.stopSignal` spells them (`SIGTERM`, `SIGRTMIN+3`), to numbers:
//! Linux's, and the CRI's `Signal` enum's.

/// The CRI's `Signal` values 1 to 34, in order (0 is the runtime's default); the real-time
/// signals follow from 35.
const CRI_SIGNALS: [&str; 34] = [
    "SIGABRT",
    "SIGALRM",
    "SIGBUS",
    "SIGCHLD",
    "SIGCLD",
    "SIGCONT",
    "SIGFPE",
    "SIGHUP",
    "SIGILL",
    "SIGINT",
    "SIGIO",
    "SIGIOT",
    "SIGKILL",
    "SIGPIPE",
    "SIGPOLL",
    "SIGPROF",
    "SIGPWR",
    "SIGQUIT",
    "SIGSEGV",
    "SIGSTKFLT",
    "SIGSTOP",
    "SIGSYS",
    "SIGTERM",
    "SIGTRAP",
    "SIGTSTP",
    "SIGTTIN",
    "SIGTTOU",
    "SIGURG",
    "SIGUSR1",
    "SIGUSR2",
    "SIGVTALRM",
    "SIGWINCH",
    "SIGXCPU",
    "SIGXFSZ",
];

/// The CRI `Signal` value of `name`, or `None` when it names no signal.
pub fn cri_signal(name: &str) -> Option<i32> {
    if let Some(i) = CRI_SIGNALS.iter().position(|s| *s == name) {
        return i32::try_from(i).ok().map(|i| i + 1);
    }
    // SIGRTMIN is 35, SIGRTMIN+1..+15 36..50, SIGRTMAX-14..-1 51..64, SIGRTMAX 65: the same
    // order as the Linux numbers 34..64.
    signal_number(name)
        .filter(|n| (34..=64).contains(n))
        .map(|n| n + 1)
}

/// The Linux signal number of `name`, or `None` when it names no signal.
pub fn signal_number(name: &str) -> Option<i32> {
    let fixed = match name {
        "SIGABRT" | "SIGIOT" => libc::SIGABRT,
        "SIGALRM" => libc::SIGALRM,
        "SIGBUS" => libc::SIGBUS,
        "SIGCHLD" => libc::SIGCHLD,
        "SIGCONT" => libc::SIGCONT,
        "SIGFPE" => libc::SIGFPE,
        "SIGHUP" => libc::SIGHUP,
        "SIGILL" => libc::SIGILL,
        "SIGINT" => libc::SIGINT,
        "SIGIO" | "SIGPOLL" => libc::SIGIO,
        "SIGKILL" => libc::SIGKILL,
        "SIGPIPE" => libc::SIGPIPE,
        "SIGPROF" => libc::SIGPROF,
        "SIGPWR" => libc::SIGPWR,
        "SIGQUIT" => libc::SIGQUIT,
        "SIGSEGV" => libc::SIGSEGV,
        "SIGSTKFLT" => libc::SIGSTKFLT,
        "SIGSTOP" => libc::SIGSTOP,
        "SIGSYS" => libc::SIGSYS,
        "SIGTERM" => libc::SIGTERM,
        "SIGTRAP" => libc::SIGTRAP,
        "SIGTSTP" => libc::SIGTSTP,
        "SIGTTIN" => libc::SIGTTIN,
        "SIGTTOU" => libc::SIGTTOU,
        "SIGURG" => libc::SIGURG,
        "SIGUSR1" => libc::SIGUSR1,
        "SIGUSR2" => libc::SIGUSR2,
        "SIGVTALRM" => libc::SIGVTALRM,
        "SIGWINCH" => libc::SIGWINCH,
        "SIGXCPU" => libc::SIGXCPU,
        "SIGXFSZ" => libc::SIGXFSZ,
        _ => 0,
    };
    if fixed != 0 {
        return Some(fixed);
    }
    // The real-time signals: SIGRTMIN, SIGRTMIN+1..+15, SIGRTMAX-14..-1, SIGRTMAX (34 to 64).
    let (min, max) = (34, 64);
    let offset = |text: &str| text.parse::<i32>().ok().filter(|n| (1..=15).contains(n));
    match name {
        "SIGRTMIN" => Some(min),
        "SIGRTMAX" => Some(max),
        _ => name
            .strip_prefix("SIGRTMIN+")
            .and_then(offset)
            .map(|n| min + n)
            .or_else(|| {
                name.strip_prefix("SIGRTMAX-")
                    .and_then(offset)
                    .map(|n| max - n)
            }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_map_to_linux_numbers() {
        assert_eq!(signal_number("SIGTERM"), Some(15));
        assert_eq!(signal_number("SIGUSR1"), Some(10));
        assert_eq!(signal_number("SIGRTMIN"), Some(34));
        assert_eq!(signal_number("SIGRTMIN+3"), Some(37));
        assert_eq!(signal_number("SIGRTMAX-1"), Some(63));
        for bad in ["TERM", "SIGRTMIN+16", "SIGRTMAX-0", "sigterm", ""] {
            assert_eq!(signal_number(bad), None, "{bad}");
            assert_eq!(cri_signal(bad), None, "{bad}");
        }
    }

    #[test]
    fn names_map_to_the_cris_signal_values() {
        for (name, value) in [
            ("SIGABRT", 1),
            ("SIGKILL", 13),
            ("SIGTERM", 23),
            ("SIGUSR1", 29),
            ("SIGXFSZ", 34),
            ("SIGRTMIN", 35),
            ("SIGRTMIN+3", 38),
            ("SIGRTMIN+15", 50),
            ("SIGRTMAX-14", 51),
            ("SIGRTMAX-1", 64),
            ("SIGRTMAX", 65),
        ] {
            assert_eq!(cri_signal(name), Some(value), "{name}");
        }
    }
}
