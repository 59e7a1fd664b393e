//! The names by which users configure RPC-over-RDMA extensions
//! ([`Extensions`], docs/EXTENSIONS.md): the daemon's
//! `transport.extensions`, the bench's `--extensions`, and how a
//! negotiated set is printed. Names only: which extensions the engine
//! implements is the engine's business (`Connection::advertised_extensions`).

use core::fmt;

use crate::wire::extensions::Extensions;

/// Every extension by its configuration name, in bit order.
pub const NAMES: [(&str, Extensions); 4] = [
    ("responder_read_chunks", Extensions::RESPONDER_READ_CHUNKS),
    ("remote_invalidate", Extensions::REMOTE_INVALIDATE),
    ("message_continuation", Extensions::MESSAGE_CONTINUATION),
    ("send_placement", Extensions::SEND_PLACEMENT),
];

/// The extension called `name`, if there is one.
pub fn by_name(name: &str) -> Option<Extensions> {
    NAMES.iter().find(|(n, _)| *n == name).map(|&(_, e)| e)
}

/// The message for a name that is not an extension, listing the valid
/// ones: "unknown extension `x`: expected \"responder_read_chunks\", ...".
pub fn unknown(name: &str) -> String {
    let expected: Vec<String> = NAMES.iter().map(|(n, _)| format!("\"{n}\"")).collect();
    format!(
        "unknown extension `{name}`: expected {}",
        expected.join(", ")
    )
}

/// Parses a comma-separated list of names, or `all`, or `none` (also the
/// empty string). Spaces around names are ignored.
///
/// # Errors
/// The [`unknown`] message for the first name that is not an extension.
pub fn parse_list(list: &str) -> Result<Extensions, String> {
    match list.trim() {
        "all" => return Ok(Extensions::ALL),
        "none" | "" => return Ok(Extensions::EMPTY),
        _ => {}
    }
    list.split(',')
        .map(str::trim)
        .try_fold(Extensions::EMPTY, |acc, name| {
            by_name(name)
                .map(|e| acc.union(e))
                .ok_or_else(|| unknown(name))
        })
}

/// Displays a set as its names separated by commas, or `none`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Names(pub Extensions);

impl fmt::Display for Names {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return f.write_str("none");
        }
        let mut first = true;
        for (name, e) in NAMES {
            if self.0.contains(e) {
                if !first {
                    f.write_str(",")?;
                }
                f.write_str(name)?;
                first = false;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_extension_has_one_name() {
        let all = NAMES
            .iter()
            .fold(Extensions::EMPTY, |acc, &(_, e)| acc.union(e));
        assert_eq!(all, Extensions::ALL);
        for (name, e) in NAMES {
            assert_eq!(by_name(name), Some(e));
        }
        assert_eq!(by_name("continuation"), None);
    }

    #[test]
    fn lists_parse_and_print_back() {
        assert_eq!(parse_list("all"), Ok(Extensions::ALL));
        assert_eq!(parse_list("none"), Ok(Extensions::EMPTY));
        assert_eq!(parse_list(""), Ok(Extensions::EMPTY));
        let two = parse_list("remote_invalidate, message_continuation").unwrap();
        assert_eq!(
            two,
            Extensions::REMOTE_INVALIDATE.union(Extensions::MESSAGE_CONTINUATION)
        );
        assert_eq!(
            Names(two).to_string(),
            "remote_invalidate,message_continuation"
        );
        assert_eq!(parse_list(&Names(two).to_string()), Ok(two));
        assert_eq!(Names(Extensions::EMPTY).to_string(), "none");
        assert_eq!(
            parse_list("remote_invalidate,rdma_done"),
            Err(
                "unknown extension `rdma_done`: expected \"responder_read_chunks\", \
                 \"remote_invalidate\", \"message_continuation\", \"send_placement\""
                    .into()
            )
        );
    }
}
