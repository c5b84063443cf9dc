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
