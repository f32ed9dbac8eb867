//! [`Ident`]: a table or column name that may be spliced into SQL text.

use crate::config::validate_identifier;
use crate::error::Result;

/// A table or column name that passed the lock table's own identifier rule
/// (`[A-Za-z_][A-Za-z0-9_]*`, at most [`MAX_TABLE_NAME_BYTES`](crate::MAX_TABLE_NAME_BYTES)
/// bytes). Such a name needs no quoting on any backend, so the helpers can splice it into
/// statements without opening a door to injection. A bad name is
/// [`Error::InvalidTableName`](crate::Error::InvalidTableName), whatever it names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Ident(String);

impl Ident {
    /// Checks `name`; the one rule is `validate_identifier`, so every identifier dblock
    /// accepts, lock table or user table, follows the same rule.
    pub(crate) fn new(name: impl Into<String>) -> Result<Self> {
        let name = name.into();
        validate_identifier(&name)?;
        Ok(Ident(name))
    }

    pub(crate) fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for Ident {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifiers_follow_the_table_name_rule() {
        assert_eq!(Ident::new("stock_2").unwrap().as_str(), "stock_2");
        for bad in ["", "1id", "id;drop table t", "a.b", "a\"b", "a b"] {
            assert!(Ident::new(bad).is_err(), "{bad}");
        }
    }
}
