//! Who this process is: the name written as lease owner on claimed rows and
//! bucket leases. On Kubernetes the host name is the pod name.

/// The configured id, else the host name, trimmed; never blank.
///
/// # Errors
/// The id (configured, or the host name) is blank.
pub fn resolve(configured: Option<&str>) -> Result<String, BlankIdentity> {
    let id = match configured {
        Some(id) => id.to_owned(),
        None => host_name(),
    };
    let id = id.trim();
    if id.is_empty() {
        return Err(BlankIdentity);
    }
    Ok(id.to_owned())
}

/// The host name (`/proc/sys/kernel/hostname`, else `$HOSTNAME`), or empty.
#[must_use]
pub fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .or_else(|_| std::env::var("HOSTNAME"))
        .unwrap_or_default()
        .trim()
        .to_owned()
}

/// Neither a configured id nor a host name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "the worker id is blank: set FLOTILLA_WORKER_ID (it names the lease owner on claimed rows)"
)]
pub struct BlankIdentity;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_configured_id_is_trimmed_and_a_blank_one_refused() {
        assert_eq!(resolve(Some("  w-1 ")), Ok("w-1".to_owned()));
        assert_eq!(resolve(Some("   ")), Err(BlankIdentity));
    }
}
