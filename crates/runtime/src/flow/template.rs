//! Payload templates of built-in nodes: JSON in which an object of the exact
//! form `{"$var": "a.b.c"}` stands for the value at that dotted path of the
//! run's vars (`null` when absent).

use serde_json::{Map, Value};

/// Evaluates `template` against `vars`.
pub fn render(template: &Value, vars: &Map<String, Value>) -> Value {
    match template {
        Value::Object(map) => {
            if map.len() == 1 {
                if let Some(Value::String(path)) = map.get("$var") {
                    return lookup(vars, path).cloned().unwrap_or(Value::Null);
                }
            }
            Value::Object(
                map.iter()
                    .map(|(k, v)| (k.clone(), render(v, vars)))
                    .collect(),
            )
        }
        Value::Array(items) => Value::Array(items.iter().map(|v| render(v, vars)).collect()),
        other => other.clone(),
    }
}

/// The value at a dotted path (`user_input.text`, `items.0`) of `vars`.
pub fn lookup<'a>(vars: &'a Map<String, Value>, path: &str) -> Option<&'a Value> {
    let mut parts = path.split('.');
    let mut cur = vars.get(parts.next()?)?;
    for part in parts {
        cur = match cur {
            Value::Object(map) => map.get(part)?,
            Value::Array(items) => items.get(part.parse::<usize>().ok()?)?,
            _ => return None,
        };
    }
    Some(cur)
}

/// Writes `value` at a dotted path of `vars`, creating (or replacing with)
/// objects along the way.
pub fn assign(vars: &mut Map<String, Value>, path: &str, value: Value) {
    let mut parts: Vec<&str> = path.split('.').collect();
    let last = parts.pop().unwrap_or(path);
    let mut cur = vars;
    for part in parts {
        let slot = cur
            .entry(part.to_string())
            .or_insert_with(|| Value::Object(Map::new()));
        if !slot.is_object() {
            *slot = Value::Object(Map::new());
        }
        cur = match slot {
            Value::Object(map) => map,
            _ => unreachable!("slot was just made an object"),
        };
    }
    cur.insert(last.to_string(), value);
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn renders_var_references_and_leaves_the_rest() {
        let vars = json!({"a": {"b": [1, {"c": "x"}]}, "n": 2});
        let vars = vars.as_object().unwrap();
        let t = json!({"k": {"$var": "a.b.1.c"}, "m": [{"$var": "n"}, 3], "z": {"$var": "nope"}});
        assert_eq!(render(&t, vars), json!({"k": "x", "m": [2, 3], "z": null}));
        let not_a_reference = json!({"$var": "n", "other": 1});
        assert_eq!(render(&not_a_reference, vars), not_a_reference);
    }

    #[test]
    fn assigns_nested_paths() {
        let mut vars = Map::new();
        assign(&mut vars, "a.b", json!(1));
        assign(&mut vars, "top", json!(true));
        assign(&mut vars, "top.inner", json!(2));
        assert_eq!(
            Value::Object(vars),
            json!({"a": {"b": 1}, "top": {"inner": 2}})
        );
    }
}

/// Property tests: random templates, paths and vars.
#[cfg(test)]
mod properties {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;
    use stepwell_strategies::{config, scalar, value, value_from};

    /// The segments of the paths generated: short names and array indices,
    /// written as JSON Pointer writes them (no sign, no leading zero).
    const SEGMENTS: [&str; 7] = ["", "a", "b", "ab", "0", "1", "10"];

    /// A segment of a path.
    fn segment() -> impl Strategy<Value = &'static str> {
        prop::sample::select(&SEGMENTS[..])
    }

    /// A key: mostly a segment (so that paths meet it), else `$var` or any
    /// text.
    fn key() -> BoxedStrategy<String> {
        prop_oneof![
            4 => segment().prop_map(str::to_string),
            1 => Just("$var".to_string()),
            1 => any::<String>(),
        ]
        .boxed()
    }

    /// A dotted path: segments, or any text.
    fn path() -> impl Strategy<Value = String> {
        prop_oneof![
            3 => prop::collection::vec(segment(), 1..4).prop_map(|s| s.join(".")),
            1 => any::<String>(),
        ]
    }

    /// A template: values with var references (`{"$var": path}`) among
    /// their scalars.
    fn template() -> impl Strategy<Value = Value> {
        let reference = path().prop_map(|p| json!({ "$var": p }));
        value_from(prop_oneof![3 => scalar(), 1 => reference].boxed(), key())
    }

    /// Vars whose keys paths meet.
    fn vars() -> impl Strategy<Value = Map<String, Value>> {
        prop::collection::btree_map(key(), value_from(scalar().boxed(), key()), 0..6)
            .prop_map(|m| m.into_iter().collect())
    }

    /// Whether `v` holds a var reference anywhere.
    fn has_reference(v: &Value) -> bool {
        match v {
            Value::Object(m) => {
                (m.len() == 1 && m.get("$var").is_some_and(Value::is_string))
                    || m.values().any(has_reference)
            }
            Value::Array(items) => items.iter().any(has_reference),
            _ => false,
        }
    }

    proptest! {
        #![proptest_config(config())]

        /// Any template renders against any vars without a panic, and one
        /// without a var reference renders to itself.
        #[test]
        fn a_template_without_references_renders_to_itself(
            t in template(),
            vars in vars(),
        ) {
            let out = render(&t, &vars);
            if !has_reference(&t) {
                prop_assert_eq!(out, t);
            }
        }

        /// A value assigned at any path is what the path looks up and what
        /// a reference to it renders, wherever the reference stands; the
        /// vars off the path stay as they were.
        #[test]
        fn a_reference_renders_what_was_assigned_at_its_path(
            t in value_from(scalar().boxed(), key()),
            p in path(),
            v in value(),
            vars in vars(),
        ) {
            prop_assume!(!has_reference(&t));
            let mut assigned = vars.clone();
            assign(&mut assigned, &p, v.clone());
            prop_assert_eq!(lookup(&assigned, &p), Some(&v));
            let first = p.split('.').next().unwrap_or_default();
            for (k, old) in &vars {
                if k != first {
                    prop_assert_eq!(assigned.get(k), Some(old));
                }
            }
            let tmpl = json!([t, {"$var": p}, {"k": {"$var": p}, "$var": "not alone"}]);
            prop_assert_eq!(
                render(&tmpl, &assigned),
                json!([t, v, {"k": v, "$var": "not alone"}])
            );
        }

        /// A dotted path looks up what the JSON Pointer of its segments
        /// points to (object keys and array indices alike), and a
        /// reference to it renders that, or `null` where it points nowhere.
        #[test]
        fn a_path_looks_up_what_its_json_pointer_points_to(
            vars in vars(),
            segments in prop::collection::vec(segment(), 1..4),
        ) {
            let p = segments.join(".");
            let pointer = format!("/{}", segments.join("/"));
            let root = Value::Object(vars.clone());
            prop_assert_eq!(lookup(&vars, &p), root.pointer(&pointer));
            prop_assert_eq!(
                render(&json!({ "$var": p }), &vars),
                root.pointer(&pointer).cloned().unwrap_or(Value::Null)
            );
        }
    }
}
