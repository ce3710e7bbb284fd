//! GGUF v3 reader. See FORMATS.md §1(d) for the layout.
//!
//! [`GgufFile::open`] parses the header, every metadata key/value and every tensor
//! info, and bounds-checks everything against the file size before anything is
//! allocated: counts and lengths read from a corrupt file can never make us reserve
//! more memory than the file could hold. Tensor bytes stay in the memory map.
//! [`open_file`] turns a `GgufFile` into [`ModelFiles`] (config, tensors, tokenizer).

use crate::{FormatError, ModelFiles};
use kernels::DType;
use memmap2::Mmap;
use serde_json::Value;
use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use crate::gguf_load::hf_arch_name;

pub const GGUF_MAGIC: [u8; 4] = *b"GGUF";
pub const DEFAULT_ALIGNMENT: usize = 32;
/// GGML_MAX_DIMS.
pub const MAX_DIMS: usize = 4;
/// Nested arrays deeper than this are treated as corruption (and cannot blow the stack).
const MAX_ARRAY_DEPTH: usize = 8;

/// Opens a GGUF file: parses header, metadata and tensor infos, memory-maps the data.
pub fn open_file(path: &Path) -> Result<ModelFiles, FormatError> {
    crate::gguf_load::model_files(GgufFile::open(path)?)
}

/// The type tag of a metadata value (`gguf_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GgufValueType {
    U8,
    I8,
    U16,
    I16,
    U32,
    I32,
    F32,
    Bool,
    String,
    Array,
    U64,
    I64,
    F64,
}

impl GgufValueType {
    const ALL: [GgufValueType; 13] = [
        GgufValueType::U8,
        GgufValueType::I8,
        GgufValueType::U16,
        GgufValueType::I16,
        GgufValueType::U32,
        GgufValueType::I32,
        GgufValueType::F32,
        GgufValueType::Bool,
        GgufValueType::String,
        GgufValueType::Array,
        GgufValueType::U64,
        GgufValueType::I64,
        GgufValueType::F64,
    ];

    pub fn from_id(id: u32) -> Option<Self> {
        Self::ALL.get(id as usize).copied()
    }

    pub fn id(self) -> u32 {
        Self::ALL.iter().position(|t| *t == self).unwrap_or(0) as u32
    }

    /// The fewest bytes one value of this type occupies in a file.
    fn min_size(self) -> usize {
        match self {
            GgufValueType::U8 | GgufValueType::I8 | GgufValueType::Bool => 1,
            GgufValueType::U16 | GgufValueType::I16 => 2,
            GgufValueType::U32 | GgufValueType::I32 | GgufValueType::F32 => 4,
            GgufValueType::U64 | GgufValueType::I64 | GgufValueType::F64 | GgufValueType::String => 8,
            GgufValueType::Array => 12,
        }
    }
}

/// One metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum GgufValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    /// Element type and elements (kept so empty arrays round-trip).
    Array(GgufValueType, Vec<GgufValue>),
    U64(u64),
    I64(i64),
    F64(f64),
}

impl GgufValue {
    pub fn value_type(&self) -> GgufValueType {
        match self {
            GgufValue::U8(_) => GgufValueType::U8,
            GgufValue::I8(_) => GgufValueType::I8,
            GgufValue::U16(_) => GgufValueType::U16,
            GgufValue::I16(_) => GgufValueType::I16,
            GgufValue::U32(_) => GgufValueType::U32,
            GgufValue::I32(_) => GgufValueType::I32,
            GgufValue::F32(_) => GgufValueType::F32,
            GgufValue::Bool(_) => GgufValueType::Bool,
            GgufValue::String(_) => GgufValueType::String,
            GgufValue::Array(..) => GgufValueType::Array,
            GgufValue::U64(_) => GgufValueType::U64,
            GgufValue::I64(_) => GgufValueType::I64,
            GgufValue::F64(_) => GgufValueType::F64,
        }
    }

    /// Any integer type holding a value that fits in `i64`.
    pub fn as_i64(&self) -> Option<i64> {
        Some(match *self {
            GgufValue::U8(v) => v.into(),
            GgufValue::I8(v) => v.into(),
            GgufValue::U16(v) => v.into(),
            GgufValue::I16(v) => v.into(),
            GgufValue::U32(v) => v.into(),
            GgufValue::I32(v) => v.into(),
            GgufValue::U64(v) => i64::try_from(v).ok()?,
            GgufValue::I64(v) => v,
            _ => return None,
        })
    }

    /// Any integer type holding a non-negative value.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            GgufValue::U64(v) => Some(v),
            _ => u64::try_from(self.as_i64()?).ok(),
        }
    }

    /// Like [`as_u64`](Self::as_u64), as `usize`.
    pub fn as_usize(&self) -> Option<usize> {
        usize::try_from(self.as_u64()?).ok()
    }

    /// Any numeric type (integers and floats).
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            GgufValue::F32(v) => Some(v.into()),
            GgufValue::F64(v) => Some(v),
            GgufValue::U64(v) => Some(v as f64),
            _ => self.as_i64().map(|v| v as f64),
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            GgufValue::Bool(b) => Some(b),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            GgufValue::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&[GgufValue]> {
        match self {
            GgufValue::Array(_, v) => Some(v),
            _ => None,
        }
    }

    /// A JSON view (non-finite floats become `null`).
    pub fn to_json(&self) -> Value {
        match self {
            GgufValue::F32(v) => serde_json::Number::from_f64((*v).into()).map_or(Value::Null, Value::Number),
            GgufValue::F64(v) => serde_json::Number::from_f64(*v).map_or(Value::Null, Value::Number),
            GgufValue::Bool(b) => Value::Bool(*b),
            GgufValue::String(s) => Value::String(s.clone()),
            GgufValue::Array(_, items) => Value::Array(items.iter().map(GgufValue::to_json).collect()),
            GgufValue::U64(v) => Value::from(*v),
            other => other.as_i64().map_or(Value::Null, Value::from),
        }
    }
}

/// Name and block geometry of a ggml tensor type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GgmlTypeInfo {
    pub name: &'static str,
    pub block_elems: usize,
    pub block_bytes: usize,
}

/// Every ggml type id still in use (ggml.h `ggml_type`, ggml.c `type_traits`).
pub fn ggml_type_info(id: u32) -> Option<GgmlTypeInfo> {
    let (name, block_elems, block_bytes) = match id {
        0 => ("F32", 1, 4),
        1 => ("F16", 1, 2),
        2 => ("Q4_0", 32, 18),
        3 => ("Q4_1", 32, 20),
        6 => ("Q5_0", 32, 22),
        7 => ("Q5_1", 32, 24),
        8 => ("Q8_0", 32, 34),
        9 => ("Q8_1", 32, 36),
        10 => ("Q2_K", 256, 84),
        11 => ("Q3_K", 256, 110),
        12 => ("Q4_K", 256, 144),
        13 => ("Q5_K", 256, 176),
        14 => ("Q6_K", 256, 210),
        15 => ("Q8_K", 256, 292),
        16 => ("IQ2_XXS", 256, 66),
        17 => ("IQ2_XS", 256, 74),
        18 => ("IQ3_XXS", 256, 98),
        19 => ("IQ1_S", 256, 50),
        20 => ("IQ4_NL", 32, 18),
        21 => ("IQ3_S", 256, 110),
        22 => ("IQ2_S", 256, 82),
        23 => ("IQ4_XS", 256, 136),
        24 => ("I8", 1, 1),
        25 => ("I16", 1, 2),
        26 => ("I32", 1, 4),
        27 => ("I64", 1, 8),
        28 => ("F64", 1, 8),
        29 => ("IQ1_M", 256, 56),
        30 => ("BF16", 1, 2),
        34 => ("TQ1_0", 256, 54),
        35 => ("TQ2_0", 256, 66),
        39 => ("MXFP4", 32, 17),
        40 => ("NVFP4", 64, 36),
        _ => return None,
    };
    Some(GgmlTypeInfo { name, block_elems, block_bytes })
}

/// `Q2_K`, `BF16`, ... or `unknown ggml type 77`.
pub fn ggml_type_name(id: u32) -> String {
    match ggml_type_info(id) {
        Some(info) => info.name.to_string(),
        None => format!("unknown ggml type {id}"),
    }
}

/// One entry of the tensor-info section.
#[derive(Debug, Clone)]
pub struct GgufTensorInfo {
    /// The GGUF name (`blk.0.attn_q.weight`).
    pub name: String,
    /// GGUF order: `dims[0]` is the contiguous dimension.
    pub dims: Vec<u64>,
    pub ggml_type: u32,
    /// Offset relative to the start of the data section.
    pub offset: u64,
    /// Bytes of tensor data.
    pub n_bytes: usize,
}

impl GgufTensorInfo {
    /// PyTorch order (outermost first): a linear weight is `[out, in]`.
    pub fn shape(&self) -> Vec<usize> {
        self.dims.iter().rev().map(|&d| d as usize).collect()
    }

    pub fn numel(&self) -> u64 {
        self.dims.iter().product()
    }

    /// The engine's dtype, if it supports this ggml type.
    pub fn dtype(&self) -> Option<DType> {
        DType::from_ggml_id(self.ggml_type)
    }

    pub fn type_name(&self) -> String {
        ggml_type_name(self.ggml_type)
    }
}

/// A parsed GGUF file: metadata, tensor infos and the memory map holding the data.
pub struct GgufFile {
    pub path: PathBuf,
    pub version: u32,
    pub metadata: BTreeMap<String, GgufValue>,
    /// In file order.
    pub tensors: Vec<GgufTensorInfo>,
    pub alignment: usize,
    /// Absolute file offset of the data section.
    pub data_offset: usize,
    pub file_size: usize,
    map: Arc<Mmap>,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("path", &self.path)
            .field("version", &self.version)
            .field("metadata_keys", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .field("alignment", &self.alignment)
            .field("data_offset", &self.data_offset)
            .finish()
    }
}

impl GgufFile {
    /// Maps and parses `path`. Unsupported (but known) tensor types are accepted here,
    /// so tools can inspect any file; [`open_file`] rejects them.
    pub fn open(path: &Path) -> Result<GgufFile, FormatError> {
        let map = map_file(path)?;
        parse(path, Arc::new(map))
    }

    pub fn get(&self, key: &str) -> Option<&GgufValue> {
        self.metadata.get(key)
    }

    pub fn get_str(&self, key: &str) -> Option<&str> {
        self.get(key)?.as_str()
    }

    pub fn get_u64(&self, key: &str) -> Option<u64> {
        self.get(key)?.as_u64()
    }

    pub fn get_usize(&self, key: &str) -> Option<usize> {
        self.get(key)?.as_usize()
    }

    pub fn get_f64(&self, key: &str) -> Option<f64> {
        self.get(key)?.as_f64()
    }

    pub fn get_f32(&self, key: &str) -> Option<f32> {
        self.get_f64(key).map(|v| v as f32)
    }

    pub fn get_bool(&self, key: &str) -> Option<bool> {
        self.get(key)?.as_bool()
    }

    pub fn get_array(&self, key: &str) -> Option<&[GgufValue]> {
        self.get(key)?.as_array()
    }

    /// `general.architecture`.
    pub fn architecture(&self) -> Option<&str> {
        self.get_str("general.architecture")
    }

    pub fn tensor(&self, name: &str) -> Option<&GgufTensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// Absolute file offset of a tensor's bytes.
    pub fn tensor_file_offset(&self, info: &GgufTensorInfo) -> usize {
        self.data_offset + info.offset as usize
    }

    /// A tensor's bytes (bounds were checked by `open`).
    pub fn tensor_bytes(&self, info: &GgufTensorInfo) -> &[u8] {
        let start = self.tensor_file_offset(info);
        &self.map[start..start + info.n_bytes]
    }

    pub fn map(&self) -> &Arc<Mmap> {
        &self.map
    }
}

/// Opens and memory-maps a file, mapping "not found" to [`FormatError::NotFound`].
pub(crate) fn map_file(path: &Path) -> Result<Mmap, FormatError> {
    let file = File::open(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => FormatError::NotFound { path: path.to_path_buf() },
        _ => FormatError::Io { path: path.to_path_buf(), source: e },
    })?;
    // SAFETY: the map is read-only; as with any mmap reader, the file must not be
    // truncated by another process while mapped.
    unsafe { Mmap::map(&file) }.map_err(|e| FormatError::Io { path: path.to_path_buf(), source: e })
}

/// A bounds-checked little-endian cursor. Errors are plain descriptions; the
/// caller prefixes what it was reading.
struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        if n > self.remaining() {
            return Err(format!(
                "needs {n} bytes at offset {}, but the file ends at {} ({} bytes left)",
                self.pos,
                self.buf.len(),
                self.remaining()
            ));
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], String> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }

    fn u32(&mut self) -> Result<u32, String> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    fn u64(&mut self) -> Result<u64, String> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    /// A count of items each taking at least `min_size` bytes: rejected if the rest of
    /// the file could not hold that many, so it is safe to allocate for.
    fn count(&mut self, min_size: usize) -> Result<usize, String> {
        let at = self.pos;
        let n = self.u64()?;
        let fits = n.checked_mul(min_size.max(1) as u64).is_some_and(|b| b <= self.remaining() as u64);
        if !fits {
            return Err(format!(
                "count {n} at offset {at} needs at least {} bytes, but only {} are left",
                (n as u128) * (min_size as u128),
                self.remaining()
            ));
        }
        Ok(n as usize)
    }

    fn string(&mut self) -> Result<String, String> {
        let at = self.pos;
        let n = self.u64()?;
        if n > self.remaining() as u64 {
            return Err(format!("string length {n} at offset {at} exceeds the {} bytes left", self.remaining()));
        }
        Ok(String::from_utf8_lossy(self.take(n as usize)?).into_owned())
    }

    fn value(&mut self, ty: GgufValueType, depth: usize) -> Result<GgufValue, String> {
        Ok(match ty {
            GgufValueType::U8 => GgufValue::U8(self.array::<1>()?[0]),
            GgufValueType::I8 => GgufValue::I8(i8::from_le_bytes(self.array()?)),
            GgufValueType::U16 => GgufValue::U16(u16::from_le_bytes(self.array()?)),
            GgufValueType::I16 => GgufValue::I16(i16::from_le_bytes(self.array()?)),
            GgufValueType::U32 => GgufValue::U32(self.u32()?),
            GgufValueType::I32 => GgufValue::I32(i32::from_le_bytes(self.array()?)),
            GgufValueType::F32 => GgufValue::F32(f32::from_le_bytes(self.array()?)),
            GgufValueType::Bool => {
                let at = self.pos;
                match self.array::<1>()?[0] {
                    0 => GgufValue::Bool(false),
                    1 => GgufValue::Bool(true),
                    b => return Err(format!("invalid bool byte {b} at offset {at}")),
                }
            }
            GgufValueType::String => GgufValue::String(self.string()?),
            GgufValueType::U64 => GgufValue::U64(self.u64()?),
            GgufValueType::I64 => GgufValue::I64(i64::from_le_bytes(self.array()?)),
            GgufValueType::F64 => GgufValue::F64(f64::from_le_bytes(self.array()?)),
            GgufValueType::Array => {
                if depth >= MAX_ARRAY_DEPTH {
                    return Err(format!("arrays nested deeper than {MAX_ARRAY_DEPTH} at offset {}", self.pos));
                }
                let at = self.pos;
                let tid = self.u32()?;
                let elem = GgufValueType::from_id(tid)
                    .ok_or_else(|| format!("unknown array element type {tid} at offset {at}"))?;
                let n = self.count(elem.min_size())?;
                let mut items = Vec::with_capacity(n);
                for i in 0..n {
                    items.push(self.value(elem, depth + 1).map_err(|e| format!("element {i}: {e}"))?);
                }
                GgufValue::Array(elem, items)
            }
        })
    }
}

fn parse(path: &Path, map: Arc<Mmap>) -> Result<GgufFile, FormatError> {
    let corrupt = |what: String| FormatError::Corrupt { path: path.to_path_buf(), what };
    let buf: &[u8] = &map;
    let mut r = Reader { buf, pos: 0 };

    let magic: [u8; 4] = r.array().map_err(|e| corrupt(format!("header (magic): {e}")))?;
    if magic != GGUF_MAGIC {
        return Err(FormatError::BadMagic { path: path.to_path_buf(), magic });
    }
    let version = r.u32().map_err(|e| corrupt(format!("header (version): {e}")))?;
    if version != 2 && version != 3 {
        return Err(FormatError::UnsupportedVersion { path: path.to_path_buf(), version });
    }
    let n_tensors = r.u64().map_err(|e| corrupt(format!("header (tensor count): {e}")))?;
    let n_kv = r.count(13).map_err(|e| corrupt(format!("header (metadata key/value count): {e}")))?;

    let mut metadata = BTreeMap::new();
    for i in 0..n_kv {
        let key = r.string().map_err(|e| corrupt(format!("metadata key #{i}: {e}")))?;
        let ctx = |e: String| corrupt(format!("metadata value #{i} ('{key}'): {e}"));
        let at = r.pos;
        let tid = r.u32().map_err(ctx)?;
        let ty = GgufValueType::from_id(tid).ok_or_else(|| ctx(format!("unknown value type {tid} at offset {at}")))?;
        let value = r.value(ty, 0).map_err(ctx)?;
        if metadata.insert(key.clone(), value).is_some() {
            return Err(corrupt(format!("duplicate metadata key '{key}'")));
        }
    }

    let alignment = match metadata.get("general.alignment") {
        None => DEFAULT_ALIGNMENT,
        Some(v) => match v {
            GgufValue::U32(a) if *a > 0 && a.is_power_of_two() => *a as usize,
            other => return Err(corrupt(format!("general.alignment must be a power-of-two u32, got {other:?}"))),
        },
    };

    // Each tensor info takes at least 24 bytes (name length, n_dims, type, offset), so
    // the count can be checked against what is left; a count that cannot fit is still
    // parsed (never allocating for more than fits) so the error names where it ends.
    let fits = n_tensors.checked_mul(24).is_some_and(|b| b <= r.remaining() as u64);
    let claim = if fits {
        String::new()
    } else {
        format!(" (the header claims {n_tensors} tensors, more than the {} bytes left can hold)", r.remaining())
    };
    let mut tensors = Vec::with_capacity((n_tensors as usize).min(r.remaining() / 24));
    let mut seen = std::collections::HashSet::new();
    for i in 0..n_tensors {
        let name = r.string().map_err(|e| corrupt(format!("tensor info #{i} (name): {e}{claim}")))?;
        let ctx = |field: &str, e: String| corrupt(format!("tensor info #{i} ('{name}') {field}: {e}{claim}"));
        let n_dims = r.u32().map_err(|e| ctx("n_dims", e))? as usize;
        if n_dims > MAX_DIMS {
            return Err(ctx("n_dims", format!("{n_dims} dimensions (at most {MAX_DIMS} allowed)")));
        }
        let mut dims = Vec::with_capacity(n_dims);
        for _ in 0..n_dims {
            dims.push(r.u64().map_err(|e| ctx("dims", e))?);
        }
        let ggml_type = r.u32().map_err(|e| ctx("type", e))?;
        let offset = r.u64().map_err(|e| ctx("offset", e))?;
        if !seen.insert(name.clone()) {
            return Err(corrupt(format!("duplicate tensor name '{name}'")));
        }
        tensors.push(GgufTensorInfo { name, dims, ggml_type, offset, n_bytes: 0 });
    }

    let data_offset = r.pos.div_ceil(alignment) * alignment;
    let file_size = buf.len();
    for t in &mut tensors {
        t.n_bytes = tensor_size(path, t)?;
        if t.offset % alignment as u64 != 0 {
            return Err(corrupt(format!(
                "tensor '{}' data offset {} is not a multiple of the alignment {alignment}",
                t.name, t.offset
            )));
        }
        let end = (data_offset as u64).checked_add(t.offset).and_then(|s| s.checked_add(t.n_bytes as u64));
        if end.is_none_or(|e| e > file_size as u64) {
            return Err(corrupt(format!(
                "tensor data of '{}' ({} bytes at file offset {}) extends past the end of the file ({file_size} bytes)",
                t.name,
                t.n_bytes,
                data_offset as u128 + t.offset as u128
            )));
        }
    }

    Ok(GgufFile { path: path.to_path_buf(), version, metadata, tensors, alignment, data_offset, file_size, map })
}

/// Byte size of a tensor's data, from its dims and type.
fn tensor_size(path: &Path, t: &GgufTensorInfo) -> Result<usize, FormatError> {
    let corrupt = |what: String| FormatError::Corrupt { path: path.to_path_buf(), what };
    let info = ggml_type_info(t.ggml_type).ok_or_else(|| FormatError::UnsupportedTensorType {
        path: path.to_path_buf(),
        tensor: t.name.clone(),
        type_name: ggml_type_name(t.ggml_type),
    })?;
    let numel = t.dims.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d));
    let numel = numel.ok_or_else(|| corrupt(format!("tensor '{}' dims {:?} overflow", t.name, t.dims)))?;
    let row = t.dims.first().copied().unwrap_or(1);
    if row % info.block_elems as u64 != 0 {
        return Err(corrupt(format!(
            "tensor '{}' row length {row} is not a multiple of the {} block size {}",
            t.name, info.name, info.block_elems
        )));
    }
    (numel / info.block_elems as u64)
        .checked_mul(info.block_bytes as u64)
        .and_then(|b| usize::try_from(b).ok())
        .ok_or_else(|| corrupt(format!("tensor '{}' dims {:?} overflow", t.name, t.dims)))
}
