//! HF chat templates rendered with minijinja, configured to behave like
//! transformers: trim_blocks + lstrip_blocks, loop controls, `raise_exception`,
//! `strftime_now`, a non-escaping `tojson`, python-style string/dict methods.
//!
//! Message `content` may be a string or a list of OpenAI content parts. Templates
//! that handle such lists themselves get them unchanged; for the others (found by
//! rendering a probe message once) the text parts are joined with newlines.

use crate::EngineError;
use minijinja::syntax::SyntaxConfig;
use minijinja::value::{Kwargs, Serde, Value as JValue, ValueKind};
use minijinja::{Environment, Error, ErrorKind};
use serde_json::Value;

const NAME: &str = "chat";

pub struct ChatTemplate {
    env: Environment<'static>,
    bos_token: Option<String>,
    eos_token: Option<String>,
    /// The template renders list-of-parts `content` itself.
    typed_content: bool,
}

impl ChatTemplate {
    /// Compiles `source`. `bos_token`/`eos_token` are exposed to the template.
    pub fn new(source: &str, bos_token: Option<&str>, eos_token: Option<&str>) -> Result<Self, EngineError> {
        let mut env = Environment::new();
        let syntax = SyntaxConfig::builder().trim_blocks(true).lstrip_blocks(true).build().map_err(template_err)?;
        env.set_syntax(syntax);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_filter("tojson", tojson);
        env.add_template_owned(NAME, strip_generation_tags(source)).map_err(template_err)?;
        let mut tmpl = ChatTemplate {
            env,
            bos_token: bos_token.map(str::to_string),
            eos_token: eos_token.map(str::to_string),
            typed_content: false,
        };
        tmpl.typed_content = tmpl.probe_typed_content();
        Ok(tmpl)
    }

    /// Renders `messages` (OpenAI-style `[{"role", "content", ...}]`). `tools` is the
    /// OpenAI tools array if any; `extra` (an object) adds template variables such
    /// as `enable_thinking`.
    pub fn render(
        &self,
        messages: &Value,
        tools: Option<&Value>,
        add_generation_prompt: bool,
        extra: Option<&Value>,
    ) -> Result<String, EngineError> {
        if !messages.is_array() {
            return Err(EngineError::Template("messages must be an array".into()));
        }
        if let Some(extra) = extra {
            if !extra.is_object() {
                return Err(EngineError::Template("extra template variables must be an object".into()));
            }
        }
        let flattened;
        let messages = if self.typed_content {
            messages
        } else {
            flattened = flatten_content(messages);
            &flattened
        };
        self.render_raw(messages, tools, add_generation_prompt, extra)
    }

    /// Whether the template reads list-form `content` itself (e.g. for images).
    pub fn handles_content_parts(&self) -> bool {
        self.typed_content
    }

    fn render_raw(
        &self,
        messages: &Value,
        tools: Option<&Value>,
        add_generation_prompt: bool,
        extra: Option<&Value>,
    ) -> Result<String, EngineError> {
        let mut ctx = serde_json::Map::new();
        if let Some(Value::Object(extra)) = extra {
            ctx.extend(extra.iter().map(|(k, v)| (k.clone(), v.clone())));
        }
        ctx.insert("messages".into(), messages.clone());
        if let Some(tools) = tools {
            ctx.insert("tools".into(), tools.clone());
        }
        ctx.insert("add_generation_prompt".into(), Value::Bool(add_generation_prompt));
        if let Some(bos) = &self.bos_token {
            ctx.insert("bos_token".into(), Value::String(bos.clone()));
        }
        if let Some(eos) = &self.eos_token {
            ctx.insert("eos_token".into(), Value::String(eos.clone()));
        }
        let tmpl = self.env.get_template(NAME).map_err(template_err)?;
        tmpl.render(JValue::from(Serde(&Value::Object(ctx)))).map_err(template_err)
    }

    /// Renders a user message made of one text part and checks that its text, and
    /// not a dump of the list, reached the output.
    fn probe_typed_content(&self) -> bool {
        const PROBE: &str = "PROBE-7d1c4e2a";
        let messages = serde_json::json!([{"role": "user", "content": [{"type": "text", "text": PROBE}]}]);
        match self.render_raw(&messages, None, true, None) {
            Ok(out) => out.contains(PROBE) && !out.contains("\"text\"") && !out.contains("'text'"),
            Err(_) => false,
        }
    }
}

/// Joins the text parts of list-form `content` with newlines (other parts, such
/// as images, are dropped).
fn flatten_content(messages: &Value) -> Value {
    let mut messages = messages.clone();
    for msg in messages.as_array_mut().into_iter().flatten() {
        if let Some(Value::Array(parts)) = msg.get("content") {
            let texts: Vec<&str> = parts
                .iter()
                .filter_map(|p| match p {
                    Value::String(s) => Some(s.as_str()),
                    Value::Object(o) if o.get("type").and_then(Value::as_str).unwrap_or("text") == "text" => {
                        o.get("text").and_then(Value::as_str)
                    }
                    _ => None,
                })
                .collect();
            msg["content"] = Value::String(texts.join("\n"));
        }
    }
    messages
}

/// Converts minijinja errors; `raise_exception` messages come through as they are.
fn template_err(e: Error) -> EngineError {
    let mut msg = match (e.kind(), e.detail()) {
        (ErrorKind::InvalidOperation, Some(detail)) => detail.to_string(),
        _ => e.to_string(),
    };
    if let (Some(line), ErrorKind::InvalidOperation) = (e.line(), e.kind()) {
        msg.push_str(&format!(" (template line {line})"));
    }
    EngineError::Template(msg)
}

/// Removes transformers' `{% generation %}` / `{% endgeneration %}` markers, which
/// only tag assistant text for training masks.
fn strip_generation_tags(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(start) = rest.find("{%") {
        // The closing `%}` after the opening `{%` (in `{%}` they overlap: not a tag end).
        let Some(len) = rest[start + 2..].find("%}") else { break };
        let tag = &rest[start + 2..start + 2 + len];
        let word = tag.trim_matches(|c: char| c == '-' || c == '+' || c.is_whitespace());
        out.push_str(&rest[..start]);
        let end = start + 2 + len + 2;
        if word != "generation" && word != "endgeneration" {
            out.push_str(&rest[start..end]);
        }
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
}

fn raise_exception(msg: String) -> Result<JValue, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, msg))
}

fn strftime_now(fmt: String) -> Result<String, Error> {
    use chrono::format::{Item, StrftimeItems};
    if StrftimeItems::new(&fmt).any(|item| matches!(item, Item::Error)) {
        return Err(Error::new(ErrorKind::InvalidOperation, format!("strftime_now: bad format {fmt:?}")));
    }
    Ok(chrono::Local::now().format(&fmt).to_string())
}

/// Python's `json.dumps` options as transformers' `tojson` passes them.
struct JsonStyle {
    ensure_ascii: bool,
    indent: Option<String>,
    item_sep: String,
    key_sep: String,
    sort_keys: bool,
}

/// transformers' `tojson(x, ensure_ascii=False, indent=None, separators=None,
/// sort_keys=False)`: `json.dumps` with those options, no HTML escaping.
fn tojson(
    value: &JValue,
    ensure_ascii: Option<JValue>,
    indent: Option<JValue>,
    separators: Option<JValue>,
    kwargs: Kwargs,
) -> Result<JValue, Error> {
    let pick = |pos: Option<JValue>, name: &str| -> Result<Option<JValue>, Error> {
        match pos {
            Some(v) => Ok(Some(v)),
            None => kwargs.get::<Option<JValue>>(name),
        }
    };
    let ensure_ascii = pick(ensure_ascii, "ensure_ascii")?.is_some_and(|v| v.is_true());
    let indent = match pick(indent, "indent")? {
        None => None,
        Some(v) if v.is_none() || v.is_undefined() => None,
        Some(v) => match v.as_str() {
            Some(s) => Some(s.to_string()),
            None => {
                let n = i64::try_from(v).map_err(|_| bad_arg("indent must be an integer or a string"))?;
                Some(" ".repeat(n.max(0) as usize))
            }
        },
    };
    let (item_sep, key_sep) = match pick(separators, "separators")? {
        Some(v) if !v.is_none() && !v.is_undefined() => {
            let parts: Vec<String> =
                v.try_iter()?.map(|p| p.as_str().map(str::to_string)).collect::<Option<_>>().unwrap_or_default();
            match parts.as_slice() {
                [a, b] => (a.clone(), b.clone()),
                _ => return Err(bad_arg("separators must be a pair of strings")),
            }
        }
        _ => ((if indent.is_some() { "," } else { ", " }).to_string(), ": ".to_string()),
    };
    let sort_keys = kwargs.get::<Option<bool>>("sort_keys")?.unwrap_or(false);
    kwargs.assert_all_used()?;
    let style = JsonStyle { ensure_ascii, indent, item_sep, key_sep, sort_keys };
    let mut out = String::new();
    write_json(value, &style, 0, &mut out)?;
    Ok(JValue::from_safe_string(out))
}

fn bad_arg(msg: &str) -> Error {
    Error::new(ErrorKind::InvalidOperation, format!("tojson: {msg}"))
}

fn write_json(v: &JValue, style: &JsonStyle, level: usize, out: &mut String) -> Result<(), Error> {
    match v.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
        ValueKind::Number if v.is_integer() => out.push_str(&v.to_string()),
        ValueKind::Number => out.push_str(&python_float(f64::try_from(v.clone())?)),
        ValueKind::String => write_json_str(v.as_str().unwrap_or_default(), style.ensure_ascii, out),
        ValueKind::Bytes => {
            write_json_str(&String::from_utf8_lossy(v.as_bytes().unwrap_or_default()), style.ensure_ascii, out)
        }
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<JValue> = v.try_iter()?.collect();
            write_container(out, style, level, '[', ']', &items, |item, out| write_json(item, style, level + 1, out))?;
        }
        ValueKind::Map => {
            let mut entries: Vec<(String, JValue)> = Vec::new();
            for key in v.try_iter()? {
                let value = v.get_item(&key)?;
                entries.push((json_key(&key)?, value));
            }
            if style.sort_keys {
                entries.sort_by(|a, b| a.0.cmp(&b.0));
            }
            write_container(out, style, level, '{', '}', &entries, |(key, value), out| {
                write_json_str(key, style.ensure_ascii, out);
                out.push_str(&style.key_sep);
                write_json(value, style, level + 1, out)
            })?;
        }
        _ => write_json_str(&v.to_string(), style.ensure_ascii, out),
    }
    Ok(())
}

fn write_container<T>(
    out: &mut String,
    style: &JsonStyle,
    level: usize,
    open: char,
    close: char,
    items: &[T],
    mut write_item: impl FnMut(&T, &mut String) -> Result<(), Error>,
) -> Result<(), Error> {
    out.push(open);
    if items.is_empty() {
        out.push(close);
        return Ok(());
    }
    let newline = |out: &mut String, depth: usize| {
        if let Some(indent) = &style.indent {
            out.push('\n');
            for _ in 0..depth {
                out.push_str(indent);
            }
        }
    };
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            out.push_str(&style.item_sep);
        }
        newline(out, level + 1);
        write_item(item, out)?;
    }
    newline(out, level);
    out.push(close);
    Ok(())
}

/// Dict keys as Python's json module writes them (it converts scalars to strings).
fn json_key(key: &JValue) -> Result<String, Error> {
    Ok(match key.kind() {
        ValueKind::String => key.as_str().unwrap_or_default().to_string(),
        ValueKind::Bool => (if key.is_true() { "true" } else { "false" }).to_string(),
        ValueKind::None | ValueKind::Undefined => "null".to_string(),
        ValueKind::Number if key.is_integer() => key.to_string(),
        ValueKind::Number => python_float(f64::try_from(key.clone())?),
        _ => return Err(bad_arg("keys must be str, int, float, bool or None")),
    })
}

fn write_json_str(s: &str, ensure_ascii: bool, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 || (ensure_ascii && (c as u32) >= 0x7F) => {
                let mut buf = [0u16; 2];
                for unit in c.encode_utf16(&mut buf) {
                    out.push_str(&format!("\\u{unit:04x}"));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// `repr(float)` as Python prints it: the shortest round-trip digits, positional
/// for exponents -4..16, else scientific with a signed two-digit exponent.
pub(crate) fn python_float(x: f64) -> String {
    if x.is_nan() {
        return "NaN".into();
    }
    if x.is_infinite() {
        return if x > 0.0 { "Infinity".into() } else { "-Infinity".into() };
    }
    if x == 0.0 {
        return if x.is_sign_negative() { "-0.0".into() } else { "0.0".into() };
    }
    let sci = format!("{:e}", x.abs());
    let (mantissa, exp) = sci.split_once('e').expect("LowerExp has an exponent");
    let exp: i32 = exp.parse().expect("integer exponent");
    let digits: String = mantissa.chars().filter(|c| c.is_ascii_digit()).collect();
    let sign = if x < 0.0 { "-" } else { "" };
    if (-4..16).contains(&exp) {
        let point = exp + 1;
        let body = if point <= 0 {
            format!("0.{}{digits}", "0".repeat((-point) as usize))
        } else if (point as usize) >= digits.len() {
            format!("{digits}{}.0", "0".repeat(point as usize - digits.len()))
        } else {
            format!("{}.{}", &digits[..point as usize], &digits[point as usize..])
        };
        format!("{sign}{body}")
    } else {
        let (first, rest) = digits.split_at(1);
        let frac = if rest.is_empty() { String::new() } else { format!(".{rest}") };
        let esign = if exp < 0 { '-' } else { '+' };
        format!("{sign}{first}{frac}e{esign}{:02}", exp.abs())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlapping_tag_marks_are_not_a_tag_end() {
        // Found by the chat_template fuzz target: `{%}` used to panic.
        assert_eq!(strip_generation_tags("a{%}b"), "a{%}b");
        assert_eq!(strip_generation_tags("x{% generation %}y{%- endgeneration -%}z"), "xyz");
        let crash = std::fs::read(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../fuzz/corpus/chat_template/crash-e7c288a597f8484346ab9d4eef134d70f70c8876"
        ))
        .unwrap();
        let _ = strip_generation_tags(&String::from_utf8_lossy(&crash));
    }

    #[test]
    fn floats_print_like_python() {
        let cases = [
            (1.0, "1.0"),
            (0.5, "0.5"),
            (-2.25, "-2.25"),
            (1e16, "1e+16"),
            (1e15, "1000000000000000.0"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (1.5e-7, "1.5e-07"),
            (1e100, "1e+100"),
            (123456.789, "123456.789"),
            (0.1 + 0.2, "0.30000000000000004"),
            (-0.0, "-0.0"),
        ];
        for (x, want) in cases {
            assert_eq!(python_float(x), want, "{x}");
        }
    }

    #[test]
    fn generation_tags_are_removed() {
        let src = "a{% generation %}b{%- endgeneration -%}c{% if x %}d{% endif %}";
        assert_eq!(strip_generation_tags(src), "abc{% if x %}d{% endif %}");
    }
}
