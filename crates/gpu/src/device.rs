//! The device: adapter choice, buffers, uploads and readbacks, and the
//! compiled shaders.

use crate::GpuError;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// What `--device gpu[:N]` opened, for logs, `inspect` and the warning about
/// software adapters.
#[derive(Debug, Clone)]
pub struct AdapterReport {
    pub name: String,
    pub backend: String,
    pub driver: String,
    /// A CPU implementation (Mesa's llvmpipe, SwiftShader): correct, not fast.
    pub software: bool,
    /// The largest buffer one binding may span.
    pub max_binding_bytes: u64,
    /// Device-local memory (the largest such heap: a discrete GPU's VRAM,
    /// a unified-memory machine's shared heap); `None` where the backend
    /// does not say (Metal is not read yet).
    pub memory_bytes: Option<u64>,
}

impl std::fmt::Display for AdapterReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({}, {})", self.name, self.backend, self.driver)?;
        if let Some(m) = self.memory_bytes {
            write!(f, ", {}", crate::error::size(m))?;
        }
        if self.software {
            f.write_str(", software")?;
        }
        Ok(())
    }
}

/// A device buffer of f32/u32 words, usable as storage and as a copy source
/// and destination.
#[derive(Debug)]
pub struct DeviceBuf {
    pub(crate) buf: wgpu::Buffer,
    pub(crate) words: usize,
}

impl DeviceBuf {
    /// Its size in 4-byte words.
    pub fn words(&self) -> usize {
        self.words
    }
}

/// An open GPU: device, queue and the shaders compiled so far.
pub struct Gpu {
    pub(crate) device: wgpu::Device,
    pub(crate) queue: wgpu::Queue,
    pub info: AdapterReport,
    pipelines: Mutex<HashMap<String, Arc<wgpu::ComputePipeline>>>,
    /// Bind groups by (shader, parameter slot, buffers): a step of the same
    /// shape as an earlier one binds the same buffers at the same slots.
    binds: Mutex<HashMap<BindKey, Arc<wgpu::BindGroup>>>,
    /// Bound where a shader declares a buffer it does not read for this call.
    pub(crate) dummy: wgpu::Buffer,
    /// Per-dispatch parameters: fixed 256-byte slots, written with the queue.
    pub(crate) params: wgpu::Buffer,
    /// The first error the device reported (validation, out of memory, loss).
    error: Arc<Mutex<Option<String>>>,
    /// The readback buffer, kept between reads (a step reads its logits
    /// back every time: no allocation per step).
    staging: Mutex<Option<wgpu::Buffer>>,
    /// `SHARDLM_GPU_PROFILE=1`: each dispatch runs alone (submit, wait) and
    /// its wall time adds up here by label; printed when the device closes.
    pub(crate) profile: Option<Mutex<HashMap<String, (u64, f64)>>>,
}

impl Drop for Gpu {
    fn drop(&mut self) {
        let Some(p) = &self.profile else { return };
        let p = p.lock().unwrap_or_else(|e| e.into_inner());
        let mut rows: Vec<_> = p.iter().collect();
        rows.sort_by(|a, b| b.1 .1.total_cmp(&a.1 .1));
        let total: f64 = rows.iter().map(|r| r.1 .1).sum();
        eprintln!("GPU profile ({}): each dispatch alone, submit to wait, wall time", self.info.name);
        for (label, (n, secs)) in rows {
            eprintln!(
                "  {:>8.1} ms {:>5.1}%  {:>7} × {:>7.1} µs  {label}",
                secs * 1e3,
                100.0 * secs / total.max(1e-12),
                n,
                secs * 1e6 / *n as f64
            );
        }
    }
}

type BindKey = (String, u64, Vec<wgpu::Buffer>);

/// Bind groups kept at most (beyond it the cache starts over: a buffer that
/// was replaced is not held forever).
const BIND_CACHE: usize = 16384;

/// Parameter slots per submission ([`crate::Pass`] submits when they run out).
pub(crate) const PARAM_SLOTS: u64 = 8192;
pub(crate) const PARAM_SLOT: u64 = 256;

fn backends() -> wgpu::Backends {
    wgpu::Backends::VULKAN | wgpu::Backends::METAL
}

fn report(a: &wgpu::Adapter) -> AdapterReport {
    let i = a.get_info();
    AdapterReport {
        name: i.name.clone(),
        backend: format!("{:?}", i.backend),
        driver: if i.driver.is_empty() { i.driver_info.clone() } else { i.driver.clone() },
        software: i.device_type == wgpu::DeviceType::Cpu,
        max_binding_bytes: a.limits().max_storage_buffer_binding_size,
        memory_bytes: memory_cap(device_memory(a)),
    }
}

/// `SHARDLM_GPU_MEMORY` (bytes, or with a K/M/G suffix) caps the device
/// memory shardlm plans with: to leave room for other programs on the GPU,
/// or to test the refusals.
fn memory_cap(found: Option<u64>) -> Option<u64> {
    let cap = std::env::var("SHARDLM_GPU_MEMORY").ok().and_then(|v| {
        let v = v.trim().to_ascii_uppercase();
        let (num, mul) = match v.chars().last() {
            Some('K') => (&v[..v.len() - 1], 1u64 << 10),
            Some('M') => (&v[..v.len() - 1], 1 << 20),
            Some('G') => (&v[..v.len() - 1], 1 << 30),
            _ => (&v[..], 1),
        };
        num.parse::<f64>().ok().map(|n| (n * mul as f64) as u64)
    });
    match (found, cap) {
        (Some(f), Some(c)) => Some(f.min(c)),
        (f, c) => f.or(c),
    }
}

/// The largest device-local memory heap of a Vulkan adapter.
fn device_memory(a: &wgpu::Adapter) -> Option<u64> {
    // SAFETY: only reads the physical device's memory properties through the
    // instance wgpu-hal loaded; the guard keeps the adapter alive meanwhile.
    let hal = unsafe { a.as_hal::<wgpu::hal::api::Vulkan>() }?;
    let instance = hal.shared_instance().raw_instance();
    // SAFETY: a valid physical device of that instance.
    let props = unsafe { instance.get_physical_device_memory_properties(hal.raw_physical_device()) };
    let heaps = &props.memory_heaps[..(props.memory_heap_count as usize).min(props.memory_heaps.len())];
    heaps.iter().filter(|h| h.flags.contains(ash::vk::MemoryHeapFlags::DEVICE_LOCAL)).map(|h| h.size).max()
}

impl Gpu {
    /// The adapters this machine offers, in the order `gpu:N` counts them.
    pub fn adapters() -> Vec<AdapterReport> {
        let instance = wgpu::Instance::new(wgpu::InstanceDescriptor {
            backends: backends(),
            ..wgpu::InstanceDescriptor::new_without_display_handle()
        });
        pollster::block_on(instance.enumerate_adapters(backends())).iter().map(report).collect()
    }

    /// Opens adapter `index`, or with `None` the first hardware adapter (a
    /// software one only when there is nothing else: see
    /// [`AdapterReport::software`]).
    pub fn open(index: Option<usize>) -> Result<Gpu, GpuError> {
        let instance = wgpu::Instance::new(wgpu::InstanceDescriptor {
            backends: backends(),
            ..wgpu::InstanceDescriptor::new_without_display_handle()
        });
        let adapters = pollster::block_on(instance.enumerate_adapters(backends()));
        if adapters.is_empty() {
            return Err(GpuError::NoAdapter(
                "no Vulkan or Metal device (on Linux, install the GPU's Vulkan driver; \
                 Debian's mesa-vulkan-drivers has a software one)"
                    .into(),
            ));
        }
        let adapter = match index {
            Some(i) => adapters.get(i).ok_or_else(|| GpuError::NoSuchAdapter {
                index: i,
                count: adapters.len(),
                names: adapters.iter().map(|a| a.get_info().name).collect::<Vec<_>>().join(", "),
            })?,
            None => {
                let rank = |a: &wgpu::Adapter| match a.get_info().device_type {
                    wgpu::DeviceType::DiscreteGpu => 0,
                    wgpu::DeviceType::IntegratedGpu => 1,
                    wgpu::DeviceType::VirtualGpu | wgpu::DeviceType::Other => 2,
                    wgpu::DeviceType::Cpu => 3,
                };
                adapters.iter().min_by_key(|a| rank(a)).expect("not empty")
            }
        };
        let info = report(adapter);
        let limits = adapter.limits();
        if limits.max_compute_workgroup_size_x < 256 || limits.max_compute_invocations_per_workgroup < 256 {
            return Err(GpuError::MissingFeature {
                adapter: info.name.clone(),
                feature: "256 invocations per workgroup".into(),
            });
        }
        let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
            label: Some("shardlm"),
            required_features: wgpu::Features::empty(),
            required_limits: limits,
            ..Default::default()
        }))
        .map_err(|e| GpuError::Device { adapter: info.name.clone(), detail: e.to_string() })?;
        let error = Arc::new(Mutex::new(None::<String>));
        let sink = error.clone();
        device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
            let mut slot = sink.lock().unwrap_or_else(|p| p.into_inner());
            if slot.is_none() {
                *slot = Some(e.to_string());
            }
        }));
        let usage = wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST;
        let dummy = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("dummy"),
            size: 16,
            usage,
            mapped_at_creation: false,
        });
        let params = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("params"),
            size: PARAM_SLOTS * PARAM_SLOT,
            usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let (pipelines, binds) = (Mutex::new(HashMap::new()), Mutex::new(HashMap::new()));
        let profile = std::env::var("SHARDLM_GPU_PROFILE").is_ok_and(|v| v == "1").then(|| Mutex::new(HashMap::new()));
        let staging = Mutex::new(None);
        Ok(Gpu { device, queue, info, pipelines, binds, dummy, params, error, staging, profile })
    }

    /// Waits for everything submitted.
    pub(crate) fn wait(&self) {
        let _ = self.device.poll(wgpu::PollType::Wait { submission_index: None, timeout: None });
    }

    /// Refuses `bytes` of device buffers for `what` when the device's memory
    /// (less `reserve_bytes` kept free) cannot hold them; says nothing where
    /// the memory is not known.
    pub fn check_fits(&self, what: &str, bytes: u64, reserve_bytes: u64) -> Result<(), GpuError> {
        match self.info.memory_bytes {
            Some(mem) if bytes.saturating_add(reserve_bytes) > mem => Err(GpuError::OutOfMemory {
                what: what.into(),
                need: bytes,
                have: mem.saturating_sub(reserve_bytes),
                adapter: self.info.name.clone(),
            }),
            _ => Ok(()),
        }
    }

    /// The first error the device reported since it opened, if any.
    pub fn check(&self) -> Result<(), GpuError> {
        match self.error.lock().unwrap_or_else(|p| p.into_inner()).clone() {
            Some(e) => Err(GpuError::Failed(e)),
            None => Ok(()),
        }
    }

    fn check_size(&self, what: &str, bytes: u64) -> Result<(), GpuError> {
        if bytes > self.info.max_binding_bytes {
            return Err(GpuError::TooLarge {
                what: what.into(),
                bytes,
                limit: self.info.max_binding_bytes,
                adapter: self.info.name.clone(),
            });
        }
        Ok(())
    }

    /// A zeroed buffer of `words` 4-byte words (at least one).
    pub fn buffer(&self, what: &str, words: usize) -> Result<DeviceBuf, GpuError> {
        let size = (words.max(1) * 4) as u64;
        self.check_size(what, size)?;
        let buf = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(what),
            size,
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: false,
        });
        Ok(DeviceBuf { buf, words: words.max(1) })
    }

    /// A buffer holding `data` (words; padded to one word at least).
    pub fn buffer_with(&self, what: &str, data: &[u32]) -> Result<DeviceBuf, GpuError> {
        let b = self.buffer(what, data.len())?;
        if !data.is_empty() {
            self.queue.write_buffer(&b.buf, 0, bytemuck::cast_slice(data));
        }
        Ok(b)
    }

    /// Writes `data` at word `offset` of `buf` (ordered before the next submission).
    pub fn write_f32(&self, buf: &DeviceBuf, offset: usize, data: &[f32]) {
        if !data.is_empty() {
            debug_assert!(offset + data.len() <= buf.words);
            self.queue.write_buffer(&buf.buf, (offset * 4) as u64, bytemuck::cast_slice(data));
        }
    }

    /// [`Gpu::write_f32`] for words.
    pub fn write_u32(&self, buf: &DeviceBuf, offset: usize, data: &[u32]) {
        if !data.is_empty() {
            debug_assert!(offset + data.len() <= buf.words);
            self.queue.write_buffer(&buf.buf, (offset * 4) as u64, bytemuck::cast_slice(data));
        }
    }

    /// Reads `len` f32 at word `offset` of `buf`, after everything submitted.
    pub fn read_f32(&self, buf: &DeviceBuf, offset: usize, len: usize) -> Result<Vec<f32>, GpuError> {
        if len == 0 {
            return Ok(Vec::new());
        }
        let bytes = (len * 4) as u64;
        let mut kept = self.staging.lock().unwrap_or_else(|p| p.into_inner());
        let staging = match kept.take() {
            Some(b) if b.size() >= bytes => b,
            _ => self.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("readback"),
                size: bytes.next_power_of_two(),
                usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            }),
        };
        let mut enc = self.device.create_command_encoder(&Default::default());
        enc.copy_buffer_to_buffer(&buf.buf, (offset * 4) as u64, &staging, 0, bytes);
        self.queue.submit([enc.finish()]);
        let (tx, rx) = std::sync::mpsc::channel();
        staging.map_async(wgpu::MapMode::Read, ..bytes, move |r| {
            let _ = tx.send(r);
        });
        self.device
            .poll(wgpu::PollType::Wait { submission_index: None, timeout: None })
            .map_err(|e| GpuError::Failed(e.to_string()))?;
        self.check()?;
        match rx.recv() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(GpuError::Failed(format!("reading results back: {e}"))),
            Err(_) => return Err(GpuError::Failed("reading results back: the map never finished".into())),
        }
        let out = bytemuck::cast_slice::<u8, f32>(&staging.get_mapped_range(..bytes)).to_vec();
        staging.unmap();
        *kept = Some(staging);
        Ok(out)
    }

    /// The bind group of `pipeline` (shader `key`) over the parameter slot at
    /// `offset` (`size` bytes) and `bufs` as bindings 1.. in order.
    pub(crate) fn bind_group(
        &self,
        key: &str,
        pipeline: &wgpu::ComputePipeline,
        offset: u64,
        size: u64,
        bufs: &[&wgpu::Buffer],
    ) -> Arc<wgpu::BindGroup> {
        let id: BindKey = (key.to_string(), offset, bufs.iter().map(|b| (*b).clone()).collect());
        let mut map = self.binds.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(b) = map.get(&id) {
            return b.clone();
        }
        let mut entries = vec![wgpu::BindGroupEntry {
            binding: 0,
            resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                buffer: &self.params,
                offset,
                size: wgpu::BufferSize::new(size),
            }),
        }];
        for (i, b) in bufs.iter().enumerate() {
            entries.push(wgpu::BindGroupEntry { binding: i as u32 + 1, resource: b.as_entire_binding() });
        }
        let bind = Arc::new(self.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some(key),
            layout: &pipeline.get_bind_group_layout(0),
            entries: &entries,
        }));
        if map.len() >= BIND_CACHE {
            map.clear();
        }
        map.insert(id, bind.clone());
        bind
    }

    /// The compute pipeline of `source` (compiled once per `key`).
    pub(crate) fn pipeline(&self, key: &str, source: impl FnOnce() -> String) -> Arc<wgpu::ComputePipeline> {
        let mut map = self.pipelines.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(p) = map.get(key) {
            return p.clone();
        }
        let module = self.device.create_shader_module(wgpu::ShaderModuleDescriptor {
            label: Some(key),
            source: wgpu::ShaderSource::Wgsl(source().into()),
        });
        let p = Arc::new(self.device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some(key),
            layout: None,
            module: &module,
            entry_point: Some("main"),
            compilation_options: Default::default(),
            cache: None,
        }));
        map.insert(key.to_string(), p.clone());
        p
    }
}
