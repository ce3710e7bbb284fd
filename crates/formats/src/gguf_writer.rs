//! A small GGUF writer, for making test models and fixtures.
//!
//! ```
//! use shardlm_formats::gguf_writer::GgufWriter;
//! use kernels::DType;
//! let mut w = GgufWriter::new();
//! w.add_str("general.architecture", "llama").add_u32("llama.block_count", 1);
//! w.add_f32_tensor("output_norm.weight", &[4], &[1.0, 2.0, 3.0, 4.0]);
//! let bytes = w.to_bytes();
//! assert_eq!(&bytes[..4], b"GGUF");
//! ```

use crate::gguf::{GgufValue, GgufValueType, DEFAULT_ALIGNMENT, GGUF_MAGIC};
use kernels::DType;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

#[derive(Debug, Clone)]
struct PendingTensor {
    name: String,
    dims: Vec<u64>,
    ggml_type: u32,
    data: Vec<u8>,
}

/// A tensor announced in a streamed file's header: GGUF-order `dims`, the ggml
/// type id and the exact byte length its data will have.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorInfo {
    pub name: String,
    pub dims: Vec<u64>,
    pub ggml_type: u32,
    pub n_bytes: usize,
}

impl TensorInfo {
    /// `shape` in PyTorch order (`[out, in]`), stored reversed; `None` if
    /// `dtype` has no GGUF type or the shape is not whole blocks of it.
    pub fn new(name: &str, shape: &[usize], dtype: DType) -> Option<TensorInfo> {
        Some(TensorInfo {
            name: name.to_string(),
            dims: shape.iter().rev().map(|&d| d as u64).collect(),
            ggml_type: dtype.ggml_id()?,
            n_bytes: dtype.bytes_for(shape.iter().product())?,
        })
    }
}

/// A GGUF file being written tensor by tensor ([`GgufWriter::stream_to`]).
pub struct GgufStream {
    file: io::BufWriter<std::fs::File>,
    tensors: Vec<TensorInfo>,
    next: usize,
    alignment: usize,
    path: PathBuf,
}

impl GgufStream {
    /// Writes the next announced tensor's data; its length must be the
    /// announced one (an `InvalidInput` error naming the tensor otherwise).
    pub fn write_tensor(&mut self, data: &[u8]) -> io::Result<()> {
        let Some(t) = self.tensors.get(self.next) else {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "more tensors written than announced"));
        };
        if data.len() != t.n_bytes {
            let msg = format!("tensor '{}': {} bytes written, {} announced", t.name, data.len(), t.n_bytes);
            return Err(io::Error::new(io::ErrorKind::InvalidInput, msg));
        }
        self.file.write_all(data)?;
        let pad = data.len().next_multiple_of(self.alignment) - data.len();
        self.file.write_all(&vec![0u8; pad])?;
        self.next += 1;
        Ok(())
    }

    /// Checks every announced tensor was written, then flushes and syncs.
    pub fn finish(mut self) -> io::Result<()> {
        if let Some(t) = self.tensors.get(self.next) {
            let msg = format!("{}: tensor '{}' was announced but never written", self.path.display(), t.name);
            return Err(io::Error::new(io::ErrorKind::InvalidInput, msg));
        }
        self.file.flush()?;
        self.file.get_ref().sync_all()
    }
}

/// Collects metadata and tensors, then serializes them as one GGUF file.
#[derive(Debug, Clone)]
pub struct GgufWriter {
    version: u32,
    alignment: usize,
    kvs: Vec<(String, GgufValue)>,
    tensors: Vec<PendingTensor>,
}

impl Default for GgufWriter {
    fn default() -> Self {
        Self::new()
    }
}

impl GgufWriter {
    /// GGUF v3, alignment 32.
    pub fn new() -> Self {
        GgufWriter { version: 3, alignment: DEFAULT_ALIGNMENT, kvs: Vec::new(), tensors: Vec::new() }
    }

    /// The header version to write (tests use 2 and bogus values).
    pub fn set_version(&mut self, version: u32) -> &mut Self {
        self.version = version;
        self
    }

    /// Sets the data alignment and writes it as `general.alignment` (u32).
    pub fn set_alignment(&mut self, alignment: u32) -> &mut Self {
        assert!(alignment > 0 && alignment.is_power_of_two(), "alignment must be a power of two");
        self.alignment = alignment as usize;
        self.add("general.alignment", GgufValue::U32(alignment))
    }

    /// Adds (or replaces) a metadata key; keys are written in insertion order.
    pub fn add(&mut self, key: &str, value: GgufValue) -> &mut Self {
        match self.kvs.iter_mut().find(|(k, _)| k == key) {
            Some(slot) => slot.1 = value,
            None => self.kvs.push((key.to_string(), value)),
        }
        self
    }

    pub fn add_u32(&mut self, key: &str, v: u32) -> &mut Self {
        self.add(key, GgufValue::U32(v))
    }

    pub fn add_f32(&mut self, key: &str, v: f32) -> &mut Self {
        self.add(key, GgufValue::F32(v))
    }

    pub fn add_bool(&mut self, key: &str, v: bool) -> &mut Self {
        self.add(key, GgufValue::Bool(v))
    }

    pub fn add_str(&mut self, key: &str, v: &str) -> &mut Self {
        self.add(key, GgufValue::String(v.to_string()))
    }

    pub fn add_str_array<S: AsRef<str>>(&mut self, key: &str, items: &[S]) -> &mut Self {
        let items = items.iter().map(|s| GgufValue::String(s.as_ref().to_string())).collect();
        self.add(key, GgufValue::Array(GgufValueType::String, items))
    }

    pub fn add_i32_array(&mut self, key: &str, items: &[i32]) -> &mut Self {
        self.add(key, GgufValue::Array(GgufValueType::I32, items.iter().map(|&v| GgufValue::I32(v)).collect()))
    }

    pub fn add_f32_array(&mut self, key: &str, items: &[f32]) -> &mut Self {
        self.add(key, GgufValue::Array(GgufValueType::F32, items.iter().map(|&v| GgufValue::F32(v)).collect()))
    }

    /// Adds a tensor. `shape` is in PyTorch order (`[out, in]`); it is stored reversed.
    /// Panics if `data` does not hold exactly `shape` of `dtype`, or if `dtype`
    /// has no GGUF type (FP8).
    pub fn add_tensor(&mut self, name: &str, shape: &[usize], dtype: DType, data: Vec<u8>) -> &mut Self {
        let numel: usize = shape.iter().product();
        let want = dtype.bytes_for(numel);
        assert_eq!(want, Some(data.len()), "tensor '{name}': {shape:?} of {dtype} needs {want:?} bytes");
        let dims: Vec<u64> = shape.iter().rev().map(|&d| d as u64).collect();
        let id = dtype.ggml_id().unwrap_or_else(|| panic!("tensor '{name}': {dtype} has no GGUF type"));
        self.add_tensor_raw(name, &dims, id, data)
    }

    /// An F32 tensor from values (PyTorch-order shape).
    pub fn add_f32_tensor(&mut self, name: &str, shape: &[usize], values: &[f32]) -> &mut Self {
        let data = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.add_tensor(name, shape, DType::F32, data)
    }

    /// Adds a tensor exactly as given: GGUF-order `dims`, any type id, any bytes
    /// (for writing unusual or deliberately broken files).
    pub fn add_tensor_raw(&mut self, name: &str, dims: &[u64], ggml_type: u32, data: Vec<u8>) -> &mut Self {
        self.tensors.push(PendingTensor { name: name.to_string(), dims: dims.to_vec(), ggml_type, data });
        self
    }

    /// The whole file.
    pub fn to_bytes(&self) -> Vec<u8> {
        let infos: Vec<TensorInfo> = self
            .tensors
            .iter()
            .map(|t| TensorInfo {
                name: t.name.clone(),
                dims: t.dims.clone(),
                ggml_type: t.ggml_type,
                n_bytes: t.data.len(),
            })
            .collect();
        let (mut out, offsets) = self.header(&infos);
        let data_start = out.len();
        for (t, off) in self.tensors.iter().zip(offsets) {
            out.resize(data_start + off, 0);
            out.extend_from_slice(&t.data);
        }
        // Pad the last tensor too, as gguf-py does.
        out.resize(out.len().next_multiple_of(self.alignment), 0);
        out
    }

    /// Everything before the tensor data (magic, metadata, tensor infos,
    /// padding to the alignment), and each tensor's offset from the data start.
    fn header(&self, infos: &[TensorInfo]) -> (Vec<u8>, Vec<usize>) {
        let mut out = Vec::new();
        out.extend_from_slice(&GGUF_MAGIC);
        out.extend_from_slice(&self.version.to_le_bytes());
        out.extend_from_slice(&(infos.len() as u64).to_le_bytes());
        out.extend_from_slice(&(self.kvs.len() as u64).to_le_bytes());
        for (k, v) in &self.kvs {
            write_str(&mut out, k);
            out.extend_from_slice(&v.value_type().id().to_le_bytes());
            write_value(&mut out, v);
        }
        let mut offset = 0usize;
        let mut offsets = Vec::with_capacity(infos.len());
        for t in infos {
            write_str(&mut out, &t.name);
            out.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
            for d in &t.dims {
                out.extend_from_slice(&d.to_le_bytes());
            }
            out.extend_from_slice(&t.ggml_type.to_le_bytes());
            out.extend_from_slice(&(offset as u64).to_le_bytes());
            offsets.push(offset);
            offset = (offset + t.n_bytes).next_multiple_of(self.alignment);
        }
        out.resize(out.len().next_multiple_of(self.alignment), 0);
        (out, offsets)
    }

    /// Starts a file whose tensors are announced now (`tensors`, in file
    /// order) and written one at a time with [`GgufStream::write_tensor`], so
    /// a converter holds one tensor in memory, never the model. The metadata
    /// is this writer's; tensors added to it with `add_tensor*` are ignored.
    pub fn stream_to(&self, path: &Path, tensors: Vec<TensorInfo>) -> io::Result<GgufStream> {
        let (head, _) = self.header(&tensors);
        let mut file = io::BufWriter::new(std::fs::File::create(path)?);
        file.write_all(&head)?;
        Ok(GgufStream { file, tensors, next: 0, alignment: self.alignment, path: path.to_path_buf() })
    }

    pub fn write_to(&self, path: &Path) -> io::Result<()> {
        std::fs::write(path, self.to_bytes())
    }
}

fn write_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn write_value(out: &mut Vec<u8>, v: &GgufValue) {
    match v {
        GgufValue::U8(x) => out.push(*x),
        GgufValue::I8(x) => out.extend_from_slice(&x.to_le_bytes()),
        GgufValue::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
        GgufValue::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
        GgufValue::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
        GgufValue::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
        GgufValue::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
        GgufValue::Bool(x) => out.push(u8::from(*x)),
        GgufValue::String(s) => write_str(out, s),
        GgufValue::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
        GgufValue::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
        GgufValue::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
        GgufValue::Array(ty, items) => {
            out.extend_from_slice(&ty.id().to_le_bytes());
            out.extend_from_slice(&(items.len() as u64).to_le_bytes());
            for item in items {
                write_value(out, item);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A streamed file is byte for byte what the in-memory writer makes.
    #[test]
    fn streamed_file_equals_in_memory_one() {
        let mut w = GgufWriter::new();
        w.add_str("general.architecture", "llama").add_u32("llama.block_count", 1);
        let a: Vec<f32> = (0..12).map(|i| i as f32).collect();
        let b = vec![0u8; DType::Q8_0.bytes_for(64).unwrap()];
        let mut mem = w.clone();
        mem.add_f32_tensor("a", &[3, 4], &a);
        mem.add_tensor("b", &[2, 32], DType::Q8_0, b.clone());
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.gguf");
        let infos = vec![
            TensorInfo::new("a", &[3, 4], DType::F32).unwrap(),
            TensorInfo::new("b", &[2, 32], DType::Q8_0).unwrap(),
        ];
        let mut s = w.stream_to(&path, infos).unwrap();
        s.write_tensor(&a.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>()).unwrap();
        assert!(s.write_tensor(&b[1..]).unwrap_err().to_string().contains("tensor 'b'"));
        s.write_tensor(&b).unwrap();
        s.finish().unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), mem.to_bytes());
    }

    #[test]
    fn unwritten_tensor_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.gguf");
        let s = GgufWriter::new().stream_to(&path, vec![TensorInfo::new("x", &[32], DType::F32).unwrap()]).unwrap();
        assert!(s.finish().unwrap_err().to_string().contains("'x' was announced but never written"));
    }
}
