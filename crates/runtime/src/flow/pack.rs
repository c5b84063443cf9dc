//! A bundle as one file (`NAME.flow`): a zip archive holding a
//! `manifest.json` (the format, the digest, the workflow ids, every file's
//! path, size and SHA-256) and the bundle's files under `files/`, as a
//! deployment keeps them ([`super::archive`]). Built once (in CI, say) and
//! deployed on hosts that have no checkout: `stepwell bundle pack`,
//! `stepwell deploy NAME.flow`, `POST /v1/deployments`.
//!
//! Entries are stored (not compressed), so the archive is read without a
//! decompressor; any zip tool lists and extracts it. Reading checks every
//! entry's CRC, every path, the total size ([`MAX_BUNDLE_BYTES`]) and the
//! digest the manifest names: an archive that does not match is refused.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::archive::{clean_path, BundleFile, BundleFiles, MAX_BUNDLE_BYTES};

/// The manifest's `format`.
pub const FORMAT: &str = "stepwell-bundle";

/// The manifest's file name in the archive.
const MANIFEST: &str = "manifest.json";

/// Where the bundle's files are in the archive.
const FILES: &str = "files/";

/// The most entries an archive may hold.
const MAX_ENTRIES: usize = 10_000;

/// What `manifest.json` says about the bundle.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    /// Always [`FORMAT`].
    pub format: String,
    /// The format's version: 1.
    pub format_version: u32,
    /// The digest of the files ([`BundleFiles::digest`]).
    pub digest: String,
    /// The workflow ids the bundle defines, the main one first.
    pub workflows: Vec<String>,
    /// Every file: its path in the bundle, size and SHA-256.
    pub files: Vec<ManifestFile>,
}

/// One file of a packed bundle.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ManifestFile {
    /// Its path inside the bundle.
    pub path: String,
    /// Its size in bytes.
    pub size: u64,
    /// Its SHA-256, hex.
    pub sha256: String,
}

/// `files` (of a bundle defining `workflows`, the main one first) as a
/// `.flow` archive.
pub fn pack(files: &BundleFiles, workflows: &[String]) -> Vec<u8> {
    let manifest = Manifest {
        format: FORMAT.into(),
        format_version: 1,
        digest: files.digest.clone(),
        workflows: workflows.to_vec(),
        files: files
            .files
            .iter()
            .map(|f| ManifestFile {
                path: f.path.clone(),
                size: f.bytes.len() as u64,
                sha256: hex::encode(Sha256::digest(&f.bytes)),
            })
            .collect(),
    };
    let manifest = serde_json::to_vec_pretty(&manifest).unwrap_or_default();
    let mut zip = ZipWriter::default();
    zip.add(MANIFEST, &manifest);
    for f in &files.files {
        zip.add(&format!("{FILES}{}", f.path), &f.bytes);
    }
    zip.finish()
}

/// The manifest and files of the `.flow` archive `bytes`, checked: every
/// entry is a stored file with its CRC, every path is inside the bundle,
/// the files are those the manifest lists (sizes and SHA-256) and match
/// its digest. Any other archive is refused with the reason.
pub fn unpack(bytes: &[u8]) -> Result<(Manifest, BundleFiles), String> {
    let entries = read_zip(bytes)?;
    let mut manifest = None;
    let mut files = Vec::new();
    let mut total = 0u64;
    for (name, data) in entries {
        if name == MANIFEST {
            let m: Manifest =
                serde_json::from_slice(data).map_err(|e| format!("{MANIFEST}: {e}"))?;
            manifest = Some(m);
            continue;
        }
        let Some(path) = name.strip_prefix(FILES).filter(|p| clean_path(p)) else {
            return Err(format!(
                "{name:?} is neither {MANIFEST} nor a file under {FILES}"
            ));
        };
        total += data.len() as u64;
        if total > MAX_BUNDLE_BYTES {
            return Err(format!(
                "its files are over {MAX_BUNDLE_BYTES} bytes together"
            ));
        }
        files.push(BundleFile {
            path: path.to_string(),
            bytes: data.to_vec(),
        });
    }
    let manifest = manifest.ok_or_else(|| format!("no {MANIFEST}"))?;
    if manifest.format != FORMAT || manifest.format_version != 1 {
        return Err(format!(
            "{MANIFEST}: format {:?} version {} (this build reads {FORMAT:?} version 1)",
            manifest.format, manifest.format_version
        ));
    }
    let files = BundleFiles::new(files)?;
    let listed: Vec<(&str, u64, String)> = files
        .files
        .iter()
        .map(|f| {
            (
                f.path.as_str(),
                f.bytes.len() as u64,
                hex::encode(Sha256::digest(&f.bytes)),
            )
        })
        .collect();
    let mut named: Vec<(&str, u64, String)> = manifest
        .files
        .iter()
        .map(|f| (f.path.as_str(), f.size, f.sha256.clone()))
        .collect();
    named.sort();
    if listed != named {
        return Err(format!("the files do not match those {MANIFEST} lists"));
    }
    if files.digest != manifest.digest {
        return Err(format!(
            "the files' digest is {}, not the {} {MANIFEST} names",
            files.digest, manifest.digest
        ));
    }
    Ok((manifest, files))
}

/// The most bytes a packed bundle may have: the most a bundle's files may
/// hold together, and room for the archive's own records.
pub const MAX_ARCHIVE_BYTES: u64 = MAX_BUNDLE_BYTES + (16 << 20);

/// The bytes of the packed bundle at `path`, refused past
/// [`MAX_ARCHIVE_BYTES`] without reading more.
pub fn read_archive(path: &std::path::Path) -> Result<Vec<u8>, String> {
    use std::io::Read;
    let file = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut bytes = Vec::new();
    file.take(MAX_ARCHIVE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    if bytes.len() as u64 > MAX_ARCHIVE_BYTES {
        return Err(format!(
            "{}: over the {MAX_ARCHIVE_BYTES} bytes a packed bundle may have",
            path.display()
        ));
    }
    Ok(bytes)
}

/// Whether `bytes` look like a zip archive.
pub fn is_archive(bytes: &[u8]) -> bool {
    bytes.starts_with(b"PK\x03\x04")
}

/// Writes a zip archive of stored entries.
#[derive(Default)]
pub(crate) struct ZipWriter {
    out: Vec<u8>,
    central: Vec<u8>,
    count: u16,
}

/// 1980-01-01, the earliest date a zip entry can carry: archives of the
/// same files are the same bytes.
const DOS_DATE: u16 = 0x21;
/// The names are UTF-8 (general purpose flag bit 11).
const UTF8: u16 = 0x0800;

impl ZipWriter {
    pub(crate) fn add(&mut self, name: &str, data: &[u8]) {
        let crc = crc32fast::hash(data);
        let offset = self.out.len() as u32;
        let size = data.len() as u32;
        let mut local = Vec::with_capacity(30 + name.len());
        local.extend(0x0403_4b50u32.to_le_bytes());
        for v in [20u16, UTF8, 0, 0, DOS_DATE] {
            local.extend(v.to_le_bytes());
        }
        for v in [crc, size, size] {
            local.extend(v.to_le_bytes());
        }
        local.extend((name.len() as u16).to_le_bytes());
        local.extend(0u16.to_le_bytes());
        local.extend(name.as_bytes());
        self.out.extend(&local);
        self.out.extend(data);
        self.central.extend(0x0201_4b50u32.to_le_bytes());
        for v in [20u16, 20, UTF8, 0, 0, DOS_DATE] {
            self.central.extend(v.to_le_bytes());
        }
        for v in [crc, size, size] {
            self.central.extend(v.to_le_bytes());
        }
        for v in [name.len() as u16, 0, 0, 0, 0] {
            self.central.extend(v.to_le_bytes());
        }
        self.central.extend(0u32.to_le_bytes());
        self.central.extend(offset.to_le_bytes());
        self.central.extend(name.as_bytes());
        self.count += 1;
    }

    pub(crate) fn finish(mut self) -> Vec<u8> {
        let offset = self.out.len() as u32;
        let size = self.central.len() as u32;
        self.out.extend(&self.central);
        self.out.extend(0x0605_4b50u32.to_le_bytes());
        for v in [0u16, 0, self.count, self.count] {
            self.out.extend(v.to_le_bytes());
        }
        self.out.extend(size.to_le_bytes());
        self.out.extend(offset.to_le_bytes());
        self.out.extend(0u16.to_le_bytes());
        self.out
    }
}

/// Little-endian readers over a byte slice, failing past its end.
fn u16_at(b: &[u8], at: usize) -> Result<u16, String> {
    b.get(at..at + 2)
        .map(|s| u16::from_le_bytes([s[0], s[1]]))
        .ok_or_else(|| "truncated".to_string())
}

fn u32_at(b: &[u8], at: usize) -> Result<u32, String> {
    b.get(at..at + 4)
        .map(|s| u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
        .ok_or_else(|| "truncated".to_string())
}

/// The entries of a zip archive of stored files, by its central
/// directory: each name and its data, CRC-checked.
pub(crate) fn read_zip(b: &[u8]) -> Result<Vec<(String, &[u8])>, String> {
    let not = |why: &str| format!("not a bundle archive: {why}");
    // The end record is the last 22 bytes: the archives read here carry
    // no comment.
    let end = b.len().checked_sub(22).ok_or_else(|| not("too short"))?;
    if u32_at(b, end)? != 0x0605_4b50 {
        return Err(not("no end of central directory record at its end"));
    }
    let count = u16_at(b, end + 10)? as usize;
    let mut at = u32_at(b, end + 16)? as usize;
    if count > MAX_ENTRIES {
        return Err(not("too many entries"));
    }
    let mut out: Vec<(String, &[u8])> = Vec::with_capacity(count);
    // Entries follow one another, each after the last one's data: an
    // archive whose entries overlap (one stored byte counted many times)
    // is refused before anything is checked or copied.
    let mut next_free = 0usize;
    let mut declared = 0u64;
    for _ in 0..count {
        if u32_at(b, at)? != 0x0201_4b50 {
            return Err(not("a damaged central directory"));
        }
        let method = u16_at(b, at + 10)?;
        let crc = u32_at(b, at + 16)?;
        let (csize, usize_) = (u32_at(b, at + 20)? as usize, u32_at(b, at + 24)? as usize);
        let name_len = u16_at(b, at + 28)? as usize;
        let skip = name_len + u16_at(b, at + 30)? as usize + u16_at(b, at + 32)? as usize;
        let local = u32_at(b, at + 42)? as usize;
        let name = b
            .get(at + 46..at + 46 + name_len)
            .and_then(|n| std::str::from_utf8(n).ok())
            .ok_or_else(|| not("an entry name that is not UTF-8"))?
            .to_string();
        at += 46 + skip;
        if method != 0 || csize != usize_ {
            return Err(not(&format!(
                "{name:?} is compressed (stepwell bundle pack stores its entries)"
            )));
        }
        declared += csize as u64;
        if declared > MAX_ARCHIVE_BYTES {
            return Err(not("its entries are over the most a bundle may hold"));
        }
        if local < next_free || out.iter().any(|(n, _)| *n == name) {
            return Err(not(&format!(
                "{name:?} overlaps another entry or repeats its name"
            )));
        }
        if u32_at(b, local)? != 0x0403_4b50 {
            return Err(not(&format!("{name:?} has no local header")));
        }
        let start = local + 30 + u16_at(b, local + 26)? as usize + u16_at(b, local + 28)? as usize;
        let data = b
            .get(start..start + csize)
            .ok_or_else(|| not(&format!("{name:?} is truncated")))?;
        next_free = start + csize;
        if crc32fast::hash(data) != crc {
            return Err(not(&format!("{name:?} fails its CRC")));
        }
        out.push((name, data));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files() -> BundleFiles {
        BundleFiles::new(vec![
            BundleFile {
                path: "flow.json".into(),
                bytes: br#"{"workflow_id":"w"}"#.to_vec(),
            },
            BundleFile {
                path: "steps/s.wasm".into(),
                bytes: b"\0asm\x01\0\0\0".to_vec(),
            },
        ])
        .unwrap()
    }

    #[test]
    fn a_packed_bundle_unpacks_to_the_same_files() {
        let f = files();
        let packed = pack(&f, &["w".into()]);
        assert!(is_archive(&packed));
        assert_eq!(pack(&f, &["w".into()]), packed, "the same bytes every time");
        let (m, back) = unpack(&packed).unwrap();
        assert_eq!(back, f);
        assert_eq!(
            (m.digest.as_str(), m.workflows.as_slice()),
            (f.digest.as_str(), &["w".to_string()][..])
        );
    }

    #[test]
    fn damaged_or_foreign_archives_are_refused() {
        let packed = pack(&files(), &["w".into()]);
        // A byte of a file changed: its CRC fails.
        let mut flipped = packed.clone();
        let at = packed.windows(4).position(|w| w == b"\0asm").unwrap();
        flipped[at + 1] ^= 1;
        assert!(unpack(&flipped).unwrap_err().contains("CRC"));
        // Cut short, or not a zip at all.
        assert!(unpack(&packed[..packed.len() - 5]).is_err());
        assert!(unpack(b"hello").is_err());
        // A file the manifest does not list, with a digest to match.
        let mut more = files();
        more.files.push(BundleFile {
            path: "x".into(),
            bytes: b"1".to_vec(),
        });
        let more = BundleFiles::new(more.files).unwrap();
        let mut zip = ZipWriter::default();
        let manifest = serde_json::to_vec(&Manifest {
            format: FORMAT.into(),
            format_version: 1,
            digest: more.digest.clone(),
            workflows: vec!["w".into()],
            files: vec![],
        })
        .unwrap();
        zip.add(MANIFEST, &manifest);
        for f in &more.files {
            zip.add(&format!("{FILES}{}", f.path), &f.bytes);
        }
        assert!(unpack(&zip.finish()).unwrap_err().contains("do not match"));
        // Two central entries naming one stored entry: refused before any
        // copy.
        let mut zip = ZipWriter::default();
        zip.add("files/a", b"xyz");
        let entry = zip.central.clone();
        let mut renamed = entry.clone();
        let n = renamed.len();
        renamed[n - 1] = b'b';
        zip.central.extend(&renamed);
        zip.count += 1;
        assert!(unpack(&zip.finish()).unwrap_err().contains("overlaps"));
        // A path leaving the bundle.
        let mut zip = ZipWriter::default();
        zip.add("files/../evil", b"x");
        assert!(unpack(&zip.finish()).unwrap_err().contains("neither"));
    }
}
