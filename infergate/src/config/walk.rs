//! The YAML walker: reads mappings by key path, learns each section's keys from its reader, and words every error.

use std::cell::RefCell;
use std::path::Path;

use serde_norway::{Mapping, Value};

use super::ConfigError;

/// Reads one file. While `discovering`, a reader stops at its first [`Node::keys`] call (which returns an error),
/// after recording the names it asks for there: that is how [`key_homes`] learns every section's keys.
#[derive(Clone, Copy)]
pub(super) struct Walker<'a> {
    file: &'a Path,
    discovering: Option<&'a RefCell<Vec<&'static str>>>,
}

/// A mapping being read, with its key path; `map` None means absent or null, read as empty.
pub(super) struct Node<'a> {
    w: Walker<'a>,
    path: String,
    map: Option<&'a Mapping>,
}

/// One key (or list item) and its value (None when absent), with its key path.
#[derive(Clone)]
pub(super) struct Field<'a> {
    w: Walker<'a>,
    path: String,
    value: Option<&'a Value>,
}

/// A section reader as listed in `super::SECTIONS`: given a mapping, it asks for its keys first.
pub(super) type Reader = for<'a> fn(Node<'a>) -> Result<(), ConfigError>;

impl<'a> Walker<'a> {
    /// A walker for `file` (used in messages only).
    pub(super) fn new(file: &'a Path) -> Self {
        Walker {
            file,
            discovering: None,
        }
    }

    pub(super) fn err(&self, key: &str, reason: impl Into<String>) -> ConfigError {
        ConfigError {
            file: self.file.to_path_buf(),
            key: key.to_string(),
            reason: reason.into(),
        }
    }

    /// The whole document, at the empty key path.
    pub(super) fn root(&self, doc: &'a Value) -> Field<'a> {
        Field {
            w: *self,
            path: String::new(),
            value: Some(doc),
        }
    }
}

/// Reads the keys of a mapping into bindings that stand beside their keys: `read_keys!(n; listen, expose:
/// "expose_paths")` is `let [listen, expose] = n.keys(["listen", "expose_paths"])?` without two lists that
/// must agree by position. A binding without a key reads the key of its own name.
macro_rules! read_keys {
    ($n:expr; $($bind:ident $(: $key:literal)?),+ $(,)?) => {
        let [$($bind),+] = $n.keys([$(read_keys!(@key $bind $($key)?)),+])?;
    };
    (@key $bind:ident $key:literal) => {
        $key
    };
    (@key $bind:ident) => {
        stringify!($bind)
    };
}
pub(super) use read_keys;

impl<'a> Node<'a> {
    /// The file being read.
    pub(super) fn file(&self) -> &'a Path {
        self.w.file
    }

    /// An error about the whole mapping.
    pub(super) fn err(&self, reason: impl Into<String>) -> ConfigError {
        self.w.err(&self.path, reason)
    }

    /// Reads the keys `names`, the only keys this mapping may have (listed in the order messages list them):
    /// any other key is an error that suggests the closest of `names` or the section it belongs in.
    pub(super) fn keys<const N: usize>(
        &self,
        names: [&'static str; N],
    ) -> Result<[Field<'a>; N], ConfigError> {
        self.accept(&names)?;
        Ok(names.map(|k| self.field(k)))
    }

    /// Checks that every key of the mapping is one of `names` (for mappings read entry by entry; see `keys`).
    pub(super) fn accept(&self, names: &[&'static str]) -> Result<(), ConfigError> {
        if let Some(found) = self.w.discovering {
            found.borrow_mut().extend_from_slice(names);
            return Err(self.err("(discovering keys)"));
        }
        for k in self.map.into_iter().flat_map(|m| m.keys()) {
            match k {
                Value::String(name) if names.contains(&name.as_str()) => {}
                Value::String(name) => {
                    return Err(self
                        .w
                        .err(&join(&self.path, name), unknown_key_reason(name, names)))
                }
                other => {
                    let shown = serde_norway::to_string(other).unwrap_or_default();
                    return Err(self.w.err(
                        &join(&self.path, shown.trim()),
                        format!("keys must be strings, found {}", kind(other)),
                    ));
                }
            }
        }
        Ok(())
    }

    /// The entries (key, value, field) in file order, for a mapping read entry by entry after `accept`.
    pub(super) fn entries(&self) -> impl Iterator<Item = (&'a Value, &'a Value, Field<'a>)> + '_ {
        self.map.into_iter().flatten().map(|(k, v)| {
            let field = Field {
                w: self.w,
                path: join(&self.path, k.as_str().unwrap_or_default()),
                value: Some(v),
            };
            (k, v, field)
        })
    }

    fn field(&self, key: &str) -> Field<'a> {
        Field {
            w: self.w,
            path: join(&self.path, key),
            value: self.map.and_then(|m| m.get(key)),
        }
    }
}

impl<'a> Field<'a> {
    pub(super) fn path(&self) -> &str {
        &self.path
    }

    pub(super) fn value(&self) -> Option<&'a Value> {
        self.value
    }

    pub(super) fn err(&self, reason: impl Into<String>) -> ConfigError {
        self.w.err(&self.path, reason)
    }

    /// An error at `key` under this field (e.g. `pools[1]` + `name`).
    pub(super) fn err_in(&self, key: &str, reason: impl Into<String>) -> ConfigError {
        self.w.err(&join(&self.path, key), reason)
    }

    /// An error at `key` under item `i` of this field's list (e.g. `endpoints` + 1 + `kv_events`).
    pub(super) fn err_in_item(
        &self,
        i: usize,
        key: &str,
        reason: impl Into<String>,
    ) -> ConfigError {
        self.w
            .err(&join(&format!("{}[{i}]", self.path), key), reason)
    }

    /// "expected {expected}, found {what `found` is}".
    pub(super) fn type_err(&self, expected: &str, found: &Value) -> ConfigError {
        self.err(format!("expected {expected}, found {}", kind(found)))
    }

    /// Item `i` of this field's list.
    pub(super) fn item(&self, i: usize, v: &'a Value) -> Field<'a> {
        Field {
            w: self.w,
            path: format!("{}[{i}]", self.path),
            value: Some(v),
        }
    }

    /// The value; absent is "required key is missing".
    pub(super) fn required(&self) -> Result<&'a Value, ConfigError> {
        self.value
            .ok_or_else(|| self.err("required key is missing"))
    }

    /// A sub-mapping whose keys the reader then asks for; absent or null reads as empty.
    pub(super) fn section(&self) -> Result<Node<'a>, ConfigError> {
        let map = match self.value {
            None | Some(Value::Null) => None,
            Some(Value::Mapping(m)) => Some(m),
            Some(other) => return Err(self.type_err("a mapping", other)),
        };
        Ok(Node {
            w: self.w,
            path: self.path.clone(),
            map,
        })
    }

    /// A section that is off when absent (None); null reads as present and empty.
    pub(super) fn optional_section(&self) -> Result<Option<Node<'a>>, ConfigError> {
        match self.value {
            None => Ok(None),
            Some(_) => self.section().map(Some),
        }
    }

    /// A required string.
    pub(super) fn string(&self) -> Result<&'a str, ConfigError> {
        match self.required()? {
            Value::String(s) => Ok(s),
            other => Err(self.type_err("a string", other)),
        }
    }

    /// A required non-negative integer.
    pub(super) fn uint(&self) -> Result<u64, ConfigError> {
        match self.required()? {
            Value::Number(n) => {
                if let Some(u) = n.as_u64() {
                    Ok(u)
                } else if n.is_i64() {
                    Err(self.err(format!("expected a non-negative integer, found {n}")))
                } else {
                    Err(self.err(format!("expected an integer, found {n}")))
                }
            }
            other => Err(self.type_err("an integer", other)),
        }
    }

    /// A non-negative integer, `default` when absent.
    pub(super) fn uint_or(&self, default: u64) -> Result<u64, ConfigError> {
        match self.value {
            None => Ok(default),
            Some(_) => self.uint(),
        }
    }

    /// A positive integer, `default` when absent.
    pub(super) fn positive_or(&self, default: u64) -> Result<u64, ConfigError> {
        let n = self.uint_or(default)?;
        if n == 0 {
            return Err(self.err("must be at least 1"));
        }
        Ok(n)
    }
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

/// "a string", "a number", ... for "expected X, found Y".
pub(super) fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "nothing (null)",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Sequence(_) => "a list",
        Value::Mapping(_) => "a mapping",
        Value::Tagged(_) => "a tagged value",
    }
}

/// The reason for a file that is not valid YAML, with the parser's position.
pub(super) fn yaml_reason(e: &serde_norway::Error) -> String {
    let msg = e.to_string();
    match e.location() {
        // The parser reports a duplicate key at the start of the mapping that holds it.
        Some(loc) if msg.starts_with("duplicate entry") => format!(
            "invalid YAML: {msg} (in the mapping that starts at line {} column {})",
            loc.line(),
            loc.column()
        ),
        Some(loc) if !msg.contains(" line ") => {
            format!(
                "invalid YAML at line {} column {}: {msg}",
                loc.line(),
                loc.column()
            )
        }
        _ => format!("invalid YAML: {msg}"),
    }
}

/// The keys `read` asks for: runs it on an empty mapping up to its first `keys` (or `accept`) call.
pub(super) fn discover(read: Reader) -> Vec<&'static str> {
    let found = RefCell::new(Vec::new());
    let w = Walker {
        file: Path::new(""),
        discovering: Some(&found),
    };
    let _ = read(Node {
        w,
        path: String::new(),
        map: None,
    });
    found.into_inner()
}

/// Where each key of the file lives (section, keys), from the section readers, to point at the right section when
/// a key is misplaced.
fn key_homes() -> Vec<(&'static str, Vec<&'static str>)> {
    super::SECTIONS
        .iter()
        .map(|(home, read)| (*home, discover(*read)))
        .collect()
}

fn unknown_key_reason(key: &str, known: &[&str]) -> String {
    let best = known
        .iter()
        .map(|k| {
            let ndl = strsim::normalized_damerau_levenshtein(key, k);
            let jw = strsim::jaro_winkler(key, k);
            (ndl + jw, ndl, jw, *k)
        })
        .max_by(|a, b| a.0.total_cmp(&b.0));
    let elsewhere: Vec<&str> = key_homes()
        .into_iter()
        .filter(|(_, keys)| keys.as_slice() != known && keys.contains(&key))
        .map(|(home, _)| home)
        .collect();
    let placement = if elsewhere.is_empty() {
        String::new()
    } else {
        format!("`{key}` belongs in {}", elsewhere.join(" or "))
    };
    match best {
        Some((_, ndl, jw, k)) if ndl >= 0.5 || jw >= 0.85 => {
            let mut r = format!("unknown key `{key}`; did you mean `{k}`?");
            if !placement.is_empty() {
                r.push_str(&format!(" (or move it: {placement})"));
            }
            r
        }
        _ if !placement.is_empty() => format!("unknown key `{key}` here; {placement}"),
        _ => format!("unknown key `{key}`; known keys here: {}", known.join(", ")),
    }
}

/// A secret (API key, password) read from the file this field names: trimmed, non-empty UTF-8.
pub(super) fn secret_from_file(f: &Field<'_>) -> Result<String, ConfigError> {
    let fname = f.string()?.trim();
    if fname.is_empty() {
        return Err(f.err("must name a file"));
    }
    match std::fs::read(fname) {
        Err(err) => Err(f.err(format!("cannot read `{fname}`: {err}"))),
        Ok(bytes) => match String::from_utf8(bytes) {
            Err(_) => Err(f.err(format!("`{fname}` is not valid UTF-8"))),
            Ok(text) if text.trim().is_empty() => Err(f.err(format!("`{fname}` is empty"))),
            Ok(text) => Ok(text.trim().to_string()),
        },
    }
}

#[cfg(test)]
mod tests;
