//! What the coordination primitives (semaphores, read-write locks, elections) share: the
//! names users give them and the keys of their rows. Each primitive is rows of the lock
//! table keyed `<name>~<part>` (a permit, a reader, the writer, the leader), taken and
//! renewed as the mutex's rows are; `<name>~` is the local queue their waiters join, and a
//! release of any of the rows wakes its head.

use crate::config::{MAX_KEY_BYTES, validate_key};
use crate::error::{Error, Result, shown_key};
use crate::queue::GROUP_MARK;

/// Checks a primitive's name: a valid key without the group mark, short enough that
/// `<name>~<suffix>` is a valid key for suffixes up to `longest_suffix` bytes.
pub(crate) fn validate_name(name: &str, longest_suffix: usize) -> Result<()> {
    validate_key(name)?;
    let reason = if name.contains(GROUP_MARK) {
        "a semaphore, read-write lock or election name cannot contain '~' (it marks the keys of their rows)"
    } else if name.len() + GROUP_MARK.len_utf8() + longest_suffix > MAX_KEY_BYTES {
        "the name leaves no room for the suffix of its rows' keys within 128 bytes"
    } else {
        return Ok(());
    };
    Err(Error::InvalidKey {
        key: shown_key(name),
        key_bytes: name.len(),
        reason,
    })
}

/// The key of the row `part` of the primitive `name`.
pub(crate) fn member_key(name: &str, part: &str) -> String {
    format!("{name}{GROUP_MARK}{part}")
}

/// The key of the local queue the waiters of the primitive `name` join.
pub(crate) fn group_key(name: &str) -> String {
    format!("{name}{GROUP_MARK}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_keep_room_for_their_rows() {
        assert!(validate_name("exports", 20).is_ok());
        assert!(validate_name("a~b", 20).is_err());
        assert!(validate_name("", 20).is_err());
        assert!(validate_name(&"x".repeat(108), 19).is_ok());
        assert!(validate_name(&"x".repeat(109), 19).is_err());
        assert_eq!(
            member_key("exports", "permit-0-of-3"),
            "exports~permit-0-of-3"
        );
        assert_eq!(
            crate::queue::group_of(&member_key("exports", "leader")),
            Some(group_key("exports").as_str())
        );
    }
}
