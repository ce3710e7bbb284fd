//! Weight tensors backed by a memory map (or, after load-time quantization, owned bytes).

use crate::FormatError;
use kernels::{DType, MatRef};
use memmap2::Mmap;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

/// Where a tensor's bytes live. Cloning is cheap (reference counted).
#[derive(Clone)]
pub enum TensorData {
    /// `len` bytes at `offset` in a shared memory map; pages are read on first touch.
    Mapped { map: Arc<Mmap>, offset: usize, len: usize },
    /// Bytes produced at load time (e.g. `--quantize`).
    Owned(Arc<Vec<u8>>),
    /// Bytes in a packed layout of `kernels::packed` (repacked at load for
    /// the decode kernels; rows are not contiguous), carved from the
    /// loader's huge-page arena (`kernels::hugepages`).
    Packed(kernels::hugepages::Region),
    /// The file's bytes (row-major) copied at load into the loader's
    /// huge-page arena, for weights the kernels read in the file's layout.
    Resident(kernels::hugepages::Region),
}

impl TensorData {
    pub fn bytes(&self) -> &[u8] {
        match self {
            TensorData::Mapped { map, offset, len } => &map[*offset..*offset + *len],
            TensorData::Owned(v) => v,
            TensorData::Packed(r) | TensorData::Resident(r) => r,
        }
    }

    /// Lets the kernel drop this tensor's pages of the file mapping (they leave
    /// the resident set and are read from the file again if touched). Used after
    /// a tensor was copied out at load (repacked or quantized), so the copy does
    /// not count twice. Pages shared with a neighbouring tensor may go too; that
    /// only costs a re-read.
    pub fn release_pages(&self) {
        self.release_range(0, self.bytes().len());
    }

    /// [`release_pages`](Self::release_pages) for bytes `start..start + len` of the tensor.
    pub fn release_range(&self, start: usize, len: usize) {
        if let TensorData::Mapped { map, offset, len: total } = self {
            let len = len.min(total.saturating_sub(start));
            // SAFETY: the mapping is read-only and file-backed, so DONTNEED only
            // discards clean pages that the kernel re-reads from the file on the
            // next access; no data changes and no reference is invalidated.
            let _ = unsafe { map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, offset + start, len) };
        }
    }
}

impl std::fmt::Debug for TensorData {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TensorData::Mapped { offset, len, .. } => write!(f, "Mapped({offset}+{len})"),
            TensorData::Owned(v) => write!(f, "Owned({})", v.len()),
            TensorData::Packed(v) => write!(f, "Packed({})", v.len()),
            TensorData::Resident(v) => write!(f, "Resident({})", v.len()),
        }
    }
}

/// One named weight. `shape` is in PyTorch order: outermost first, so a linear
/// weight is `[out_features, in_features]` and each row is contiguous.
#[derive(Debug, Clone)]
pub struct WeightTensor {
    pub name: String,
    pub dtype: DType,
    pub shape: Vec<usize>,
    pub data: TensorData,
    /// Multiplies every value of the tensor (1 for all but NVFP4): the FP32
    /// per-tensor scale that NVFP4 keeps outside its blocks (ModelOpt
    /// `weight_scale_2`, compressed-tensors `1/weight_global_scale`, GGUF `.scale`).
    /// Matmuls apply it to their outputs.
    pub out_scale: f32,
}

impl WeightTensor {
    /// A tensor without a per-tensor scale.
    pub fn new(name: String, dtype: DType, shape: Vec<usize>, data: TensorData) -> WeightTensor {
        WeightTensor { name, dtype, shape, data, out_scale: 1.0 }
    }

    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    pub fn bytes(&self) -> &[u8] {
        self.data.bytes()
    }

    /// The tensor as a `[rows, cols]` matrix (1-D tensors are one row).
    pub fn mat(&self) -> MatRef<'_> {
        let cols = *self.shape.last().unwrap_or(&1);
        let rows = self.numel() / cols.max(1);
        MatRef { dtype: self.dtype, rows, cols, data: self.bytes(), packed: self.is_packed() }
    }

    /// Whether the bytes are in the packed four-row layout.
    pub fn is_packed(&self) -> bool {
        matches!(self.data, TensorData::Packed(_))
    }

    /// The bytes in the file's row-major layout (unpacked if needed).
    pub fn row_major(&self) -> std::borrow::Cow<'_, [u8]> {
        if !self.is_packed() {
            return std::borrow::Cow::Borrowed(self.bytes());
        }
        let m = self.mat();
        let mut out = Vec::with_capacity(self.bytes().len());
        let mut buf = Vec::new();
        for r in 0..m.rows {
            out.extend_from_slice(m.row(r, &mut buf));
        }
        std::borrow::Cow::Owned(out)
    }

    /// All elements widened to f32 (for norms, biases and small tensors).
    pub fn to_f32(&self) -> Vec<f32> {
        let mut out = vec![0f32; self.numel()];
        kernels::quant::dequantize_row(self.dtype, &self.row_major(), &mut out);
        if self.out_scale != 1.0 {
            out.iter_mut().for_each(|v| *v *= self.out_scale);
        }
        out
    }
}

/// All tensors of a model by HF-style name, plus the file they came from (for errors).
#[derive(Debug, Default)]
pub struct TensorStore {
    pub path: PathBuf,
    pub tensors: BTreeMap<String, WeightTensor>,
}

impl TensorStore {
    pub fn get(&self, name: &str) -> Result<&WeightTensor, FormatError> {
        self.tensors.get(name).ok_or_else(|| {
            let is_gguf = self.path.extension().is_some_and(|e| e.eq_ignore_ascii_case("gguf"));
            FormatError::MissingTensor {
                path: self.path.clone(),
                tensor: name.to_string(),
                gguf_name: if is_gguf { crate::names::hf_to_gguf(name) } else { None },
            }
        })
    }

    pub fn contains(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    /// Drops every page of this store's file mappings from the process's
    /// resident set (the page cache keeps them; a tensor still read in place
    /// faults its pages back on its next use, without reading the disk when
    /// they are cached). The loader calls it after each layer: a file system
    /// with large folios (ext4 since Linux 6.16) maps a whole folio, up to
    /// megabytes, on one fault, so reading a small tensor maps its already
    /// copied neighbours back, which per-tensor releases cannot see (SmolLM2:
    /// 27 MB of released layers resident again after the load).
    pub fn release_file_pages(&self) {
        let mut seen: Vec<*const Mmap> = Vec::new();
        for t in self.tensors.values() {
            if let TensorData::Mapped { map, .. } = &t.data {
                if seen.contains(&Arc::as_ptr(map)) {
                    continue;
                }
                seen.push(Arc::as_ptr(map));
                // SAFETY: as in `release_range`: read-only, file-backed, so
                // DONTNEED only drops clean pages that are re-read on access.
                let _ = unsafe { map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, 0, map.len()) };
            }
        }
    }

    /// Like [`get`](Self::get) but also checks the shape.
    pub fn get_shaped(&self, name: &str, expected: &[usize]) -> Result<&WeightTensor, FormatError> {
        let t = self.get(name)?;
        if t.shape != expected {
            return Err(FormatError::ShapeMismatch {
                path: self.path.clone(),
                tensor: name.to_string(),
                expected: expected.to_vec(),
                got: t.shape.clone(),
            });
        }
        Ok(t)
    }
}
