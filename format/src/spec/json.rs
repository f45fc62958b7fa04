//! Typed reads of config.json fields, each error naming the file and the field.

use crate::FormatError;
use serde_json::Value;

/// A config object (config.json, or its `text_config` when a multimodal wrapper nests the
/// language model's config) with the name it has in messages.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Fields<'a> {
    /// The object.
    pub v: &'a Value,
    /// The file name for messages (`config.json`).
    pub file: &'a str,
    /// The field prefix for messages (`""` or `"text_config."`).
    pub prefix: &'a str,
}

impl<'a> Fields<'a> {
    /// A config error naming the file.
    pub fn err(&self, what: impl Into<String>) -> FormatError {
        FormatError::Config {
            file: self.file.into(),
            what: what.into(),
        }
    }

    /// The raw value of `key`, `None` when absent or null.
    pub fn get(&self, key: &str) -> Option<&'a Value> {
        self.v.get(key).filter(|x| !x.is_null())
    }

    /// `key` as a non-negative integer, `None` when absent or null.
    pub fn usize(&self, key: &str) -> Result<Option<usize>, FormatError> {
        match self.get(key) {
            None => Ok(None),
            Some(x) => x.as_u64().map(|n| Some(n as usize)).ok_or_else(|| {
                self.err(format!(
                    "{}{key} must be a non-negative integer, found {x}",
                    self.prefix
                ))
            }),
        }
    }

    /// `key` as a non-negative integer, required.
    pub fn req_usize(&self, key: &str) -> Result<usize, FormatError> {
        self.usize(key)?
            .ok_or_else(|| self.err(format!("missing field {}{key}", self.prefix)))
    }

    /// `key` as a number, `None` when absent or null.
    pub fn f64(&self, key: &str) -> Result<Option<f64>, FormatError> {
        match self.get(key) {
            None => Ok(None),
            Some(x) => x.as_f64().map(Some).ok_or_else(|| {
                self.err(format!("{}{key} must be a number, found {x}", self.prefix))
            }),
        }
    }

    /// `key` as a boolean, `None` when absent or null.
    pub fn bool(&self, key: &str) -> Result<Option<bool>, FormatError> {
        match self.get(key) {
            None => Ok(None),
            Some(x) => x.as_bool().map(Some).ok_or_else(|| {
                self.err(format!(
                    "{}{key} must be true or false, found {x}",
                    self.prefix
                ))
            }),
        }
    }

    /// `key` as a string, `None` when absent or null.
    pub fn str(&self, key: &str) -> Result<Option<&'a str>, FormatError> {
        match self.get(key) {
            None => Ok(None),
            Some(x) => x.as_str().map(Some).ok_or_else(|| {
                self.err(format!("{}{key} must be a string, found {x}", self.prefix))
            }),
        }
    }

    /// `key` as a list of strings, `None` when absent or null.
    pub fn strings(&self, key: &str) -> Result<Option<Vec<&'a str>>, FormatError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Array(a)) => a
                .iter()
                .map(|x| {
                    x.as_str().ok_or_else(|| {
                        self.err(format!("{}{key} must list strings, found {x}", self.prefix))
                    })
                })
                .collect::<Result<Vec<_>, _>>()
                .map(Some),
            Some(x) => Err(self.err(format!("{}{key} must be a list, found {x}", self.prefix))),
        }
    }

    /// A nested object `key` (e.g. `rope_scaling`), with its own prefix for messages.
    pub fn object(&self, key: &str, prefix: &'a str) -> Option<Fields<'a>> {
        self.get(key).filter(|x| x.is_object()).map(|v| Fields {
            v,
            file: self.file,
            prefix,
        })
    }
}

/// Reads `eos_token_id` (an int, a list of ints, or null) from a config object.
///
/// # Errors
/// [`FormatError::Config`] naming `file` when the field has another type.
pub fn eos_ids(v: &Value, file: &str) -> Result<Vec<u32>, FormatError> {
    let bad = |x: &Value| FormatError::Config {
        file: file.into(),
        what: format!("eos_token_id must be an integer or a list of integers, found {x}"),
    };
    match v.get("eos_token_id") {
        None | Some(Value::Null) => Ok(vec![]),
        Some(Value::Array(a)) => a
            .iter()
            .map(|x| x.as_u64().map(|n| n as u32).ok_or_else(|| bad(x)))
            .collect(),
        Some(x) => Ok(vec![x.as_u64().ok_or_else(|| bad(x))? as u32]),
    }
}
