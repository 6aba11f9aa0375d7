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

#[cfg(test)]
mod tests {
    use super::*;

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
