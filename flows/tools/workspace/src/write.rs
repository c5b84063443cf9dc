//! `write_file`: writes (or appends) a whole UTF-8 text file, creating its
//! parent directories (reference: abstractcore `write_file`,
//! common_tools.py 4177-4286).

use std::fs::{self, OpenOptions};
use std::io::{self, ErrorKind, Write};
use std::path::Path;

use serde_json::json;
use stepwell_guest::tool::{EffectClass, ToolError, ToolSpec};

use crate::args::Args;
use crate::text::{display_path, io_error_text, py_splitlines, thousands};

/// The tool's spec.
pub fn spec() -> ToolSpec {
    ToolSpec::new(
        "write_file",
        "Write full file content (create/overwrite/append). WARNING: mode='w' overwrites the entire file; for small edits, use edit_file().\n\nWhen to use: Use to create new files or intentionally overwrite/append full content. For small edits, use edit_file().",
        EffectClass::Write,
        json!({
            "type": "object",
            "properties": {
                "file_path": {
                    "type": "string",
                    "description": "Path to the file to write."
                },
                "content": {
                    "type": "string",
                    "description": "The content to write to the file (use \"\" explicitly for an empty file)."
                },
                "mode": {
                    "type": "string", "default": "w",
                    "description": "Write mode: \"w\" to overwrite, \"a\" to append (default: \"w\")."
                },
                "create_dirs": {
                    "type": "boolean", "default": true,
                    "description": "Whether to create parent directories if they don't exist (default: true)."
                }
            },
            "required": ["file_path", "content"]
        }),
    )
}

/// What one call asks for.
#[derive(Debug, Clone)]
struct WriteRequest {
    file_path: String,
    content: String,
    mode: String,
    create_dirs: bool,
}

/// Runs a call.
pub fn run(args: &Args) -> Result<String, ToolError> {
    let req = WriteRequest {
        file_path: args.required_string("file_path")?,
        content: args.required_string("content")?,
        mode: args.string_or("mode", "w")?,
        create_dirs: args.bool_or("create_dirs", true)?,
    };
    if stepwell_abstractignore::refuses_write(Path::new(&req.file_path)) {
        let shown = display_path(&req.file_path);
        return Ok(format!(
            "❌ Refused: Path '{shown}' is ignored by .abstractignore policy"
        ));
    }
    // A FIFO or a device would block the call (or do worse): only regular
    // files, or new ones, are written.
    if let Ok(meta) = fs::metadata(&req.file_path) {
        if !meta.is_file() {
            return Ok(format!(
                "❌ Path is not a regular file: '{}'",
                display_path(&req.file_path)
            ));
        }
    }
    Ok(write_file(&req))
}

/// The text for an I/O error while writing the file shown as `shown`
/// (`about` is the path the failing operation touched).
fn failure_text(e: &io::Error, shown: &str, about: &Path) -> String {
    match e.kind() {
        ErrorKind::PermissionDenied | ErrorKind::ReadOnlyFilesystem => {
            format!("❌ Permission denied: Cannot write to '{shown}'")
        }
        ErrorKind::NotFound => {
            format!("❌ Directory not found: Parent directory of '{shown}' does not exist")
        }
        _ => format!(
            "❌ File system error: {}: '{}'",
            io_error_text(e),
            display_path(&about.to_string_lossy())
        ),
    }
}

/// The success message: size and line count written (for an append, what
/// was added and the new size).
fn success_text(shown: &str, content: &str, append: bool, file_size: u64) -> String {
    let lines = thousands(py_splitlines(content, false).len() as u64);
    let bytes = thousands(content.len() as u64);
    if append {
        format!(
            "✅ Successfully appended to '{shown}' (+{bytes} bytes, +{lines} lines; file now {} bytes)",
            thousands(file_size)
        )
    } else {
        format!(
            "✅ Successfully written to '{shown}' ({} bytes, {lines} lines)",
            thousands(file_size)
        )
    }
}

/// Runs `write_file`, returning the text for the model.
fn write_file(req: &WriteRequest) -> String {
    let shown = display_path(&req.file_path);
    let path = Path::new(&req.file_path);
    let append = match req.mode.as_str() {
        "w" => false,
        "a" => true,
        other => {
            return format!("❌ Invalid mode '{other}': use \"w\" to overwrite or \"a\" to append")
        }
    };
    if req.create_dirs {
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            if let Err(e) = fs::create_dir_all(parent) {
                return failure_text(&e, &shown, parent);
            }
        }
    }
    let mut options = OpenOptions::new();
    if append {
        options.append(true).create(true);
    } else {
        options.write(true).create(true).truncate(true);
    }
    let written = options
        .open(path)
        .and_then(|mut f| f.write_all(req.content.as_bytes()).and_then(|()| f.flush()));
    if let Err(e) = written {
        return failure_text(&e, &shown, path);
    }
    match fs::metadata(path) {
        Ok(m) => {
            let done = success_text(&shown, &req.content, append, m.len());
            // The whole file as written.
            crate::lint::with_notice_on_disk(path, done)
        }
        Err(e) => failure_text(&e, &shown, path),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn success_messages() {
        assert_eq!(
            success_text("/w/a.txt", "one\ntwo\n", false, 8),
            "✅ Successfully written to '/w/a.txt' (8 bytes, 2 lines)"
        );
        assert_eq!(
            success_text("/w/log.txt", "\nentry", true, 1234),
            "✅ Successfully appended to '/w/log.txt' (+6 bytes, +2 lines; file now 1,234 bytes)"
        );
        assert_eq!(
            success_text("/w/e.txt", "", false, 0),
            "✅ Successfully written to '/w/e.txt' (0 bytes, 0 lines)"
        );
    }
}
