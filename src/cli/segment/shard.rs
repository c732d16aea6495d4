//! `--shard`: which part of a batch this process takes. `k/n` names it; `auto` reads it from a
//! Slurm job array or a Kubernetes Indexed Job, so one script runs unchanged in every task (each
//! task lists the same sorted cases and keeps those with position mod n == k).

use super::dataset::parse_shard;
use crate::{Error, Result};

/// The variable that gives a Kubernetes Indexed Job's completion count (Kubernetes exports only
/// the index); `--shard auto/N` gives it on the command line instead.
pub const COUNT_VAR: &str = "VOXTILE_SHARD_COUNT";

/// `k/n`, `auto` or `auto/N` resolved against the environment `env` to (k, n), 0 <= k < n.
pub fn resolve(spec: &str, env: &dyn Fn(&str) -> Option<String>) -> Result<(usize, usize)> {
    let spec = spec.trim();
    let given = match spec.strip_prefix("auto") {
        None => return parse_shard(spec),
        Some("") => None,
        Some(rest) => match rest.strip_prefix('/').map(|n| n.trim().parse::<usize>()) {
            Some(Ok(n)) if n > 0 => Some(n),
            _ => {
                return Err(Error::Invalid(format!(
                    "--shard takes k/n, auto or auto/N (N >= 1), not '{spec}'"
                )))
            }
        },
    };
    let (k, n, from) = if env("SLURM_ARRAY_TASK_ID").is_some() {
        let (k, n) = slurm(env)?;
        (k, n, "the Slurm array")
    } else if env("JOB_COMPLETION_INDEX").is_some() {
        let k = var(env, "JOB_COMPLETION_INDEX")?.unwrap_or(0);
        // The variable first: an `auto/N` that disagrees with it is refused below.
        let n = match (var(env, COUNT_VAR)?, given) {
            (Some(n), _) | (None, Some(n)) => n,
            (None, None) => {
                return Err(Error::Invalid(format!(
                    "--shard auto: JOB_COMPLETION_INDEX is set but not the number of completions; set {COUNT_VAR} to the Job's completions (see examples/k8s_indexed_job.yaml) or give --shard auto/N"
                )))
            }
        };
        (k, n, "the Indexed Job")
    } else {
        return Err(Error::Invalid(
            "--shard auto: no array task in the environment (SLURM_ARRAY_TASK_ID for a Slurm job array, JOB_COMPLETION_INDEX for a Kubernetes Indexed Job); give --shard k/n instead".into(),
        ));
    };
    if let Some(g) = given.filter(|&g| g != n) {
        return Err(Error::Invalid(format!(
            "--shard auto/{g}: {from} has {n} tasks"
        )));
    }
    if n == 0 || k >= n {
        return Err(Error::Invalid(format!(
            "--shard auto: task index {k} is not below the task count {n} ({from})"
        )));
    }
    Ok((k, n))
}

/// A Slurm array task: index (ID − MIN) / STEP among COUNT tasks, or among (MAX − MIN) / STEP + 1
/// where COUNT is absent (MIN 0 and STEP 1 where unset). Lists such as `--array=1,5,7` have no
/// such index: refused.
fn slurm(env: &dyn Fn(&str) -> Option<String>) -> Result<(usize, usize)> {
    let id = var(env, "SLURM_ARRAY_TASK_ID")?.unwrap_or(0);
    let min = var(env, "SLURM_ARRAY_TASK_MIN")?;
    let step = var(env, "SLURM_ARRAY_TASK_STEP")?.unwrap_or(1).max(1);
    let count = match (var(env, "SLURM_ARRAY_TASK_COUNT")?, min, var(env, "SLURM_ARRAY_TASK_MAX")?) {
        (Some(c), _, _) => c,
        (None, Some(lo), Some(hi)) if hi >= lo => (hi - lo) / step + 1,
        _ => {
            return Err(Error::Invalid(
                "--shard auto: SLURM_ARRAY_TASK_ID is set but neither SLURM_ARRAY_TASK_COUNT nor SLURM_ARRAY_TASK_MIN and _MAX (an even range)".into(),
            ))
        }
    };
    let min = min.unwrap_or(0);
    if id < min || (id - min) % step != 0 {
        return Err(Error::Invalid(format!(
            "--shard auto: SLURM_ARRAY_TASK_ID {id} is not in the range from SLURM_ARRAY_TASK_MIN {min} by steps of {step}; use a range such as --array=0-N"
        )));
    }
    Ok(((id - min) / step, count))
}

/// A non-negative integer variable, or None when unset.
fn var(env: &dyn Fn(&str) -> Option<String>, name: &str) -> Result<Option<usize>> {
    env(name)
        .map(|v| {
            v.trim().parse::<usize>().map_err(|_| {
                Error::Invalid(format!(
                    "--shard auto: {name}={v} is not a non-negative integer"
                ))
            })
        })
        .transpose()
}

/// The cases of this shard of `sorted` (`spec` resolved against the process environment); a
/// shard left without any says so on standard error and does nothing.
pub fn take<T: Clone>(sorted: &[T], spec: &str) -> Result<Vec<T>> {
    let (k, n) = resolve(spec, &process_env)?;
    let mine = super::dataset::shard(sorted, k, n);
    if mine.is_empty() {
        crate::cli::say!(
            "voxtile: shard {k}/{n} has no cases ({} in all): nothing to do",
            sorted.len()
        );
    }
    Ok(mine)
}

/// The process environment, as [`resolve`] reads it.
pub fn process_env(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |n| {
            vars.iter()
                .find(|(k, _)| *k == n)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn slurm_forms() {
        let ok = |vars: &[(&str, &str)], spec: &str| resolve(spec, &with(vars)).unwrap();
        let id_count = [
            ("SLURM_ARRAY_TASK_ID", "1"),
            ("SLURM_ARRAY_TASK_COUNT", "2"),
        ];
        assert_eq!(ok(&id_count, "auto"), (1, 2));
        assert_eq!(ok(&id_count, "auto/2"), (1, 2));
        let min_max = [
            ("SLURM_ARRAY_TASK_ID", "7"),
            ("SLURM_ARRAY_TASK_MIN", "5"),
            ("SLURM_ARRAY_TASK_MAX", "8"),
        ];
        assert_eq!(ok(&min_max, "auto"), (2, 4));
        // --array=1-10 exports COUNT and MIN: the index is ID - MIN.
        let one_based = [
            ("SLURM_ARRAY_TASK_ID", "10"),
            ("SLURM_ARRAY_TASK_COUNT", "10"),
            ("SLURM_ARRAY_TASK_MIN", "1"),
            ("SLURM_ARRAY_TASK_MAX", "10"),
        ];
        assert_eq!(ok(&one_based, "auto"), (9, 10));
        let stepped = [
            ("SLURM_ARRAY_TASK_ID", "8"),
            ("SLURM_ARRAY_TASK_MIN", "0"),
            ("SLURM_ARRAY_TASK_MAX", "20"),
            ("SLURM_ARRAY_TASK_STEP", "4"),
        ];
        assert_eq!(ok(&stepped, "auto"), (2, 6));
    }

    #[test]
    fn kubernetes_and_refusals() {
        let k8s = [("JOB_COMPLETION_INDEX", "3")];
        assert_eq!(resolve("auto/4", &with(&k8s)).unwrap(), (3, 4));
        let k8s_env = [("JOB_COMPLETION_INDEX", "3"), (COUNT_VAR, "5")];
        assert_eq!(resolve("auto", &with(&k8s_env)).unwrap(), (3, 5));
        let err =
            |vars: &[(&str, &str)], spec: &str| resolve(spec, &with(vars)).unwrap_err().to_string();
        assert!(err(&k8s, "auto").contains(COUNT_VAR));
        assert!(err(&k8s_env, "auto/4").contains("has 5 tasks"));
        assert!(err(&[], "auto").contains("SLURM_ARRAY_TASK_ID"));
        assert!(err(&[("SLURM_ARRAY_TASK_ID", "1")], "auto").contains("SLURM_ARRAY_TASK_COUNT"));
        assert!(err(
            &[
                ("SLURM_ARRAY_TASK_ID", "x"),
                ("SLURM_ARRAY_TASK_COUNT", "2")
            ],
            "auto"
        )
        .contains("=x"));
        assert!(err(&[("JOB_COMPLETION_INDEX", "4")], "auto/4").contains("not below"));
        for bad in ["3/2", "2/2", "0/0", "a/b", "1", "auto/0", "autox", "auto/"] {
            assert!(resolve(bad, &with(&[])).is_err(), "{bad}");
        }
    }
}
