//! `read_file`: reads a text file with line numbers, whole or by line
//! range, with byte-window continuation for oversized files (reference:
//! abstractcore `read_file`, common_tools.py 3394-3706).

use std::fs::{self, File};
use std::io::{self, BufReader, ErrorKind, Read, Seek, SeekFrom};
use std::path::Path;

use serde_json::json;
use stepwell_guest::tool::{EffectClass, ToolError, ToolSpec};

use crate::args::Args;
use crate::text::{display_path, io_error_text, thousands, LineReader, RawLine, MAX_READ_BYTES};
use stepwell_abstractignore::Policy;

/// The most lines one call returns.
const MAX_LINES_PER_CALL: usize = 2000;
/// The most characters one call returns before it switches to a labeled
/// partial (byte-window) read.
const MAX_CHARS_PER_CALL: usize = 120_000;
/// Lines previewed when a whole-file read is refused.
const PREVIEW_LINES: usize = 60;

/// The tool's spec.
pub fn spec() -> ToolSpec {
    ToolSpec::new(
        "read_file",
        "Read a text file (line-numbered). Oversized reads return a labeled PARTIAL chunk plus the exact continuation call (start_char).\n\nWhen to use: Use to inspect exact file contents. Prefer bounded reads; if line numbers are unknown, use search_files() first. For huge/minified files, follow the #TRUNCATION notice's start_char continuation.",
        EffectClass::Read,
        json!({
            "type": "object",
            "properties": {
                "file_path": {
                    "type": "string",
                    "description": "Path to the file to read."
                },
                "start_line": {
                    "type": "integer", "default": 1,
                    "description": "Starting line number (1-indexed, default: 1)."
                },
                "end_line": {
                    "type": "integer", "default": null,
                    "description": "Ending line number (1-indexed, inclusive, optional)."
                },
                "start_char": {
                    "type": "integer", "default": null,
                    "description": "Byte offset to read from, to continue after a #TRUNCATION notice; copy it verbatim from the notice's \"start_char=<N>\"."
                }
            },
            "required": ["file_path"]
        }),
    )
}

/// What one call asks for.
#[derive(Debug, Clone)]
struct ReadRequest {
    file_path: String,
    should_read_entire_file: Option<bool>,
    start_line: i64,
    end_line: Option<i64>,
    start_char: Option<i64>,
}

/// Runs a call.
pub fn run(args: &Args) -> Result<String, ToolError> {
    let req = ReadRequest {
        file_path: args.required_string("file_path")?,
        should_read_entire_file: args.bool_opt("should_read_entire_file")?,
        start_line: args.int_or("start_line", 1)?,
        end_line: args.int_opt("end_line")?,
        start_char: args.int_opt("start_char")?,
    };
    Ok(read_file(&req))
}

/// Why a read stopped.
#[derive(Debug)]
enum Failure {
    /// An I/O error.
    Io(io::Error),
    /// The text is not UTF-8.
    Binary,
}

impl From<io::Error> for Failure {
    /// Wraps an I/O error.
    fn from(e: io::Error) -> Self {
        Failure::Io(e)
    }
}

/// The width of the largest line number `n` (at least 1).
fn num_width(n: usize) -> usize {
    n.max(1).to_string().len()
}

/// `N: text` rows with right-aligned numbers of width `width`.
fn number_rows<'a>(rows: impl IntoIterator<Item = (usize, &'a str)>, width: usize) -> String {
    rows.into_iter()
        .map(|(n, text)| format!("{n:>width$}: {text}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Decodes one line strictly; a decoding error means the file is binary.
fn decode_line(line: RawLine) -> Result<(String, usize), Failure> {
    let chars_with_break = usize::from(line.terminated);
    let text = String::from_utf8(line.bytes).map_err(|_| Failure::Binary)?;
    let chars = text.chars().count() + chars_with_break;
    Ok((text, chars))
}

/// The lines of the file at `path` (at most 64 MiB of it), split on
/// universal newlines.
fn open_lines(path: &Path) -> io::Result<LineReader<BufReader<io::Take<File>>>> {
    let file = File::open(path)?;
    Ok(LineReader::new(BufReader::new(file.take(MAX_READ_BYTES))))
}

/// Decodes a byte window on a character boundary: at the end of the file
/// leniently; elsewhere dropping up to 3 trailing bytes of a cut character
/// (they start the next window). Returns the text and the bytes consumed.
fn decode_window(raw: &[u8], at_eof: bool) -> (String, usize) {
    if !at_eof {
        for cut in 0..4 {
            let Some(end) = raw.len().checked_sub(cut).filter(|e| *e > 0) else {
                break;
            };
            if let Ok(text) = std::str::from_utf8(&raw[..end]) {
                return (text.to_string(), end);
            }
        }
    }
    (String::from_utf8_lossy(raw).into_owned(), raw.len())
}

/// Formats a byte window `[offset, end)` of a `total`-byte file: the final
/// part, or a partial part with the continuation call before and after.
fn format_window(
    shown: &str,
    file_path: &str,
    chunk: &str,
    (offset, end, total): (u64, u64, u64),
    at_eof: bool,
) -> String {
    if at_eof {
        return format!(
            "File: {shown} — FINAL PART (bytes {}-{} of ~{}; end of file)\n\n{chunk}\n\n[END OF FILE]",
            thousands(offset),
            thousands(end),
            thousands(total)
        );
    }
    let pct = 100.0 * end as f64 / total.max(1) as f64;
    let notice = format!(
        "#TRUNCATION: this is a PARTIAL read — bytes {}-{} of ~{} (~{pct:.1}% shown). The file continues.\nNEXT PART: read_file(file_path=\"{file_path}\", start_char={end})",
        thousands(offset),
        thousands(end),
        thousands(total)
    );
    format!("File: {shown}\n{notice}\n\n{chunk}\n\n{notice}")
}

/// Reads the byte window starting at `offset` (at most 120,000 bytes).
fn partial_chunk(path: &Path, req: &ReadRequest, shown: &str, offset: u64) -> io::Result<String> {
    let total = fs::metadata(path)?.len();
    let mut file = File::open(path)?;
    file.seek(SeekFrom::Start(offset))?;
    let mut raw = Vec::new();
    (&mut file)
        .take(MAX_CHARS_PER_CALL as u64)
        .read_to_end(&mut raw)?;
    let mut probe = [0u8; 1];
    let at_eof = file.read(&mut probe)? == 0;
    let (chunk, consumed) = decode_window(&raw, at_eof);
    let end = offset + consumed as u64;
    Ok(format_window(
        shown,
        &req.file_path,
        &chunk,
        (offset, end, total),
        at_eof,
    ))
}

/// The byte offset where line `start_line` begins (lines split on `\n`
/// only, as a binary read splits them).
fn byte_offset_of_line(path: &Path, start_line: usize) -> io::Result<u64> {
    use std::io::BufRead;
    let mut reader = BufReader::new(File::open(path)?.take(MAX_READ_BYTES));
    let mut offset = 0u64;
    let mut buf = Vec::new();
    for _ in 1..start_line {
        buf.clear();
        let n = reader.read_until(b'\n', &mut buf)?;
        if n == 0 {
            break;
        }
        offset += n as u64;
    }
    Ok(offset)
}

/// The whole-file read: every line, or a refusal past 2000 lines, or a
/// partial read past 120,000 characters.
fn read_entire(path: &Path, req: &ReadRequest, shown: &str) -> Result<String, Failure> {
    let mut lines: Vec<String> = Vec::new();
    let mut total_chars = 0usize;
    for (idx, line) in open_lines(path)?.enumerate() {
        let (text, chars) = decode_line(line?)?;
        if idx + 1 > MAX_LINES_PER_CALL {
            let preview: Vec<(usize, &str)> = lines
                .iter()
                .take(PREVIEW_LINES)
                .enumerate()
                .map(|(i, l)| (i + 1, l.as_str()))
                .collect();
            let width = num_width(preview.len());
            let mut out = format!(
                "Refused: File '{shown}' is too large to read entirely (> {MAX_LINES_PER_CALL} lines).\nNext step: use search_files(...) to find the relevant line number(s), then call read_file with start_line/end_line for a smaller range."
            );
            if !preview.is_empty() {
                out.push_str("\n\nPreview (first 60 lines):\n\n");
                out.push_str(&number_rows(preview, width));
            }
            return Ok(out);
        }
        total_chars += chars;
        if total_chars > MAX_CHARS_PER_CALL {
            return partial_chunk(path, req, shown, 0).map_err(Failure::Io);
        }
        lines.push(text);
    }
    let width = num_width(lines.len());
    let rows = number_rows(
        lines.iter().enumerate().map(|(i, l)| (i + 1, l.as_str())),
        width,
    );
    Ok(format!("File: {shown} ({} lines)\n\n{rows}", lines.len()))
}

/// The line-range read: lines `start_line..=end_line` (to the end of the
/// file when `end_line` is absent).
fn read_range(path: &Path, req: &ReadRequest, shown: &str) -> Result<String, Failure> {
    let start_line = if req.start_line == 0 {
        1
    } else {
        req.start_line
    };
    if start_line < 1 {
        return Ok(format!("Error: start_line must be >= 1 (got {start_line})"));
    }
    if let Some(end) = req.end_line {
        if end < 1 {
            return Ok(format!("Error: end_line must be >= 1 (got {end})"));
        }
        if start_line > end {
            return Ok(format!(
                "Error: start_line ({start_line}) cannot be greater than end_line ({end})"
            ));
        }
        let requested = end - start_line + 1;
        if requested > MAX_LINES_PER_CALL as i64 {
            return Ok(format!(
                "Refused: Requested range would return {requested} lines (> {MAX_LINES_PER_CALL} lines).\nNext step: request a smaller range by narrowing end_line, or use search_files(...) to target the exact region."
            ));
        }
    }
    let start = start_line as usize;
    let end = req.end_line.map(|e| e as usize);
    let mut selected: Vec<(usize, String)> = Vec::new();
    let mut last_line_seen = 0usize;
    let mut range_chars = 0usize;
    for (idx, line) in open_lines(path)?.enumerate() {
        let line_no = idx + 1;
        let (text, chars) = decode_line(line?)?;
        last_line_seen = line_no;
        if line_no < start {
            continue;
        }
        if end.is_some_and(|e| line_no > e) {
            break;
        }
        range_chars += chars;
        if range_chars > MAX_CHARS_PER_CALL {
            let offset = byte_offset_of_line(path, start)?;
            return partial_chunk(path, req, shown, offset).map_err(Failure::Io);
        }
        selected.push((line_no, text));
        if selected.len() > MAX_LINES_PER_CALL {
            return Ok(format!(
                "Refused: Requested range is too large to return in one call (> {MAX_LINES_PER_CALL} lines).\nNext step: specify a smaller end_line, or split the read into multiple smaller ranges."
            ));
        }
    }
    if last_line_seen < start {
        return Ok(format!(
            "Error: Start line {start} exceeds file length ({last_line_seen} lines)"
        ));
    }
    let width = num_width(selected.last().map_or(start, |(n, _)| *n));
    let rows = number_rows(selected.iter().map(|(n, t)| (*n, t.as_str())), width);
    Ok(format!(
        "File: {shown} ({} lines)\n\n{rows}",
        selected.len()
    ))
}

/// The text for an I/O error while reading the file shown as `shown`.
fn io_failure_text(e: &io::Error, shown: &str) -> String {
    match e.kind() {
        ErrorKind::NotFound => format!("Error: File not found: {shown}"),
        ErrorKind::PermissionDenied => format!("Error: Permission denied reading file: {shown}"),
        _ => format!("Error reading file: {}", io_error_text(e)),
    }
}

/// Runs `read_file`, returning the text for the model.
fn read_file(req: &ReadRequest) -> String {
    let shown = display_path(&req.file_path);
    let path = Path::new(&req.file_path);
    if Policy::for_path(path).is_ignored(path, false) {
        return format!("Error: File '{shown}' is ignored by .abstractignore policy");
    }
    match fs::metadata(path) {
        Ok(m) if m.is_file() => {}
        Ok(_) => return format!("Error: '{shown}' is not a file"),
        Err(e) if matches!(e.kind(), ErrorKind::NotFound | ErrorKind::NotADirectory) => {
            return format!("Error: File '{shown}' does not exist");
        }
        Err(e) => return io_failure_text(&e, &shown),
    }

    let result = if let Some(start_char) = req.start_char {
        partial_chunk(path, req, &shown, start_char.max(0) as u64).map_err(Failure::Io)
    } else {
        let inferred_start = if req.start_line == 0 {
            1
        } else {
            req.start_line
        };
        let entire = req
            .should_read_entire_file
            .unwrap_or(req.end_line.is_none() && inferred_start == 1);
        if entire {
            read_entire(path, req, &shown)
        } else {
            read_range(path, req, &shown)
        }
    };
    match result {
        Ok(text) => text,
        Err(Failure::Binary) => {
            format!("Error: Cannot read '{shown}' - file appears to be binary")
        }
        Err(Failure::Io(e)) => io_failure_text(&e, &shown),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_are_right_aligned() {
        let lines = ["a", "b", "", "d", "e", "f", "g", "h", "i", "j"];
        let rows = number_rows(
            lines.iter().enumerate().map(|(i, l)| (i + 1, *l)),
            num_width(10),
        );
        assert!(rows.starts_with(" 1: a\n 2: b\n 3: \n"));
        assert!(rows.ends_with("\n10: j"));
        assert_eq!(num_width(0), 1);
        assert_eq!(num_width(9), 1);
        assert_eq!(num_width(2000), 4);
    }

    #[test]
    fn windows_decode_on_char_boundaries() {
        let bytes = "aé".as_bytes();
        // Cut inside `é`: the partial byte is left for the next window.
        assert_eq!(decode_window(&bytes[..2], false), ("a".to_string(), 1));
        assert_eq!(decode_window(bytes, false), ("aé".to_string(), 3));
        // At the end of the file a cut character is replaced.
        assert_eq!(
            decode_window(&bytes[..2], true),
            ("a\u{fffd}".to_string(), 2)
        );
    }

    #[test]
    fn window_texts() {
        assert_eq!(
            format_window("/w/a.js", "/w/a.js", "xyz", (0, 120_000, 240_000), false),
            "File: /w/a.js\n#TRUNCATION: this is a PARTIAL read — bytes 0-120,000 of ~240,000 (~50.0% shown). The file continues.\nNEXT PART: read_file(file_path=\"/w/a.js\", start_char=120000)\n\nxyz\n\n#TRUNCATION: this is a PARTIAL read — bytes 0-120,000 of ~240,000 (~50.0% shown). The file continues.\nNEXT PART: read_file(file_path=\"/w/a.js\", start_char=120000)"
        );
        assert_eq!(
            format_window("/w/a.js", "/w/a.js", "end", (120_000, 130_000, 130_000), true),
            "File: /w/a.js — FINAL PART (bytes 120,000-130,000 of ~130,000; end of file)\n\nend\n\n[END OF FILE]"
        );
    }
}
