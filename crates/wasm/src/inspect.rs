//! What a component file is, read without compiling it: its encoding, the
//! world of this host it implements, the contract version it was built
//! against, its imports and exports, and the description its author
//! declared (vars, config, routes) in a `stepwell:node` custom section.
//!
//! The Rust SDK writes that section with `describe_node!`; any toolchain
//! can add one (`wasm-tools metadata add` or a linker flag): its content is
//! one JSON object.

use serde::Serialize;
use serde_json::Value;
use wasmparser::{ComponentExternalKind, ComponentTypeRef, Encoding, Parser, Payload};

/// The custom section a component's author declares what it expects in.
pub const DESCRIPTION_SECTION: &str = "stepwell:node";

/// The most bytes a description may hold: it is read whole and printed.
pub const MAX_DESCRIPTION: usize = 64 * 1024;

/// What [`inspect`] found in a component file.
#[derive(Debug, Clone, Serialize)]
pub struct ComponentInfo {
    /// `component`, or `core module` (which this host does not load).
    pub encoding: &'static str,
    /// The file's size in bytes.
    pub size: u64,
    /// The world of this host whose exports it has: `node`, `tool` or
    /// `trigger-source`; `None` when its exports match none.
    pub world: Option<&'static str>,
    /// The `stepwell:flow` package version its imports name (`0.2.0`), if
    /// it imports from the package; when they name several, all of them,
    /// comma-separated.
    pub contract: Option<String>,
    /// Whether every version named is the one this host implements
    /// ([`crate::CONTRACT`]); `None` when it names none. The host checks
    /// the worlds a component uses, not the version of the type-only
    /// interfaces, so another version may still load.
    pub contract_matches: Option<bool>,
    /// The interfaces and functions the component imports (WASI, the
    /// host's), sorted; the types it imports are left out.
    pub imports: Vec<String>,
    /// The interfaces and functions it exports, sorted.
    pub exports: Vec<String>,
    /// The declared description, when the component carries one.
    pub description: Option<Value>,
    /// Why the description section could not be read, when it is there.
    pub description_error: Option<String>,
}

/// The worlds of this host and the exports that name each.
const WORLDS: &[(&str, &[&str])] = &[
    ("node", &["handle"]),
    ("tool", &["describe", "invoke"]),
    (
        "trigger-source",
        &[
            "descriptor",
            "validate",
            "initial-state",
            "prepare",
            "admit",
        ],
    ),
];

/// Reads `bytes` (a component file) as [`ComponentInfo`].
/// A file that is not WebAssembly is an error naming the byte where reading
/// stopped.
pub fn inspect(bytes: &[u8]) -> Result<ComponentInfo, String> {
    if bytes.is_empty() {
        return Err("not WebAssembly: the file is empty".into());
    }
    if !bytes.starts_with(b"\0asm") {
        let head: String = bytes.iter().take(4).map(|b| format!("{b:02x}")).collect();
        return Err(format!(
            "not WebAssembly: it starts with bytes {head}, not the magic 0061736d (\\0asm)"
        ));
    }
    let mut info = ComponentInfo {
        encoding: "component",
        size: bytes.len() as u64,
        world: None,
        contract: None,
        contract_matches: None,
        imports: Vec::new(),
        exports: Vec::new(),
        description: None,
        description_error: None,
    };
    let mut depth = 0usize;
    for payload in Parser::new(0).parse_all(bytes) {
        let payload = payload.map_err(|e| {
            format!(
                "not a well-formed WebAssembly file: {} (at byte {})",
                e.message(),
                e.offset()
            )
        })?;
        match payload {
            Payload::Version { encoding, .. } => {
                if depth == 0 && encoding == Encoding::Module {
                    info.encoding = "core module";
                }
                depth += 1;
            }
            Payload::End(_) => depth = depth.saturating_sub(1),
            Payload::ComponentImportSection(s) if depth == 1 => {
                for import in s {
                    let import = import.map_err(|e| format!("an import: {}", e.message()))?;
                    if matches!(
                        import.ty,
                        ComponentTypeRef::Instance(_) | ComponentTypeRef::Func(_)
                    ) {
                        info.imports.push(import.name.name.to_string());
                    }
                }
            }
            Payload::ComponentExportSection(s) if depth == 1 => {
                for export in s {
                    let export = export.map_err(|e| format!("an export: {}", e.message()))?;
                    if matches!(
                        export.kind,
                        ComponentExternalKind::Instance | ComponentExternalKind::Func
                    ) {
                        info.exports.push(export.name.name.to_string());
                    }
                }
            }
            Payload::CustomSection(c) if c.name() == DESCRIPTION_SECTION => {
                read_description(&mut info, c.data());
            }
            _ => {}
        }
    }
    info.imports.sort();
    info.exports.sort();
    info.world = WORLDS
        .iter()
        .find(|(_, names)| names.iter().all(|n| info.exports.iter().any(|e| e == n)))
        .map(|(world, _)| *world);
    info.contract = contract_version(&info.imports);
    let ours = crate::CONTRACT.rsplit('@').next();
    info.contract_matches = info.contract.as_deref().map(|v| Some(v) == ours);
    Ok(info)
}

/// `bytes` (a component) with `description` added as its `stepwell:node`
/// section: how a component built by any toolchain declares what it
/// expects. Refused when `description` is not a JSON object or is over
/// [`MAX_DESCRIPTION`], when `bytes` is not a component, and when it
/// declares already (its author's declaration stands).
pub fn with_description(bytes: &[u8], description: &Value) -> Result<Vec<u8>, String> {
    if !description.is_object() {
        return Err("the description must be one JSON object".into());
    }
    let text = description.to_string();
    if text.len() > MAX_DESCRIPTION {
        return Err(format!(
            "the description is {} bytes, more than {MAX_DESCRIPTION}",
            text.len()
        ));
    }
    let info = inspect(bytes)?;
    if info.encoding != "component" {
        return Err("a core module, not a component: this host loads components only".into());
    }
    if info.description.is_some() || info.description_error.is_some() {
        return Err(format!("it has a {DESCRIPTION_SECTION} section already"));
    }
    let mut payload = Vec::new();
    leb128(&mut payload, DESCRIPTION_SECTION.len() as u64);
    payload.extend_from_slice(DESCRIPTION_SECTION.as_bytes());
    payload.extend_from_slice(text.as_bytes());
    let mut out = bytes.to_vec();
    // A custom section (id 0) may come anywhere: last, here.
    out.push(0);
    leb128(&mut out, payload.len() as u64);
    out.extend_from_slice(&payload);
    Ok(out)
}

/// Appends `n` as unsigned LEB128.
fn leb128(out: &mut Vec<u8>, mut n: u64) {
    loop {
        let byte = (n & 0x7f) as u8;
        n >>= 7;
        if n == 0 {
            out.push(byte);
            return;
        }
        out.push(byte | 0x80);
    }
}

/// The route labels a component's description declares (`routes`, a list
/// of strings), if it has a readable one that does.
pub fn declared_routes(bytes: &[u8]) -> Option<Vec<String>> {
    let info = inspect(bytes).ok()?;
    let routes = info.description?.get("routes")?.as_array()?.clone();
    routes
        .iter()
        .map(|r| r.as_str().map(str::to_string))
        .collect()
}

/// The versions of the `stepwell:flow` package the imports name, in order
/// and comma-separated when they differ.
fn contract_version(imports: &[String]) -> Option<String> {
    let mut versions: Vec<&str> = imports
        .iter()
        .filter_map(|i| i.strip_prefix("stepwell:flow/"))
        .filter_map(|rest| rest.split_once('@').map(|(_, v)| v))
        .collect();
    versions.sort_unstable();
    versions.dedup();
    (!versions.is_empty()).then(|| versions.join(", "))
}

/// Reads a description section. A component may carry it twice (the core
/// module's, copied to the component by some linkers): the same text again
/// is the same description; another text is an error.
fn read_description(info: &mut ComponentInfo, data: &[u8]) {
    if let Some(seen) = &info.description {
        let same = data.len() <= MAX_DESCRIPTION
            && serde_json::from_slice::<Value>(data).ok().as_ref() == Some(seen);
        if !same {
            info.description_error = Some(format!("two different {DESCRIPTION_SECTION} sections"));
            info.description = None;
        }
        return;
    }
    if info.description_error.is_some() {
        return;
    }
    if data.len() > MAX_DESCRIPTION {
        info.description_error = Some(format!(
            "the {DESCRIPTION_SECTION} section holds {} bytes, more than {MAX_DESCRIPTION}",
            data.len()
        ));
        return;
    }
    match serde_json::from_slice::<Value>(data) {
        Ok(v @ Value::Object(_)) => match shape_problem(&v) {
            None => info.description = Some(v),
            Some(why) => {
                info.description_error = Some(format!("the {DESCRIPTION_SECTION} section: {why}"))
            }
        },
        Ok(_) => {
            info.description_error = Some(format!(
                "the {DESCRIPTION_SECTION} section is not a JSON object"
            ))
        }
        Err(e) => {
            info.description_error = Some(format!(
                "the {DESCRIPTION_SECTION} section is not JSON: {e}"
            ))
        }
    }
}

/// What is wrong with a description's keys, if anything: `description`
/// is text, `vars` and `config` map names to text, `routes` lists labels,
/// and there is no other key.
fn shape_problem(d: &Value) -> Option<String> {
    let texts = |v: &Value| {
        v.as_object()
            .is_some_and(|m| m.values().all(Value::is_string))
    };
    for (key, value) in d.as_object()? {
        let ok = match key.as_str() {
            "description" => value.is_string(),
            "vars" | "config" => texts(value),
            "routes" => value
                .as_array()
                .is_some_and(|a| a.iter().all(Value::is_string)),
            _ => {
                return Some(format!(
                    "unknown key {key:?} (description, vars, config, routes)"
                ))
            }
        };
        if !ok {
            let want = match key.as_str() {
                "description" => "a string",
                "routes" => "a list of strings",
                _ => "an object of strings (name: what it holds)",
            };
            return Some(format!("{key} must be {want}"));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_is_not_webassembly_is_an_error() {
        let e = inspect(b"#!/bin/sh\necho hi\n").unwrap_err();
        assert!(e.contains("starts with bytes 23212f62"), "{e}");
        let e = inspect(b"\0asm\x0d\0\x01\0\xff").unwrap_err();
        assert!(
            e.starts_with("not a well-formed WebAssembly file") && !e.contains('\n'),
            "{e}"
        );
    }

    #[test]
    fn a_core_module_says_so() {
        // The smallest module: the header alone.
        let info = inspect(b"\0asm\x01\0\0\0").unwrap();
        assert_eq!((info.encoding, info.world), ("core module", None));
    }

    #[test]
    fn the_contract_is_the_version_of_the_host_package() {
        let imports = vec![
            "wasi:cli/environment@0.2.6".to_string(),
            "stepwell:flow/types@0.3.1".to_string(),
        ];
        assert_eq!(contract_version(&imports).as_deref(), Some("0.3.1"));
        assert_eq!(contract_version(&imports[..1]), None);
        let mixed = vec![
            "stepwell:flow/tool-types@0.2.0".to_string(),
            "stepwell:flow/types@0.9.0".to_string(),
        ];
        assert_eq!(contract_version(&mixed).as_deref(), Some("0.2.0, 0.9.0"));
    }

    #[test]
    fn leb128_writes_seven_bits_a_byte() {
        let mut out = Vec::new();
        for n in [0u64, 127, 128, 300, 70_000] {
            leb128(&mut out, n);
        }
        assert_eq!(out, [0, 127, 0x80, 1, 0xac, 2, 0xf0, 0xa2, 4]);
    }

    #[test]
    fn a_description_must_be_one_json_object() {
        let mut info = inspect(b"\0asm\x01\0\0\0").unwrap();
        read_description(&mut info, br#"["a list"]"#);
        assert!(info
            .description_error
            .unwrap()
            .contains("not a JSON object"));
        let mut info = inspect(b"\0asm\x01\0\0\0").unwrap();
        read_description(&mut info, &vec![b' '; MAX_DESCRIPTION + 1]);
        assert!(info.description_error.unwrap().contains("more than"));
        let mut info = inspect(b"\0asm\x01\0\0\0").unwrap();
        read_description(&mut info, br#"{"routes": ["approved"]}"#);
        assert_eq!(info.description.unwrap()["routes"][0], "approved");
        for (bad, why) in [
            (
                r#"{"routes": "approved"}"#,
                "routes must be a list of strings",
            ),
            (
                r#"{"config": "limit"}"#,
                "config must be an object of strings",
            ),
            (r#"{"rutes": []}"#, "unknown key \"rutes\""),
        ] {
            let mut info = inspect(b"\0asm\x01\0\0\0").unwrap();
            read_description(&mut info, bad.as_bytes());
            assert!(
                info.description_error.as_deref().unwrap().contains(why),
                "{bad}"
            );
        }
        assert!(inspect(b"").unwrap_err().contains("empty"));
    }
}
