//! A set of CPU ids in the kernel's list format (`0-3,5`), as cpusets and upstream's state
//! files write them.

use std::collections::BTreeSet;
use std::fmt;

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CpuSet(BTreeSet<u32>);

impl CpuSet {
    /// Parses `0-3,5` (the empty string is the empty set).
    pub fn parse(text: &str) -> Result<CpuSet, String> {
        let mut set = BTreeSet::new();
        for part in text.trim().split(',').filter(|p| !p.is_empty()) {
            let number = |s: &str| {
                s.trim()
                    .parse::<u32>()
                    .map_err(|_| format!("{text:?} is not a CPU list like 0-3,5"))
            };
            match part.split_once('-') {
                Some((a, b)) => {
                    let (a, b) = (number(a)?, number(b)?);
                    if a > b || b - a > 65_536 {
                        return Err(format!(
                            "{text:?}: the range {part:?} is not from low to high"
                        ));
                    }
                    set.extend(a..=b);
                }
                None => {
                    set.insert(number(part)?);
                }
            }
        }
        Ok(CpuSet(set))
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn contains(&self, cpu: u32) -> bool {
        self.0.contains(&cpu)
    }

    pub fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        self.0.iter().copied()
    }

    pub fn union(&self, other: &CpuSet) -> CpuSet {
        CpuSet(self.0.union(&other.0).copied().collect())
    }

    pub fn difference(&self, other: &CpuSet) -> CpuSet {
        CpuSet(self.0.difference(&other.0).copied().collect())
    }

    pub fn is_subset(&self, other: &CpuSet) -> bool {
        self.0.is_subset(&other.0)
    }
}

impl FromIterator<u32> for CpuSet {
    fn from_iter<I: IntoIterator<Item = u32>>(iter: I) -> CpuSet {
        CpuSet(iter.into_iter().collect())
    }
}

impl fmt::Display for CpuSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut cpus = self.0.iter().copied().peekable();
        let mut first = true;
        while let Some(start) = cpus.next() {
            let mut end = start;
            while cpus.peek() == Some(&(end + 1)) {
                end += 1;
                cpus.next();
            }
            if !first {
                f.write_str(",")?;
            }
            first = false;
            if end == start {
                write!(f, "{start}")?;
            } else {
                write!(f, "{start}-{end}")?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_read_and_write_the_kernels_way() {
        let set = CpuSet::parse("0-3,5,7-8").unwrap();
        assert_eq!(set.len(), 7);
        assert_eq!(set.to_string(), "0-3,5,7-8");
        assert_eq!(CpuSet::parse("").unwrap().to_string(), "");
        assert_eq!(CpuSet::parse("3,1,2\n").unwrap().to_string(), "1-3");
        assert!(CpuSet::parse("a").is_err());
        assert!(CpuSet::parse("3-1").is_err());
    }
}
