//! A bundle's files as one value: every store keeps the files of each
//! deployed version ([`stepwell_store::deployments`]), and a host that must run a
//! version it has not loaded reads them from the store and loads them from
//! memory, so every host runs the code the store recorded, whatever (if
//! anything) lies at the bundle's original path on that machine.
//!
//! A bundle's files are its flow files (`flow.json`, `*.flow.json`) and the
//! components they name, by their paths inside the bundle directory. The
//! digest (SHA-256 over every path and content, in path order) names the
//! bundle's contents: a store keeps one copy per digest, a host compiles
//! one per digest, and content that does not match its digest is refused.

use std::path::{Path, PathBuf};

use serde_json::Value;

use sha2::{Digest, Sha256};
pub use stepwell_store::bundles::clean_path;
use stepwell_store::bundles::slash_path;
pub use stepwell_store::bundles::{BundleFile, BundleFiles, MAX_BUNDLE_BYTES, OUTSIDE};

use super::{Bundle, FlowError};

/// The files of the loaded `bundle`: its flow files and every component
/// they name, each under the path the flow names it by. A component
/// named otherwise than by a plain relative path (`../x.wasm`,
/// `a/../x.wasm`, an absolute path: inside the bundle directory or
/// not) is kept under `.stepwell-outside/<digest of its content>/<its
/// name>` ([`OUTSIDE`]), and the flow files that name it are kept with
/// that path instead. A bundle over [`MAX_BUNDLE_BYTES`] is refused.
pub fn collect(bundle: &Bundle) -> Result<BundleFiles, FlowError> {
    // (path in the bundle, where to read it, or the bytes to keep)
    let mut wanted: Vec<(String, PathBuf, Option<Vec<u8>>)> = Vec::new();
    for wf in &bundle.workflows {
        let text = std::fs::read(&wf.source)
            .map_err(|e| FlowError::new(&wf.source, "", format!("cannot read it again: {e}")))?;
        let mut doc: Value = serde_json::from_slice(&text)
            .map_err(|e| FlowError::new(&wf.source, "", e.to_string()))?;
        let base = wf.source.parent().unwrap_or(&bundle.dir).to_path_buf();
        let inside = |file: &Path| file.strip_prefix(&bundle.dir).ok().and_then(slash_path);
        let mut rewritten = false;
        let nodes = doc["nodes"].as_object_mut().into_iter().flatten();
        for (id, node) in nodes {
            let Some(c) = node["component"].as_str() else {
                continue;
            };
            let field = format!("nodes.{id}.component");
            let file = base
                .join(c)
                .canonicalize()
                .map_err(|e| FlowError::new(&wf.source, &field, e.to_string()))?;
            // Kept under the name the flow gives it (a symbolic link
            // keeps its name, with its target's bytes); a name that is
            // not a plain relative path (`../x.wasm`, `a/../x.wasm`, an
            // absolute path) is replaced, in the kept flow file, by one
            // of the bundle's own.
            let kept = if clean_path(c) {
                c.to_string()
            } else {
                let name = file
                    .file_name()
                    .and_then(|n| n.to_str())
                    .filter(|n| clean_path(n))
                    .ok_or_else(|| {
                        FlowError::new(&wf.source, &field, "not a file name in UTF-8")
                    })?;
                // Named by its content: the same bundle loaded from
                // another checkout keeps the same files.
                let bytes = std::fs::read(&file)
                    .map_err(|e| FlowError::new(&file, "", format!("cannot read the file: {e}")))?;
                let tag = hex::encode(&Sha256::digest(&bytes)[..8]);
                let kept = format!("{OUTSIDE}/{tag}/{name}");
                node["component"] = Value::String(kept.clone());
                rewritten = true;
                kept
            };
            // Paths in a flow file are relative to its folder.
            let kept = match inside(&base) {
                Some(folder) => format!("{folder}/{kept}"),
                None => kept,
            };
            wanted.push((kept, file, None));
        }
        let source = inside(&wf.source)
            .ok_or_else(|| FlowError::new(&wf.source, "", "not a path inside the bundle"))?;
        let bytes = if rewritten {
            serde_json::to_vec(&doc).map_err(|e| FlowError::new(&wf.source, "", e.to_string()))?
        } else {
            text
        };
        wanted.push((source, wf.source.clone(), Some(bytes)));
    }
    wanted.sort_by(|a, b| a.0.cmp(&b.0));
    wanted.dedup_by(|a, b| a.0 == b.0 && a.1 == b.1);
    let mut files = Vec::with_capacity(wanted.len());
    let mut total = 0u64;
    for (path, from, bytes) in wanted {
        let bytes = match bytes {
            Some(b) => b,
            None => std::fs::read(&from)
                .map_err(|e| FlowError::new(&from, "", format!("cannot read the file: {e}")))?,
        };
        total += bytes.len() as u64;
        if total > MAX_BUNDLE_BYTES {
            return Err(FlowError::new(
                &bundle.dir,
                "",
                format!("the bundle's files are over {MAX_BUNDLE_BYTES} bytes together"),
            ));
        }
        files.push(BundleFile { path, bytes });
    }
    BundleFiles::new(files).map_err(|m| FlowError::new(&bundle.dir, "", m))
}
