//! Tools and structured output in requests, for both APIs: tool definitions (OpenAI
//! `tools[].function`, Anthropic `tools[]` with `input_schema`) kept in OpenAI's shape (what chat
//! templates read), `tool_choice`, `response_format`, and the checks that answer bad ones with a
//! 400 naming the field. The grammar a forced choice compiles to is built in `prepare`
//! (`mod.rs`) with the model's tool-call syntax ([`coli_engine::tool_calls`]).

use super::api::ApiError;
use serde_json::{json, Map, Value};

/// Most tools one request may offer: each is rendered into the prompt and may be compiled
/// into a grammar.
pub const MAX_TOOLS: usize = 128;

/// Longest tool name (OpenAI's limit).
const MAX_NAME: usize = 64;

/// What the model may do with the tools offered.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum ToolChoice {
    /// No call: the tools are not shown to the model (OpenAI `none`, Anthropic `none`).
    None,
    /// The model decides (the default when tools are given).
    #[default]
    Auto,
    /// At least one call, of any tool (OpenAI `required`, Anthropic `any`): enforced by a
    /// grammar.
    Required,
    /// A call of this tool (OpenAI `{"type": "function", ...}`, Anthropic `{"type": "tool"}`):
    /// enforced by a grammar.
    Named(String),
}

/// The tools part of a request.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ToolRequest {
    /// OpenAI-shaped tools, `{"type": "function", "function": {"name", "description",
    /// "parameters"}}`.
    pub tools: Vec<Value>,
    /// `tool_choice`.
    pub choice: ToolChoice,
    /// Whether several calls may come in one reply (`parallel_tool_calls`; Anthropic's
    /// `disable_parallel_tool_use` negated).
    pub parallel: bool,
    /// `response_format`: the JSON schema the reply must follow (`json_object`: any object).
    pub json_schema: Option<Value>,
}

impl ToolRequest {
    /// Whether replies are parsed for calls (tools offered and not `none`).
    pub fn active(&self) -> bool {
        !self.tools.is_empty() && self.choice != ToolChoice::None
    }

    /// Whether a grammar forces the reply.
    pub fn forced(&self) -> bool {
        self.active() && matches!(self.choice, ToolChoice::Required | ToolChoice::Named(_))
    }

    /// The tools a forced reply may call.
    pub fn callable(&self) -> Vec<&Value> {
        self.tools
            .iter()
            .filter(|t| match &self.choice {
                ToolChoice::Named(n) => tool_name(t) == Some(n.as_str()),
                _ => true,
            })
            .collect()
    }
}

/// The name of an OpenAI-shaped tool.
pub fn tool_name(t: &Value) -> Option<&str> {
    t.get("function")?.get("name")?.as_str()
}

fn check_name(name: &str, param: &str) -> Result<(), ApiError> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '.');
    if ok {
        Ok(())
    } else {
        Err(ApiError::invalid(
            param,
            format!(
                "Invalid '{param}': '{name}' does not match '^[a-zA-Z0-9_.-]{{1,{MAX_NAME}}}$'."
            ),
        ))
    }
}

/// A parameters schema: an object (a JSON Schema), `{"type": "object"}` when absent.
fn check_schema(v: Option<&Value>, param: &str) -> Result<Value, ApiError> {
    match v {
        None | Some(Value::Null) => Ok(json!({"type": "object", "properties": {}})),
        Some(Value::Object(o)) => {
            if let Some(t) = o.get("type") {
                let object = match t {
                    Value::String(s) => s == "object",
                    Value::Array(a) => a.iter().any(|x| x == "object"),
                    _ => false,
                };
                if !object {
                    return Err(ApiError::invalid(
                        param,
                        format!("Invalid schema for '{param}': the arguments of a function must be an object schema (\"type\": \"object\"), got type {t}."),
                    ));
                }
            }
            if let Some(p) = o.get("properties") {
                if !p.is_object() {
                    return Err(ApiError::invalid(
                        param,
                        format!("Invalid schema for '{param}': 'properties' must be an object."),
                    ));
                }
            }
            if let Some(r) = o.get("required") {
                if !r.as_array().is_some_and(|a| a.iter().all(Value::is_string)) {
                    return Err(ApiError::invalid(
                        param,
                        format!(
                            "Invalid schema for '{param}': 'required' must be an array of strings."
                        ),
                    ));
                }
            }
            Ok(Value::Object(o.clone()))
        }
        Some(other) => Err(ApiError::wrong_type(param, "a JSON Schema object", other)),
    }
}

fn too_many(param: &str, n: usize) -> ApiError {
    ApiError::invalid(
        param,
        format!("Invalid '{param}': at most {MAX_TOOLS} tools, got {n}."),
    )
}

fn unique(tools: &[Value], param: &str) -> Result<(), ApiError> {
    let mut seen = std::collections::HashSet::new();
    for t in tools {
        let n = tool_name(t).unwrap_or_default();
        if !seen.insert(n) {
            return Err(ApiError::invalid(
                param,
                format!("Invalid '{param}': two tools are named '{n}'."),
            ));
        }
    }
    Ok(())
}

/// The request's `tools` array (empty when absent), at most [`MAX_TOOLS`] long.
fn tool_list(obj: &Map<String, Value>) -> Result<&[Value], ApiError> {
    let list = match obj.get("tools") {
        None | Some(Value::Null) => return Ok(&[]),
        Some(Value::Array(a)) => a,
        Some(v) => return Err(ApiError::wrong_type("tools", "an array", v)),
    };
    if list.len() > MAX_TOOLS {
        return Err(too_many("tools", list.len()));
    }
    Ok(list)
}

/// An OpenAI-shaped function tool.
fn function_tool(name: String, description: Option<&Value>, parameters: Value) -> Value {
    let mut func = json!({"name": name});
    if let Some(d) = description.and_then(Value::as_str) {
        func["description"] = json!(d);
    }
    func["parameters"] = parameters;
    json!({"type": "function", "function": func})
}

/// OpenAI `tools`.
pub fn openai_tools(obj: &Map<String, Value>) -> Result<Vec<Value>, ApiError> {
    let list = tool_list(obj)?;
    let mut out = Vec::with_capacity(list.len());
    for (i, t) in list.iter().enumerate() {
        let p = format!("tools[{i}]");
        let Some(t) = t.as_object() else {
            return Err(ApiError::wrong_type(&p, "an object", t));
        };
        match t.get("type").and_then(Value::as_str) {
            Some("function") => {}
            Some(other) => {
                return Err(ApiError::unsupported(
                    &format!("{p}.type"),
                    &format!("(tool type \"{other}\"; only \"function\")"),
                ))
            }
            None => {
                return Err(ApiError::invalid(
                    &format!("{p}.type"),
                    format!("Missing required parameter: '{p}.type'."),
                ))
            }
        }
        let Some(f) = t.get("function").and_then(Value::as_object) else {
            return Err(ApiError::invalid(
                &format!("{p}.function"),
                format!("Missing required parameter: '{p}.function'."),
            ));
        };
        let name = match f.get("name") {
            Some(Value::String(s)) => s.clone(),
            Some(v) => {
                return Err(ApiError::wrong_type(
                    &format!("{p}.function.name"),
                    "a string",
                    v,
                ))
            }
            None => {
                return Err(ApiError::invalid(
                    &format!("{p}.function.name"),
                    format!("Missing required parameter: '{p}.function.name'."),
                ))
            }
        };
        check_name(&name, &format!("{p}.function.name"))?;
        let params = check_schema(f.get("parameters"), &format!("{p}.function.parameters"))?;
        out.push(function_tool(name, f.get("description"), params));
    }
    unique(&out, "tools")?;
    Ok(out)
}

/// Anthropic `tools` (`{"name", "description", "input_schema"}`), as OpenAI-shaped tools.
pub fn anthropic_tools(obj: &Map<String, Value>) -> Result<Vec<Value>, ApiError> {
    let list = tool_list(obj)?;
    let mut out = Vec::with_capacity(list.len());
    for (i, t) in list.iter().enumerate() {
        let p = format!("tools.{i}");
        let Some(t) = t.as_object() else {
            return Err(ApiError::wrong_type(&p, "an object", t));
        };
        if let Some(ty) = t.get("type").and_then(Value::as_str) {
            if ty != "custom" {
                return Err(ApiError::unsupported(
                    &format!("{p}.type"),
                    &format!("(server tool \"{ty}\"; only client tools with an input_schema)"),
                ));
            }
        }
        let name = match t.get("name") {
            Some(Value::String(s)) => s.clone(),
            Some(v) => return Err(ApiError::wrong_type(&format!("{p}.name"), "a string", v)),
            None => {
                return Err(ApiError::invalid(
                    &format!("{p}.name"),
                    format!("{p}.name: Field required"),
                ))
            }
        };
        check_name(&name, &format!("{p}.name"))?;
        if t.get("input_schema").is_none() {
            return Err(ApiError::invalid(
                &format!("{p}.input_schema"),
                format!("{p}.input_schema: Field required"),
            ));
        }
        let params = check_schema(t.get("input_schema"), &format!("{p}.input_schema"))?;
        out.push(function_tool(name, t.get("description"), params));
    }
    unique(&out, "tools")?;
    Ok(out)
}

fn absent_tool(param: &str, name: &str) -> ApiError {
    ApiError::invalid(
        param,
        format!("Invalid '{param}': no tool named '{name}' in 'tools'."),
    )
}

fn needs_tools(param: &str) -> ApiError {
    ApiError::invalid(
        param,
        format!("Invalid '{param}': a call is asked for but 'tools' is empty."),
    )
}

/// OpenAI `tool_choice` and `parallel_tool_calls` for `tools`.
pub fn openai_choice(
    obj: &Map<String, Value>,
    tools: &[Value],
) -> Result<(ToolChoice, bool), ApiError> {
    let choice = match obj.get("tool_choice") {
        None | Some(Value::Null) => ToolChoice::Auto,
        Some(Value::String(s)) => match s.as_str() {
            "none" => ToolChoice::None,
            "auto" => ToolChoice::Auto,
            "required" => ToolChoice::Required,
            other => {
                return Err(ApiError::invalid(
                    "tool_choice",
                    format!("Invalid value: '{other}'. Supported values are: 'none', 'auto' and 'required', or {{\"type\": \"function\", \"function\": {{\"name\": \"{other}\"}}}} to call one function."),
                ))
            }
        },
        Some(Value::Object(o)) => {
            let name = o
                .get("function")
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str)
                .filter(|_| o.get("type").and_then(Value::as_str) == Some("function"))
                .ok_or_else(|| {
                    ApiError::invalid(
                        "tool_choice",
                        "Invalid 'tool_choice': expected {\"type\": \"function\", \"function\": {\"name\": ...}}.",
                    )
                })?;
            ToolChoice::Named(name.to_string())
        }
        Some(v) => return Err(ApiError::wrong_type("tool_choice", "a string or an object", v)),
    };
    check_choice(&choice, tools, "tool_choice")?;
    let parallel = match obj.get("parallel_tool_calls") {
        None | Some(Value::Null) => true,
        Some(Value::Bool(b)) => *b,
        Some(v) => return Err(ApiError::wrong_type("parallel_tool_calls", "a boolean", v)),
    };
    Ok((choice, parallel))
}

fn check_choice(choice: &ToolChoice, tools: &[Value], param: &str) -> Result<(), ApiError> {
    match choice {
        ToolChoice::Required if tools.is_empty() => Err(needs_tools(param)),
        ToolChoice::Named(n) if !tools.iter().any(|t| tool_name(t) == Some(n.as_str())) => {
            Err(absent_tool(param, n))
        }
        _ => Ok(()),
    }
}

/// Anthropic `tool_choice` (`{"type": "auto" | "any" | "tool" | "none", "name",
/// "disable_parallel_tool_use"}`) for `tools`.
pub fn anthropic_choice(
    obj: &Map<String, Value>,
    tools: &[Value],
) -> Result<(ToolChoice, bool), ApiError> {
    let Some(v) = obj.get("tool_choice").filter(|v| !v.is_null()) else {
        return Ok((ToolChoice::Auto, true));
    };
    let Some(o) = v.as_object() else {
        return Err(ApiError::wrong_type("tool_choice", "an object", v));
    };
    let choice = match o.get("type").and_then(Value::as_str) {
        Some("auto") => ToolChoice::Auto,
        Some("none") => ToolChoice::None,
        Some("any") => ToolChoice::Required,
        Some("tool") => match o.get("name").and_then(Value::as_str) {
            Some(n) => ToolChoice::Named(n.to_string()),
            None => {
                return Err(ApiError::invalid(
                    "tool_choice.name",
                    "tool_choice.name: Field required",
                ))
            }
        },
        _ => {
            return Err(ApiError::invalid(
                "tool_choice.type",
                "tool_choice.type: Input tag does not match any of the expected tags: 'auto', 'any', 'tool', 'none'",
            ))
        }
    };
    check_choice(&choice, tools, "tool_choice")?;
    let parallel = match o.get("disable_parallel_tool_use") {
        None | Some(Value::Null) => true,
        Some(Value::Bool(b)) => !b,
        Some(v) => {
            return Err(ApiError::wrong_type(
                "tool_choice.disable_parallel_tool_use",
                "a boolean",
                v,
            ))
        }
    };
    Ok((choice, parallel))
}

/// OpenAI `response_format`: None for text, else the schema the reply must follow.
pub fn response_format(obj: &Map<String, Value>) -> Result<Option<Value>, ApiError> {
    let Some(v) = obj.get("response_format").filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    let Some(o) = v.as_object() else {
        return Err(ApiError::wrong_type("response_format", "an object", v));
    };
    match o.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(json!({"type": "object"}))),
        Some("json_schema") => {
            let js = o.get("json_schema").and_then(Value::as_object).ok_or_else(|| {
                ApiError::invalid(
                    "response_format.json_schema",
                    "Missing required parameter: 'response_format.json_schema'.",
                )
            })?;
            match js.get("name") {
                Some(Value::String(n)) => check_name(n, "response_format.json_schema.name")?,
                Some(v) => {
                    return Err(ApiError::wrong_type(
                        "response_format.json_schema.name",
                        "a string",
                        v,
                    ))
                }
                None => {
                    return Err(ApiError::invalid(
                        "response_format.json_schema.name",
                        "Missing required parameter: 'response_format.json_schema.name'.",
                    ))
                }
            }
            match js.get("schema") {
                None | Some(Value::Null) => Ok(Some(json!({}))),
                Some(Value::Object(s)) => Ok(Some(Value::Object(s.clone()))),
                Some(v) => Err(ApiError::wrong_type(
                    "response_format.json_schema.schema",
                    "a JSON Schema object",
                    v,
                )),
            }
        }
        Some(other) => Err(ApiError::invalid(
            "response_format.type",
            format!("Invalid value: '{other}'. Supported values are: 'text', 'json_object' and 'json_schema'."),
        )),
        None => Err(ApiError::invalid(
            "response_format.type",
            "Missing required parameter: 'response_format.type'.",
        )),
    }
}

/// An assistant message's OpenAI `tool_calls` as the chat template reads them (arguments a
/// JSON object, as vLLM hands them to templates), with their ids.
pub fn openai_tool_calls(v: &Value, param: &str) -> Result<Vec<Value>, ApiError> {
    let Some(list) = v.as_array() else {
        return Err(ApiError::wrong_type(param, "an array", v));
    };
    let mut out = Vec::with_capacity(list.len());
    for (j, c) in list.iter().enumerate() {
        let p = format!("{param}[{j}]");
        let id = c.get("id").and_then(Value::as_str).ok_or_else(|| {
            ApiError::invalid(
                &format!("{p}.id"),
                format!("Missing required parameter: '{p}.id'."),
            )
        })?;
        let f = c
            .get("function")
            .and_then(Value::as_object)
            .ok_or_else(|| {
                ApiError::invalid(
                    &format!("{p}.function"),
                    format!("Missing required parameter: '{p}.function'."),
                )
            })?;
        let name = f.get("name").and_then(Value::as_str).ok_or_else(|| {
            ApiError::invalid(
                &format!("{p}.function.name"),
                format!("Missing required parameter: '{p}.function.name'."),
            )
        })?;
        let args = match f.get("arguments") {
            Some(Value::String(s)) => serde_json::from_str::<Value>(s)
                .ok()
                .filter(Value::is_object)
                .ok_or_else(|| {
                    ApiError::invalid(
                        &format!("{p}.function.arguments"),
                        format!("Invalid '{p}.function.arguments': not a JSON object."),
                    )
                })?,
            Some(Value::Object(o)) => Value::Object(o.clone()),
            None | Some(Value::Null) => json!({}),
            Some(v) => {
                return Err(ApiError::wrong_type(
                    &format!("{p}.function.arguments"),
                    "a string of JSON",
                    v,
                ))
            }
        };
        out.push(template_call(id, name, args));
    }
    Ok(out)
}

/// One call as chat templates read it.
pub fn template_call(id: &str, name: &str, arguments: Value) -> Value {
    json!({"id": id, "type": "function", "function": {"name": name, "arguments": arguments}})
}

/// The id of call `k` of choice `choice` of a response `resp_id` (OpenAI `call_...`,
/// Anthropic `toolu_...`).
pub fn call_id(prefix: &str, resp_id: &str, choice: usize, k: usize) -> String {
    let tail = resp_id.rsplit(['-', '_']).next().unwrap_or(resp_id);
    format!("{prefix}{tail}{choice:02x}{k:02x}")
}
