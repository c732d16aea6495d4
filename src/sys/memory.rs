//! Byte sizes as users write and read them, and the memory left to this process on the host
//! (MemAvailable, RLIMIT_AS, cgroup limits): what a default CPU budget is a share of.

use crate::{Error, Result};

/// Parse a byte size: `4GiB`, `512MiB`, `64KiB`, `2GB`, `500MB`, `10KB`, `123` or `123B`
/// (binary units for *iB, decimal for *B; fractions allowed: `1.5GiB`).
pub fn parse_bytes(s: &str) -> Result<u64> {
    let t = s.trim();
    let bad = || {
        Error::Invalid(format!(
            "memory size '{s}' is not a number with an optional unit (B, KB, MB, GB, KiB, MiB, GiB), e.g. 4GiB"
        ))
    };
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let x: f64 = num.parse().map_err(|_| bad())?;
    let mult: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" | "bytes" => 1.0,
        "kb" | "k" => 1e3,
        "mb" | "m" => 1e6,
        "gb" | "g" => 1e9,
        "tb" | "t" => 1e12,
        "kib" => 1024.0,
        "mib" => 1024.0 * 1024.0,
        "gib" => 1024.0 * 1024.0 * 1024.0,
        "tib" => 1024.0f64.powi(4),
        _ => return Err(bad()),
    };
    let v = x * mult;
    if !v.is_finite() || v < 1.0 || v > u64::MAX as f64 {
        return Err(bad());
    }
    Ok(v.round() as u64)
}

/// `1.50 GiB`-style size.
pub fn format_bytes(b: u64) -> String {
    const U: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut i = 0;
    while v >= 1024.0 && i < U.len() - 1 {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{b} B")
    } else {
        format!("{v:.2} {}", U[i])
    }
}

/// MemAvailable of /proc/meminfo in bytes.
pub fn mem_available() -> Option<u64> {
    parse_mem_available(&std::fs::read_to_string("/proc/meminfo").ok()?)
}

/// MemAvailable (bytes) of /proc/meminfo's text.
pub fn parse_mem_available(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kb.checked_mul(1024)
}

/// A cgroup limit file's value: None for `max` (v2) or the page-rounded i64::MAX that v1 writes
/// for "no limit".
pub fn parse_cgroup_limit(s: &str) -> Option<u64> {
    let v: u64 = s.trim().parse().ok()?;
    (v < 1 << 62).then_some(v)
}

/// The cgroup paths of a process from /proc/self/cgroup's text: (v2 unified path, v1 memory
/// controller path).
pub fn parse_proc_cgroup(text: &str) -> (Option<String>, Option<String>) {
    let (mut v2, mut v1) = (None, None);
    for line in text.lines() {
        let mut f = line.splitn(3, ':');
        let (Some(id), Some(ctrl), Some(path)) = (f.next(), f.next(), f.next()) else {
            continue;
        };
        if id == "0" && ctrl.is_empty() {
            v2 = Some(path.to_string());
        } else if ctrl.split(',').any(|c| c == "memory") {
            v1 = Some(path.to_string());
        }
    }
    (v2, v1)
}

/// The least memory left under any limited cgroup from `path` up to `root` (the hierarchy's
/// mount): `limit − usage` read from the files `limit` and `usage` in each folder. Leaf folders
/// missing from this mount (a container without a cgroup namespace) are skipped; a parent's limit
/// also binds the child, hence the walk up. Returns the bytes and the folder that set them.
pub fn cgroup_headroom(
    root: &std::path::Path,
    path: &str,
    limit: &str,
    usage: &str,
) -> Option<(u64, std::path::PathBuf)> {
    let rel: std::path::PathBuf = std::path::Path::new(path)
        .components()
        .filter(|c| matches!(c, std::path::Component::Normal(_)))
        .collect();
    let mut dir = root.join(rel);
    let mut best: Option<(u64, std::path::PathBuf)> = None;
    loop {
        let read = |f: &str| std::fs::read_to_string(dir.join(f)).ok();
        if let Some(max) = read(limit).as_deref().and_then(parse_cgroup_limit) {
            let used = read(usage)
                .and_then(|s| s.trim().parse::<u64>().ok())
                .unwrap_or(0);
            let left = max.saturating_sub(used);
            if best.as_ref().is_none_or(|(b, _)| left < *b) {
                best = Some((left, dir.clone()));
            }
        }
        if dir == root || !dir.pop() || !dir.starts_with(root) {
            return best;
        }
    }
}

/// Memory left to this process's cgroup (v2 `memory.max − memory.current`, v1
/// `memory.limit_in_bytes − memory.usage_in_bytes`), with a description; None when unlimited.
pub fn cgroup_available() -> Option<(u64, String)> {
    let text = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let (v2, v1) = parse_proc_cgroup(&text);
    let base = std::path::Path::new("/sys/fs/cgroup");
    let found = [
        v2.and_then(|p| cgroup_headroom(base, &p, "memory.max", "memory.current")),
        v1.and_then(|p| {
            cgroup_headroom(
                &base.join("memory"),
                &p,
                "memory.limit_in_bytes",
                "memory.usage_in_bytes",
            )
        }),
    ];
    found
        .into_iter()
        .flatten()
        .min_by_key(|(b, _)| *b)
        .map(|(b, dir)| (b, format!("cgroup memory left ({})", dir.display())))
}

/// The tightest of the host's memory limits: (bytes, what it is).
pub fn tightest(limits: impl IntoIterator<Item = Option<(u64, String)>>) -> Option<(u64, String)> {
    limits.into_iter().flatten().min_by_key(|(b, _)| *b)
}

/// Memory this process may still use on the host: the least of MemAvailable (the host's, not
/// ours under Slurm or Kubernetes), the address space left under RLIMIT_AS and the memory left
/// to its cgroup.
pub fn host_available() -> Option<(u64, String)> {
    tightest(host_limits())
}

/// The host's limits on this process, each with what it is: MemAvailable, the address space left
/// under RLIMIT_AS, the memory left to its cgroup.
fn host_limits() -> [Option<(u64, String)>; 3] {
    [
        mem_available().map(|m| (m, "available RAM".to_string())),
        crate::sys::alloc::address_space_left().map(|m| (m, RLIMIT_AS_LEFT.to_string())),
        cgroup_available(),
    ]
}

/// What the address space left under RLIMIT_AS is called in budget sources.
pub const RLIMIT_AS_LEFT: &str = "address space left under RLIMIT_AS";

/// Percent of a limit the default CPU budget takes. RAM and a cgroup's headroom: half (other
/// processes and the page cache share them, and the volume and outputs sit beside the working
/// set). The address space left under RLIMIT_AS: three quarters, since it is this process's own
/// and already net of what is mapped (the binary, the model); halving it too counted that margin
/// twice and refused the shipped sample under `ulimit -v 600M`, which runs in about 310 MB.
pub fn budget_percent(source: &str) -> u64 {
    if source == RLIMIT_AS_LEFT {
        75
    } else {
        50
    }
}

/// The default CPU budget: the least of each limit's share ([`budget_percent`]) of what
/// [`host_available`] considers, with a description; None when no limit is known.
pub fn host_budget() -> Option<(u64, String)> {
    budget_of(host_limits())
}

/// [`host_budget`] of given limits: (bytes, what) each.
pub fn budget_of(limits: impl IntoIterator<Item = Option<(u64, String)>>) -> Option<(u64, String)> {
    limits
        .into_iter()
        .flatten()
        .map(|(m, what)| {
            let pct = budget_percent(&what);
            let b = u64::try_from(u128::from(m) * u128::from(pct) / 100).unwrap_or(u64::MAX);
            (b, format!("{pct}% of the {} {what}", format_bytes(m)))
        })
        .min_by_key(|(b, _)| *b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_bytes_units() {
        assert_eq!(parse_bytes("4GiB").unwrap(), 4 << 30);
        assert_eq!(parse_bytes("512MiB").unwrap(), 512 << 20);
        assert_eq!(parse_bytes("64KiB").unwrap(), 64 << 10);
        assert_eq!(parse_bytes("2GB").unwrap(), 2_000_000_000);
        assert_eq!(parse_bytes("500 MB").unwrap(), 500_000_000);
        assert_eq!(parse_bytes("10KB").unwrap(), 10_000);
        assert_eq!(parse_bytes("123").unwrap(), 123);
        assert_eq!(parse_bytes("123bytes").unwrap(), 123);
        assert_eq!(parse_bytes("1.5GiB").unwrap(), 3 << 29);
        for bad in ["", "GiB", "4XB", "-1GiB", "0", "1.2.3MB"] {
            assert!(parse_bytes(bad).is_err(), "{bad} should be rejected");
        }
    }

    #[test]
    fn format_bytes_reads_back() {
        assert_eq!(format_bytes(512), "512 B");
        assert_eq!(format_bytes(3 << 29), "1.50 GiB");
        assert_eq!(
            parse_bytes(&format_bytes(5 << 20).replace(' ', "")).unwrap(),
            5 << 20
        );
    }
}
