//! JSON-lines files of the file-based stores (the command inbox, the event
//! inbox): one record per line, appended. A crash during an append can
//! leave a last line without its newline: that record was never appended,
//! so a read skips it and the next append drops it first.

use std::fs;
use std::io::ErrorKind;
use std::path::Path;

use serde::de::DeserializeOwned;

use super::StoreError;

fn io(path: &Path, e: impl std::fmt::Display) -> StoreError {
    StoreError::io(format!("{}: {e}", path.display()))
}

/// Every record of the file at `path` (none when it does not exist),
/// skipping blank lines and a torn last line; any other line that does not
/// parse is `store_corrupt`, naming the file and line.
pub(crate) fn read_lines<T: DeserializeOwned>(path: &Path) -> Result<Vec<T>, StoreError> {
    let text = match fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io(path, e)),
    };
    let lines: Vec<(usize, &str)> = text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .collect();
    let mut out = Vec::with_capacity(lines.len());
    for (i, (n, l)) in lines.iter().enumerate() {
        match serde_json::from_str(l) {
            // An unterminated last line is torn, even when it parses (its
            // newline was not written): the next append drops it.
            _ if i + 1 == lines.len() && !text.ends_with('\n') => {}
            Ok(r) => out.push(r),
            Err(e) => {
                return Err(StoreError::corrupt(format!(
                    "{}:{}: {e}",
                    path.display(),
                    n + 1
                )))
            }
        }
    }
    Ok(out)
}

/// Cuts a torn last line off the file at `path` (if any), so that the next
/// append starts a line of its own.
pub(crate) fn drop_torn_tail(path: &Path) -> Result<(), StoreError> {
    if let Ok(bytes) = fs::read(path) {
        if !bytes.is_empty() && !bytes.ends_with(b"\n") {
            let keep = bytes.iter().rposition(|b| *b == b'\n').map_or(0, |p| p + 1);
            fs::OpenOptions::new()
                .write(true)
                .open(path)
                .and_then(|f| f.set_len(keep as u64))
                .map_err(|e| io(path, e))?;
        }
    }
    Ok(())
}
