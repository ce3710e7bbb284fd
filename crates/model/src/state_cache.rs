//! Recurrent memory: the fixed-size per-sequence state of linear-attention
//! layers (Gated DeltaNet, [`crate::linear_attn`]), kept beside the paged KV
//! (docs/ARCHITECTURE.md, "Hybrid models: recurrent state memory").
//!
//! A KV layer grows a row per position; a linear-attention layer holds, per
//! sequence, a constant-size state instead:
//! * the conv state: the last `kernel − 1` inputs of the causal conv1d,
//!   `[(kernel − 1) × channels]`, oldest first;
//! * the recurrent state: per value head a `dk × dv` matrix, `[v_heads × dk × dv]`.
//!
//! A [`StatePool`] has `n_slots` slots of every owned linear layer's state
//! (f32, zeroed). A sequence occupies one slot; a slot also remembers how
//! many positions it has consumed ([`StatePool::pos`]), so a step that does
//! not continue exactly where the state stopped is refused instead of
//! silently computing garbage (a recurrent state cannot be rewound: prefix
//! reuse restores a snapshot slot taken at that position, [`StatePool::copy`]).
//!
//! # Taking back a verify step (speculative decoding)
//! A verify step runs `1 + k` rows (the last token and a draft of `k`) and
//! only the first `1 + a` are accepted, so the state must go back to where
//! row `a` left it. Each owned layer keeps a [`LayerUndo`] per slot: the
//! state before the verify step and every row's conv input and delta-rule
//! inputs (q, k, v, g, β per value head: `2·dk + dv + 2` floats, against the
//! `dk × dv` state a row would need to keep). The next step of the slot
//! starts at `start + 1 + a` instead of where the state stopped;
//! [`StatePool::begin_step`] accepts that and marks each layer to replay the
//! `1 + a` accepted rows from the saved state first, with the same recurrent
//! kernel the verify step ran (bit for bit the state it had after row `a`).
//! Replaying costs at most the verify step's own delta-rule work and no
//! matmul; nothing crosses ranks, since every rank sees the next step's
//! position. As vLLM's and SGLang's Mamba speculation does, the cost is
//! memory: one extra state and the rows' inputs per speculating slot,
//! allocated on a slot's first verify step.

use crate::ModelError;
use std::sync::Arc;

/// One linear-attention layer's state shape (this shard's heads).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StateShape {
    /// Conv channels: q and k of the local key heads, v of the local value heads.
    pub conv_channels: usize,
    pub conv_kernel: usize,
    pub v_heads: usize,
    pub dk: usize,
    pub dv: usize,
}

impl StateShape {
    pub fn conv_len(&self) -> usize {
        self.conv_kernel.saturating_sub(1) * self.conv_channels
    }

    pub fn rec_len(&self) -> usize {
        self.v_heads * self.dk * self.dv
    }

    /// Floats of one slot of this layer.
    pub fn len(&self) -> usize {
        self.conv_len() + self.rec_len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// `n_slots` per-sequence states of every owned linear-attention layer.
#[derive(Debug)]
pub struct StatePool {
    /// Per owned layer: its state shape, `None` for an attention layer.
    pub shapes: Vec<Option<StateShape>>,
    pub n_slots: usize,
    /// Per owned layer: `n_slots × shape.len()` floats, conv then recurrent
    /// state in each slot (empty for attention layers).
    data: Vec<Vec<f32>>,
    /// Per slot: positions the state has consumed (the next position).
    pos: Vec<usize>,
    /// Per slot, per owned layer: the last verify step's way back (empty
    /// until the slot's first verify step).
    undo: Vec<Vec<LayerUndo>>,
    /// Where the values live when a GPU shard computes the layers (`data`
    /// is then empty): clears, copies, saves and loads go there.
    device: Option<Arc<dyn DeviceStates>>,
}

/// A state pool's values in device memory ([`StatePool::attach`]): per owned
/// linear layer one buffer of `n_slots × shape.len()` floats in the host
/// layout, so a slot saved from one loads into the other.
pub trait DeviceStates: Send + Sync + std::fmt::Debug {
    /// Zeroes, per `(layer, at, len)`, `len` floats of `layer` from `at`
    /// (a slot's every layer at once: one submission).
    fn zero(&self, parts: &[(usize, usize, usize)]) -> Result<(), ModelError>;
    /// Copies, per `(layer, from, to, len)`, `len` floats of `layer` from
    /// `from` to `to` (disjoint; a slot's every layer at once).
    fn copy(&self, parts: &[(usize, usize, usize, usize)]) -> Result<(), ModelError>;
    fn read(&self, layer: usize, at: usize, len: usize) -> Result<Vec<f32>, ModelError>;
    fn write(&self, layer: usize, at: usize, values: &[f32]) -> Result<(), ModelError>;
}

/// One owned layer's way back from a slot's last verify step (see the module notes).
#[derive(Debug, Clone, Default)]
pub struct LayerUndo {
    /// The verify step's first position and its rows (0 rows: nothing to undo).
    pub start: usize,
    pub rows: usize,
    /// Accepted rows this layer replays from `before` at its next step (0: none).
    pub replay: usize,
    /// The slot's conv state then recurrent state before the verify step.
    pub before: Vec<f32>,
    /// The rows' conv inputs, `rows × conv_channels`.
    pub conv_in: Vec<f32>,
    /// The rows' delta-rule inputs, `rows × v_heads × `[`LayerUndo::stride`]:
    /// per value head q, k (`dk` each), v (`dv`), g, β. Row-major over rows,
    /// so growing for a longer step keeps the rows already saved in place.
    pub heads: Vec<f32>,
}

impl LayerUndo {
    /// Floats of one value head's inputs for one row.
    pub fn stride(shape: &StateShape) -> usize {
        2 * shape.dk + shape.dv + 2
    }

    fn forget(&mut self) {
        (self.start, self.rows, self.replay) = (0, 0, 0);
    }
}

impl StatePool {
    pub fn new(shapes: Vec<Option<StateShape>>, n_slots: usize) -> StatePool {
        let data = shapes.iter().map(|s| vec![0f32; s.map_or(0, |s| s.len()) * n_slots]).collect();
        StatePool { shapes, n_slots, data, pos: vec![0; n_slots], undo: vec![Vec::new(); n_slots], device: None }
    }

    /// Moves the values into `device` (their current values go up, the
    /// host copy is freed): from now on the layers run there.
    pub fn attach(&mut self, device: Arc<dyn DeviceStates>) -> Result<(), ModelError> {
        for (li, shape) in self.shapes.iter().enumerate() {
            let Some(s) = shape else { continue };
            let values = match &self.device {
                Some(old) => old.read(li, 0, s.len() * self.n_slots)?,
                None => std::mem::take(&mut self.data[li]),
            };
            device.write(li, 0, &values)?;
        }
        self.device = Some(device);
        Ok(())
    }

    /// The device holding the values, if any ([`StatePool::attach`]).
    pub fn device(&self) -> Option<&Arc<dyn DeviceStates>> {
        self.device.as_ref()
    }

    /// Bytes of one slot (one sequence's state in every owned layer).
    pub fn slot_bytes(&self) -> usize {
        self.shapes.iter().flatten().map(|s| s.len() * 4).sum()
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.slot_bytes() * self.n_slots
    }

    /// Positions slot `slot` has consumed.
    pub fn pos(&self, slot: usize) -> usize {
        self.pos[slot]
    }

    fn check(&self, slot: usize) -> Result<(), ModelError> {
        if slot < self.n_slots {
            return Ok(());
        }
        Err(ModelError::Unsupported(format!("state slot {slot} is outside the pool of {} slots", self.n_slots)))
    }

    /// Prepares slot `slot` for a step of `len` tokens at positions
    /// `start..`: a step from position 0 clears it; any other must continue
    /// exactly where the state stopped, or inside the slot's last verify
    /// step (its rejected rows are then taken back: each layer replays the
    /// accepted ones first). Then records the new position.
    pub fn begin_step(&mut self, slot: usize, start: usize, len: usize) -> Result<(), ModelError> {
        self.check(slot)?;
        let pos = self.pos[slot];
        if start == 0 {
            self.clear(slot)?;
        } else if pos != start && self.shapes.iter().any(Option::is_some) {
            // (A stage that owns no linear layer has nothing to take back.)
            let undo = &mut self.undo[slot];
            let back = |u: &LayerUndo| u.rows > 0 && u.start < start && u.start + u.rows == pos && start < pos;
            let linear = self.shapes.iter().map(Option::is_some);
            let ok = undo.len() == self.shapes.len() && linear.zip(undo.iter()).all(|(l, u)| !l || back(u));
            if !ok {
                return Err(ModelError::Unsupported(format!(
                    "the recurrent state of slot {slot} is at position {pos}, but the step starts at {start} \
                     (linear-attention states cannot be rewound; restore a snapshot)",
                )));
            }
            for (shape, u) in self.shapes.iter().zip(undo.iter_mut()) {
                if shape.is_some() {
                    u.replay = start - u.start;
                }
            }
        }
        self.pos[slot] = start + len;
        Ok(())
    }

    /// Layer `layer`'s (conv state, recurrent state, way back from the last
    /// verify step) of slot `slot`; `None` for an attention layer.
    pub fn layer_slot_undo(&mut self, layer: usize, slot: usize) -> Option<(&mut [f32], &mut [f32], &mut LayerUndo)> {
        let s = self.shapes.get(layer).copied().flatten()?;
        if self.device.is_some() {
            return None;
        }
        let undo = &mut self.undo[slot];
        if undo.is_empty() {
            undo.resize(self.shapes.len(), LayerUndo::default());
        }
        let all = &mut self.data[layer][slot * s.len()..(slot + 1) * s.len()];
        let (conv, rec) = all.split_at_mut(s.conv_len());
        Some((conv, rec, &mut undo[layer]))
    }

    /// Layer `layer`'s way-back marks of slot `slot` (first position, rows,
    /// rows to replay) when the values live on a device, which keeps the
    /// saved state and rows itself; `None` for an attention layer.
    pub fn undo_marks(&mut self, layer: usize, slot: usize) -> Option<&mut LayerUndo> {
        self.shapes.get(layer).copied().flatten()?;
        let undo = &mut self.undo[slot];
        if undo.is_empty() {
            undo.resize(self.shapes.len(), LayerUndo::default());
        }
        Some(&mut undo[layer])
    }

    /// Zeroes slot `slot` (a new sequence).
    pub fn clear(&mut self, slot: usize) -> Result<(), ModelError> {
        match &self.device {
            Some(dev) => {
                let lens = self.shapes.iter().enumerate().filter_map(|(li, s)| s.map(|s| (li, s.len())));
                dev.zero(&lens.map(|(li, n)| (li, slot * n, n)).collect::<Vec<_>>())?;
            }
            None => {
                for (shape, d) in self.shapes.iter().zip(&mut self.data) {
                    if let Some(s) = shape {
                        d[slot * s.len()..(slot + 1) * s.len()].fill(0.0);
                    }
                }
            }
        }
        self.pos[slot] = 0;
        self.undo[slot].iter_mut().for_each(LayerUndo::forget);
        Ok(())
    }

    /// Copies slot `from` (state and position) into slot `to`: taking a
    /// snapshot, or resuming from one.
    pub fn copy(&mut self, from: usize, to: usize) -> Result<(), ModelError> {
        self.check(from)?;
        self.check(to)?;
        if from == to {
            return Ok(());
        }
        match &self.device {
            Some(dev) => {
                let lens = self.shapes.iter().enumerate().filter_map(|(li, s)| s.map(|s| (li, s.len())));
                dev.copy(&lens.map(|(li, n)| (li, from * n, to * n, n)).collect::<Vec<_>>())?;
            }
            None => {
                for (shape, d) in self.shapes.iter().zip(&mut self.data) {
                    if let Some(s) = shape {
                        let n = s.len();
                        d.copy_within(from * n..(from + 1) * n, to * n);
                    }
                }
            }
        }
        self.pos[to] = self.pos[from];
        self.undo[to].iter_mut().for_each(LayerUndo::forget);
        Ok(())
    }

    /// Layer `layer`'s (conv state, recurrent state) of slot `slot`; `None`
    /// for an attention layer.
    pub fn layer_slot(&mut self, layer: usize, slot: usize) -> Option<(&mut [f32], &mut [f32])> {
        let s = self.shapes.get(layer).copied().flatten()?;
        if self.device.is_some() {
            return None;
        }
        let all = &mut self.data[layer][slot * s.len()..(slot + 1) * s.len()];
        Some(all.split_at_mut(s.conv_len()))
    }

    /// Slot `slot`'s state of every layer, concatenated (to send it to another
    /// process: preemption to host memory, or a cluster peer).
    pub fn save(&self, slot: usize) -> Result<Vec<f32>, ModelError> {
        self.check(slot)?;
        let mut out = Vec::with_capacity(self.slot_bytes() / 4);
        for (li, (shape, d)) in self.shapes.iter().zip(&self.data).enumerate() {
            if let Some(s) = shape {
                match &self.device {
                    Some(dev) => out.extend_from_slice(&dev.read(li, slot * s.len(), s.len())?),
                    None => out.extend_from_slice(&d[slot * s.len()..(slot + 1) * s.len()]),
                }
            }
        }
        Ok(out)
    }

    /// Writes back what [`StatePool::save`] returned, at position `pos`.
    pub fn load(&mut self, slot: usize, values: &[f32], pos: usize) -> Result<(), ModelError> {
        self.check(slot)?;
        if values.len() * 4 != self.slot_bytes() {
            return Err(ModelError::Unsupported(format!(
                "a saved state of {} values does not fit slots of {}",
                values.len(),
                self.slot_bytes() / 4
            )));
        }
        let mut at = 0;
        for (li, (shape, d)) in self.shapes.iter().zip(&mut self.data).enumerate() {
            if let Some(s) = shape {
                let n = s.len();
                match &self.device {
                    Some(dev) => dev.write(li, slot * n, &values[at..at + n])?,
                    None => d[slot * n..(slot + 1) * n].copy_from_slice(&values[at..at + n]),
                }
                at += n;
            }
        }
        self.pos[slot] = pos;
        self.undo[slot].iter_mut().for_each(LayerUndo::forget);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_clear_copy_and_refuse_a_rewind() {
        let shape = StateShape { conv_channels: 4, conv_kernel: 4, v_heads: 2, dk: 2, dv: 3 };
        let mut p = StatePool::new(vec![Some(shape), None, Some(shape)], 3);
        assert_eq!(p.slot_bytes(), 2 * (12 + 12) * 4);
        p.begin_step(1, 0, 5).unwrap();
        p.layer_slot(2, 1).unwrap().1[0] = 7.0;
        assert!(p.layer_slot(1, 1).is_none());
        p.copy(1, 2).unwrap();
        assert_eq!((p.pos(2), p.layer_slot(2, 2).unwrap().1[0]), (5, 7.0));
        assert!(p.begin_step(2, 3, 1).is_err(), "a rewind is refused");
        p.begin_step(2, 5, 1).unwrap();
        let saved = p.save(1).unwrap();
        p.load(0, &saved, 5).unwrap();
        assert_eq!(p.layer_slot(2, 0).unwrap().1[0], 7.0);
        p.begin_step(0, 0, 2).unwrap();
        assert_eq!(p.layer_slot(2, 0).unwrap().1[0], 0.0, "position 0 starts from zero");
        assert!(p.begin_step(3, 0, 1).is_err());
    }

    #[test]
    fn a_step_may_start_inside_the_last_verify_step_only() {
        let shape = StateShape { conv_channels: 2, conv_kernel: 2, v_heads: 1, dk: 1, dv: 1 };
        let mut p = StatePool::new(vec![None, Some(shape)], 2);
        p.begin_step(0, 0, 5).unwrap();
        assert!(p.layer_slot_undo(0, 0).is_none(), "an attention layer has no state");
        // A verify step of 4 rows from 5 (what the layer records when it runs one).
        p.begin_step(0, 5, 4).unwrap();
        let (_, _, u) = p.layer_slot_undo(1, 0).unwrap();
        (u.start, u.rows) = (5, 4);
        assert!(p.begin_step(0, 5, 1).is_err(), "the verify step's first row is always kept");
        assert!(p.begin_step(0, 4, 1).is_err(), "before the verify step");
        p.begin_step(0, 7, 1).unwrap();
        assert_eq!(p.layer_slot_undo(1, 0).unwrap().2.replay, 2, "rows 5 and 6 are replayed");
        assert_eq!(p.pos(0), 8);
        // Restoring a snapshot into the slot forgets its way back.
        p.layer_slot_undo(1, 0).unwrap().2.rows = 4;
        p.copy(1, 0).unwrap();
        assert_eq!(p.layer_slot_undo(1, 0).unwrap().2.rows, 0);
        // A stage without linear layers has nothing to take back.
        let mut attn_only = StatePool::new(vec![None], 1);
        attn_only.begin_step(0, 0, 9).unwrap();
        attn_only.begin_step(0, 7, 1).unwrap();
    }
}
