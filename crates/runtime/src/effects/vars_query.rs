//! `vars_query`: read-only access to the run's vars by dotted path. Pure.

use serde_json::{Map, Value};

use super::{EffectClass, EffectCx, EffectHandler, Outcome};
use crate::core::Result;
use crate::flow::template::lookup;

/// `vars_query {path}` returns the value at that path (`null` if absent);
/// `vars_query {paths: [...]}` returns an object from each path to its value.
pub struct VarsQuery;

impl EffectHandler for VarsQuery {
    fn kind(&self) -> &str {
        "vars_query"
    }

    fn class(&self) -> EffectClass {
        EffectClass::Pure
    }

    fn execute(
        &self,
        cx: &EffectCx<'_>,
        p: &Map<String, Value>,
        _: Option<&Value>,
    ) -> Result<Outcome> {
        let get = |path: &str| lookup(&cx.run.vars, path).cloned().unwrap_or(Value::Null);
        Ok(match (p.get("path"), p.get("paths")) {
            (Some(Value::String(path)), None) => Outcome::Completed(get(path)),
            (None, Some(Value::Array(paths))) => {
                let mut out = Map::new();
                for path in paths {
                    match path.as_str() {
                        Some(s) => {
                            out.insert(s.to_string(), get(s));
                        }
                        None => {
                            return Ok(Outcome::invalid(
                                "vars_query",
                                "paths",
                                "must be an array of strings",
                            ))
                        }
                    }
                }
                Outcome::Completed(Value::Object(out))
            }
            _ => Outcome::invalid(
                "vars_query",
                "path",
                "give exactly one of path (a string) or paths (an array of strings)",
            ),
        })
    }
}
