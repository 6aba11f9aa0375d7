//! Kubernetes resource quantities (`128Mi`, `1G`, `500m`, `1e3`) read as numbers.

/// The quantity as a number of base units (bytes for memory, cores for cpu), or `None` when the
/// text is not a quantity.
pub fn parse_quantity(text: &str) -> Option<f64> {
    let s = text.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == '-'))
        .unwrap_or(s.len());
    let (number, suffix) = s.split_at(split);
    let number: f64 = number.parse().ok()?;
    let factor = match suffix {
        "" => 1.0,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        "Ki" => 1024f64,
        "Mi" => 1024f64.powi(2),
        "Gi" => 1024f64.powi(3),
        "Ti" => 1024f64.powi(4),
        "Pi" => 1024f64.powi(5),
        "Ei" => 1024f64.powi(6),
        exp if exp.starts_with(['e', 'E']) => 10f64.powi(exp[1..].parse().ok()?),
        _ => return None,
    };
    Some(number * factor)
}

/// A container's request (`limits` false) or limit (`limits` true) of `resource`, as a number.
pub fn container_quantity(
    c: &k8s_openapi::api::core::v1::Container,
    limits: bool,
    resource: &str,
) -> Option<f64> {
    let res = c.resources.as_ref()?;
    let map = if limits {
        res.limits.as_ref()
    } else {
        res.requests.as_ref()
    }?;
    parse_quantity(&map.get(resource)?.0)
}

/// A whole number of bytes (or other base units) as a quantity, in the largest unit that divides
/// it: binary units (`Ki` to `Ti`) or decimal ones (`k` to `T`); the bare number otherwise.
pub fn format_quantity(total: u64, binary: bool) -> String {
    let units: &[(&str, u64)] = if binary {
        &[
            ("Ti", 1 << 40),
            ("Gi", 1 << 30),
            ("Mi", 1 << 20),
            ("Ki", 1 << 10),
        ]
    } else {
        &[
            ("T", 1_000_000_000_000),
            ("G", 1_000_000_000),
            ("M", 1_000_000),
            ("k", 1_000),
        ]
    };
    units
        .iter()
        .find(|(_, size)| total > 0 && total.is_multiple_of(*size))
        .map_or_else(
            || total.to_string(),
            |(unit, size)| format!("{}{unit}", total / size),
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_are_written_in_the_largest_unit_that_divides_them() {
        assert_eq!(format_quantity(10 << 20, true), "10Mi");
        assert_eq!(format_quantity(1 << 40, true), "1Ti");
        assert_eq!(format_quantity(3072, true), "3Ki");
        assert_eq!(format_quantity(1536, true), "1536");
        assert_eq!(format_quantity(1000, true), "1000");
        assert_eq!(format_quantity(2_000_000, false), "2M");
        assert_eq!(format_quantity(0, false), "0");
    }

    #[test]
    fn quantities_parse() {
        assert_eq!(parse_quantity("64Mi"), Some(64.0 * 1024.0 * 1024.0));
        assert_eq!(parse_quantity("1G"), Some(1e9));
        assert_eq!(parse_quantity("500m"), Some(0.5));
        assert_eq!(parse_quantity("2"), Some(2.0));
        assert_eq!(parse_quantity("1e3"), Some(1000.0));
        assert_eq!(parse_quantity("12Zi"), None);
        assert_eq!(parse_quantity(""), None);
    }
}
