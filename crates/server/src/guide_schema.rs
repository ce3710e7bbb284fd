//! JSON Schema compiled to the small graph the guide walks. Supported: `type`
//! (one or a list), `properties`/`required`/`additionalProperties`, `items`,
//! `minItems`/`maxItems`, `minLength`/`maxLength`, `enum`, `const`, `anyOf`,
//! `oneOf`, `allOf` (first member), local `$ref` (`#/$defs/..`,
//! `#/definitions/..`, `#`). Unknown keywords (`format`, `pattern`, `minimum`…)
//! are ignored: the output still has the right shape and types.
//!
//! An object with listed `properties` is closed (only those keys), which keeps a
//! small model on the schema's keys; `additionalProperties` only opens objects
//! that list none.

use serde_json::Value;
use std::collections::HashMap;
use std::sync::Arc;

pub type NodeId = usize;

#[derive(Debug, Clone)]
pub enum Node {
    Object {
        /// `(key, value node)`, keys pre-quoted as the guide matches them: `"name"`.
        props: Vec<(Arc<[u8]>, NodeId)>,
        required: u64,
        /// Node for keys not in `props` (free-form string keys); `None` = closed.
        additional: Option<NodeId>,
    },
    Array {
        items: NodeId,
        min: usize,
        max: Option<usize>,
    },
    String {
        min: usize,
        max: Option<usize>,
    },
    Number {
        integer: bool,
    },
    /// Exact JSON texts (`true`, `null`, enum values serialized).
    Literals(Vec<Arc<[u8]>>),
    AnyOf(Vec<NodeId>),
    /// Tool-call markup: one of these exact texts, no whitespace before it.
    Markup(Vec<Arc<[u8]>>),
    /// Items in order; `true` = optional.
    Seq(Vec<(NodeId, bool)>),
    /// Raw text (an XML parameter value) of `min..=max` characters, ended by
    /// `term` (consumed with it), which it cannot contain.
    Raw {
        min: usize,
        max: Option<usize>,
        term: Arc<[u8]>,
    },
}

/// One way a forced call can be written (a tool, in one family's markup).
pub struct CallAlt<'a> {
    pub head: String,
    pub args: CallArgs<'a>,
    pub tail: String,
}

pub enum CallArgs<'a> {
    /// The arguments as a JSON object of this schema.
    Json(&'a Value),
    /// XML parameters in order: `open`, the value, `close`, `after`.
    Xml(Vec<XmlParam<'a>>),
}

pub struct XmlParam<'a> {
    pub open: String,
    pub schema: &'a Value,
    pub close: String,
    pub after: String,
    pub required: bool,
}

/// Most properties an object node tracks (a bit each in `required`/`seen`).
pub const MAX_PROPS: usize = 64;

/// Longest shortest-valid-text a schema may have. The guide writes that text
/// when the token budget runs out, so a schema needing more than any output
/// could hold (`"minLength": 100000000000`, or nested `minItems` multiplying)
/// is refused when it compiles, instead of allocating it then.
pub const MAX_MIN_TEXT: usize = 1 << 20;

#[derive(Debug)]
pub struct Schema {
    pub nodes: Vec<Node>,
    pub root: NodeId,
    /// Texts no JSON string may contain: the tool format's end markers, which
    /// its parser would read as the end of the call (`ToolFormat::string_stops`).
    /// JSON can still say them (`\u003c|call|>`), so no value is lost.
    pub stops: Vec<Vec<u8>>,
}

#[derive(Debug, thiserror::Error)]
#[error("unsupported JSON schema: {0}")]
pub struct SchemaError(pub String);

impl Schema {
    /// Compiles `schema`; `true`/`{}` mean any JSON value.
    pub fn compile(schema: &Value) -> Result<Schema, SchemaError> {
        let mut c = Compiler { root: schema, nodes: Vec::new(), refs: HashMap::new(), any: None, depth: 0 };
        let root = c.node(schema)?;
        Schema { nodes: c.nodes, root, stops: Vec::new() }.bounded()
    }

    /// `self`, unless the shortest valid text of one of its nodes (what
    /// [`Schema::min_text`] builds when the output must close there) exceeds
    /// [`MAX_MIN_TEXT`]. Every node counts, not only the root: an `anyOf`
    /// branch or an optional property the output may enter is closed by its
    /// own shortest text.
    fn bounded(self) -> Result<Schema, SchemaError> {
        // `min_text` stops at depth 12 with "null" (4 bytes): after k rounds
        // from 4 everywhere, `len[n]` is `min_text(n, 13 - k).len()`, so 13
        // rounds give every node's length at depth 0 (and round 12 at depth 1)
        // in 13 passes over the nodes, with no recursion to blow up on
        // recursive `$ref`s.
        let mut len = vec![4usize; self.nodes.len()];
        let mut worst = 0usize;
        for round in 1..=13 {
            len = (0..self.nodes.len()).map(|n| self.min_len_over(n, &len)).collect();
            if round >= 12 {
                worst = worst.max(len.iter().copied().max().unwrap_or(0));
            }
        }
        if worst > MAX_MIN_TEXT {
            let n = if worst == usize::MAX { "2^64 or more".to_string() } else { worst.to_string() };
            return Err(SchemaError(format!(
                "its shortest valid JSON is {n} bytes, more than the {MAX_MIN_TEXT} any output may hold \
                 (check minLength/minItems)"
            )));
        }
        Ok(self)
    }

    /// The length of `node`'s shortest text given its children's (`child`),
    /// saturating: one level of [`Schema::min_text`] without building it.
    pub(crate) fn min_len_over(&self, node: NodeId, child: &[usize]) -> usize {
        match &self.nodes[node] {
            Node::Object { props, required, .. } => {
                let mut n = 2usize;
                let mut first = true;
                for (i, (key, value)) in props.iter().enumerate() {
                    if required & (1 << i) != 0 {
                        let sep = if first { 0 } else { 2 };
                        first = false;
                        n = n.saturating_add(sep + key.len() + 2).saturating_add(child[*value]);
                    }
                }
                n
            }
            Node::Array { items, min, .. } => {
                let seps = if *min > 0 { 2 } else { 0 };
                child[*items].saturating_add(2).saturating_mul(*min).saturating_sub(seps).saturating_add(2)
            }
            Node::String { min, .. } => min.saturating_add(2),
            Node::Number { .. } => 1,
            Node::Literals(alts) | Node::Markup(alts) => alts.iter().map(|a| a.len()).min().unwrap_or(0),
            Node::AnyOf(alts) => alts.iter().map(|&a| child[a]).min().unwrap_or(0),
            Node::Seq(items) => {
                items.iter().filter(|(_, optional)| !optional).fold(0usize, |n, &(id, _)| n.saturating_add(child[id]))
            }
            Node::Raw { min, term, .. } => min.saturating_add(term.len()),
        }
    }

    /// The grammar of one forced call: any of `alts`.
    pub fn calls(alts: &[CallAlt]) -> Result<Schema, SchemaError> {
        let null = Value::Null;
        let mut c = Compiler { root: &null, nodes: Vec::new(), refs: HashMap::new(), any: None, depth: 0 };
        let mut ids = Vec::new();
        for alt in alts {
            let mut items = Vec::new();
            if !alt.head.is_empty() {
                items.push((c.markup(&[alt.head.as_str()]), false));
            }
            match &alt.args {
                CallArgs::Json(schema) => {
                    // `$ref`s point into the tool's own schema.
                    c.root = schema;
                    c.refs.clear();
                    items.push((c.node(schema)?, false));
                }
                CallArgs::Xml(params) => {
                    for p in params {
                        c.root = p.schema;
                        c.refs.clear();
                        let value = c.xml_value(p.schema, &p.close)?;
                        let open = c.markup(&[p.open.as_str()]);
                        let mut seq = vec![(open, false), (value, false)];
                        if !p.after.is_empty() {
                            seq.push((c.markup(&[p.after.as_str()]), false));
                        }
                        let id = c.push(Node::Seq(seq));
                        items.push((id, !p.required));
                    }
                }
            }
            if !alt.tail.is_empty() {
                items.push((c.markup(&[alt.tail.as_str()]), false));
            }
            ids.push(c.push(Node::Seq(items)));
        }
        let root = if ids.len() == 1 { ids[0] } else { c.push(Node::AnyOf(ids)) };
        Schema { nodes: c.nodes, root, stops: Vec::new() }.bounded()
    }

    /// `self`, with strings kept from containing any of `stops` (each at most
    /// 255 bytes; see [`Schema::stops`]).
    pub fn with_stops(mut self, stops: &[&str]) -> Schema {
        self.stops = stops.iter().filter(|s| !s.is_empty() && s.len() < 256).map(|s| s.as_bytes().to_vec()).collect();
        self
    }

    /// Whether a value of `node` may have whitespace before it (JSON does, markup not).
    pub fn skips_ws(&self, node: NodeId, depth: usize) -> bool {
        match &self.nodes[node] {
            Node::Markup(_) | Node::Seq(_) | Node::Raw { .. } => false,
            Node::AnyOf(alts) if depth < 8 => alts.iter().all(|&a| self.skips_ws(a, depth + 1)),
            _ => true,
        }
    }

    /// Any JSON object (`response_format: json_object`).
    pub fn any_object() -> Schema {
        Schema::compile(&serde_json::json!({"type": "object"})).expect("static schema")
    }

    /// The shortest JSON text `node` accepts (used to close the output when the
    /// token budget runs out). `depth` stops recursive schemas.
    pub fn min_text(&self, node: NodeId, depth: usize) -> Vec<u8> {
        if depth > 12 {
            return b"null".to_vec();
        }
        match &self.nodes[node] {
            Node::Object { props, required, .. } => {
                let mut out = b"{".to_vec();
                let mut first = true;
                for (i, (key, value)) in props.iter().enumerate() {
                    if required & (1 << i) != 0 {
                        if !first {
                            out.extend_from_slice(b", ");
                        }
                        first = false;
                        out.extend_from_slice(key);
                        out.extend_from_slice(b": ");
                        out.extend(self.min_text(*value, depth + 1));
                    }
                }
                out.push(b'}');
                out
            }
            Node::Array { items, min, .. } => {
                let item = self.min_text(*items, depth + 1);
                let mut out = b"[".to_vec();
                for i in 0..*min {
                    if i > 0 {
                        out.extend_from_slice(b", ");
                    }
                    out.extend_from_slice(&item);
                }
                out.push(b']');
                out
            }
            Node::String { min, .. } => {
                let mut out = b"\"".to_vec();
                out.extend(std::iter::repeat_n(b'a', *min));
                out.push(b'"');
                out
            }
            Node::Number { .. } => b"0".to_vec(),
            Node::Literals(alts) => alts.iter().min_by_key(|a| a.len()).map(|a| a.to_vec()).unwrap_or_default(),
            Node::AnyOf(alts) => alts_min(self, alts, depth),
            Node::Markup(alts) => alts.iter().min_by_key(|a| a.len()).map(|a| a.to_vec()).unwrap_or_default(),
            Node::Seq(items) => self.seq_min_text(items, 0, depth),
            Node::Raw { min, term, .. } => {
                let mut out = vec![b'a'; *min];
                out.extend_from_slice(term);
                out
            }
        }
    }
}

fn alts_min(s: &Schema, alts: &[NodeId], depth: usize) -> Vec<u8> {
    alts.iter().map(|&a| s.min_text(a, depth + 1)).min_by_key(|t| t.len()).unwrap_or_default()
}

impl Schema {
    /// The shortest text of a sequence's items from `from` on (optional ones skipped).
    pub fn seq_min_text(&self, items: &[(NodeId, bool)], from: usize, depth: usize) -> Vec<u8> {
        let mut out = Vec::new();
        for &(id, optional) in items.iter().skip(from) {
            if !optional {
                out.extend(self.min_text(id, depth + 1));
            }
        }
        out
    }
}

struct Compiler<'a> {
    root: &'a Value,
    nodes: Vec<Node>,
    /// `$ref` target → node, filled before the target compiles (recursion).
    refs: HashMap<String, NodeId>,
    any: Option<NodeId>,
    depth: usize,
}

impl Compiler<'_> {
    fn push(&mut self, n: Node) -> NodeId {
        self.nodes.push(n);
        self.nodes.len() - 1
    }

    fn markup(&mut self, texts: &[&str]) -> NodeId {
        self.push(Node::Markup(texts.iter().map(|t| Arc::from(t.as_bytes())).collect()))
    }

    /// An XML parameter's value and its close: raw text for plain strings, the
    /// raw enum texts for string enums, JSON for anything else.
    fn xml_value(&mut self, schema: &Value, close: &str) -> Result<NodeId, SchemaError> {
        let usize_of = |k: &str| schema.get(k).and_then(Value::as_u64).map(|v| v as usize);
        let enum_strings: Option<Vec<&str>> = schema
            .get("enum")
            .and_then(Value::as_array)
            .and_then(|e| e.iter().map(Value::as_str).collect::<Option<Vec<&str>>>())
            .filter(|e| !e.is_empty());
        if let Some(values) = enum_strings {
            let v = self.markup(&values);
            let c = self.markup(&[close]);
            return Ok(self.push(Node::Seq(vec![(v, false), (c, false)])));
        }
        if schema.get("type").and_then(Value::as_str) == Some("string") {
            return Ok(self.push(Node::Raw {
                min: usize_of("minLength").unwrap_or(0),
                max: usize_of("maxLength"),
                term: Arc::from(close.as_bytes()),
            }));
        }
        let v = self.node(schema)?;
        let c = self.markup(&[close]);
        Ok(self.push(Node::Seq(vec![(v, false), (c, false)])))
    }

    /// Any JSON value: one shared node (objects and arrays of it refer back to it).
    fn any(&mut self) -> NodeId {
        if let Some(id) = self.any {
            return id;
        }
        let id = self.push(Node::AnyOf(Vec::new()));
        self.any = Some(id);
        let obj = self.push(Node::Object { props: Vec::new(), required: 0, additional: Some(id) });
        let arr = self.push(Node::Array { items: id, min: 0, max: None });
        let s = self.push(Node::String { min: 0, max: None });
        let n = self.push(Node::Number { integer: false });
        let lits = self.push(literals(&["true", "false", "null"]));
        self.nodes[id] = Node::AnyOf(vec![obj, arr, s, n, lits]);
        id
    }

    fn node(&mut self, s: &Value) -> Result<NodeId, SchemaError> {
        self.depth += 1;
        if self.depth > 64 {
            return Err(SchemaError("nested too deeply".into()));
        }
        let r = self.node_inner(s);
        self.depth -= 1;
        r
    }

    fn node_inner(&mut self, s: &Value) -> Result<NodeId, SchemaError> {
        let obj = match s {
            Value::Bool(true) => return Ok(self.any()),
            Value::Bool(false) => return Err(SchemaError("`false` accepts nothing".into())),
            Value::Object(o) => o,
            _ => return Err(SchemaError(format!("a schema must be an object, got {s}"))),
        };
        if let Some(r) = obj.get("$ref").and_then(Value::as_str) {
            return self.reference(r);
        }
        if let Some(c) = obj.get("const") {
            return Ok(self.push(literals(&[c.to_string().as_str()])));
        }
        if let Some(Value::Array(e)) = obj.get("enum") {
            if e.is_empty() {
                return Err(SchemaError("empty enum".into()));
            }
            let texts: Vec<String> = e.iter().map(Value::to_string).collect();
            let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
            return Ok(self.push(literals(&refs)));
        }
        for key in ["anyOf", "oneOf"] {
            if let Some(Value::Array(alts)) = obj.get(key) {
                let ids = alts.iter().map(|a| self.node(a)).collect::<Result<Vec<_>, _>>()?;
                return Ok(self.push(Node::AnyOf(ids)));
            }
        }
        if let Some(first) = obj.get("allOf").and_then(Value::as_array).and_then(|a| a.first()) {
            return self.node(first);
        }
        match obj.get("type") {
            Some(Value::String(t)) => self.typed(t, obj),
            Some(Value::Array(ts)) => {
                let mut ids = Vec::new();
                for t in ts {
                    let t = t.as_str().ok_or_else(|| SchemaError(format!("bad type {t}")))?;
                    ids.push(self.typed(t, obj)?);
                }
                Ok(self.push(Node::AnyOf(ids)))
            }
            None if obj.contains_key("properties") => self.typed("object", obj),
            None if obj.contains_key("items") => self.typed("array", obj),
            None => Ok(self.any()),
            Some(t) => Err(SchemaError(format!("bad type {t}"))),
        }
    }

    fn typed(&mut self, t: &str, obj: &serde_json::Map<String, Value>) -> Result<NodeId, SchemaError> {
        let usize_of = |k: &str| obj.get(k).and_then(Value::as_u64).map(|v| v as usize);
        Ok(match t {
            "object" => {
                let mut props = Vec::new();
                let mut required = 0u64;
                let req: Vec<&str> = obj
                    .get("required")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .filter_map(Value::as_str)
                    .collect();
                if let Some(Value::Object(p)) = obj.get("properties") {
                    for (i, (name, sub)) in p.iter().take(MAX_PROPS).enumerate() {
                        let id = self.node(sub)?;
                        props.push((quoted(name), id));
                        if req.contains(&name.as_str()) {
                            required |= 1 << i;
                        }
                    }
                }
                let additional = if !props.is_empty() {
                    None
                } else {
                    match obj.get("additionalProperties") {
                        Some(Value::Bool(false)) => None,
                        None | Some(Value::Bool(true)) => Some(self.any()),
                        Some(sub) => Some(self.node(sub)?),
                    }
                };
                self.push(Node::Object { props, required, additional })
            }
            "array" => {
                let items = match obj.get("items") {
                    Some(i) => self.node(i)?,
                    None => self.any(),
                };
                self.push(Node::Array { items, min: usize_of("minItems").unwrap_or(0), max: usize_of("maxItems") })
            }
            "string" => self.push(Node::String { min: usize_of("minLength").unwrap_or(0), max: usize_of("maxLength") }),
            "number" => self.push(Node::Number { integer: false }),
            "integer" => self.push(Node::Number { integer: true }),
            "boolean" => self.push(literals(&["true", "false"])),
            "null" => self.push(literals(&["null"])),
            other => return Err(SchemaError(format!("unknown type '{other}'"))),
        })
    }

    fn reference(&mut self, r: &str) -> Result<NodeId, SchemaError> {
        if let Some(&id) = self.refs.get(r) {
            return Ok(id);
        }
        let target = if r == "#" {
            self.root
        } else {
            let ptr = r.strip_prefix('#').ok_or_else(|| SchemaError(format!("only local $ref is supported: {r}")))?;
            self.root.pointer(ptr).ok_or_else(|| SchemaError(format!("$ref {r} points nowhere")))?
        };
        // Reserve the id first so a recursive reference finds it.
        let id = self.push(Node::AnyOf(Vec::new()));
        self.refs.insert(r.to_string(), id);
        let inner = self.node(target)?;
        self.nodes[id] = Node::AnyOf(vec![inner]);
        Ok(id)
    }
}

fn literals(texts: &[&str]) -> Node {
    Node::Literals(texts.iter().map(|t| Arc::from(t.as_bytes())).collect())
}

fn quoted(name: &str) -> Arc<[u8]> {
    Arc::from(Value::String(name.to_string()).to_string().as_bytes())
}
