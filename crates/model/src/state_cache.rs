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

use crate::ModelError;

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
#[derive(Debug, Clone)]
pub struct StatePool {
    /// Per owned layer: its state shape, `None` for an attention layer.
    pub shapes: Vec<Option<StateShape>>,
    pub n_slots: usize,
    /// Per owned layer: `n_slots × shape.len()` floats, conv then recurrent
    /// state in each slot (empty for attention layers).
    data: Vec<Vec<f32>>,
    /// Per slot: positions the state has consumed (the next position).
    pos: Vec<usize>,
}

impl StatePool {
    pub fn new(shapes: Vec<Option<StateShape>>, n_slots: usize) -> StatePool {
        let data = shapes.iter().map(|s| vec![0f32; s.map_or(0, |s| s.len()) * n_slots]).collect();
        StatePool { shapes, n_slots, data, pos: vec![0; n_slots] }
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
    /// exactly where the state stopped. Then records the new position.
    pub fn begin_step(&mut self, slot: usize, start: usize, len: usize) -> Result<(), ModelError> {
        self.check(slot)?;
        if start == 0 {
            self.clear(slot);
        } else if self.pos[slot] != start {
            return Err(ModelError::Unsupported(format!(
                "the recurrent state of slot {slot} is at position {}, but the step starts at {start} \
                 (linear-attention states cannot be rewound; restore a snapshot)",
                self.pos[slot]
            )));
        }
        self.pos[slot] = start + len;
        Ok(())
    }

    /// Zeroes slot `slot` (a new sequence).
    pub fn clear(&mut self, slot: usize) {
        for (shape, d) in self.shapes.iter().zip(&mut self.data) {
            if let Some(s) = shape {
                d[slot * s.len()..(slot + 1) * s.len()].fill(0.0);
            }
        }
        self.pos[slot] = 0;
    }

    /// Copies slot `from` (state and position) into slot `to`: taking a
    /// snapshot, or resuming from one.
    pub fn copy(&mut self, from: usize, to: usize) -> Result<(), ModelError> {
        self.check(from)?;
        self.check(to)?;
        if from == to {
            return Ok(());
        }
        for (shape, d) in self.shapes.iter().zip(&mut self.data) {
            if let Some(s) = shape {
                let n = s.len();
                d.copy_within(from * n..(from + 1) * n, to * n);
            }
        }
        self.pos[to] = self.pos[from];
        Ok(())
    }

    /// Layer `layer`'s (conv state, recurrent state) of slot `slot`; `None`
    /// for an attention layer.
    pub fn layer_slot(&mut self, layer: usize, slot: usize) -> Option<(&mut [f32], &mut [f32])> {
        let s = self.shapes.get(layer).copied().flatten()?;
        let all = &mut self.data[layer][slot * s.len()..(slot + 1) * s.len()];
        Some(all.split_at_mut(s.conv_len()))
    }

    /// Slot `slot`'s state of every layer, concatenated (to send it to another
    /// process: preemption to host memory, or a cluster peer).
    pub fn save(&self, slot: usize) -> Vec<f32> {
        let mut out = Vec::with_capacity(self.slot_bytes() / 4);
        for (shape, d) in self.shapes.iter().zip(&self.data) {
            if let Some(s) = shape {
                out.extend_from_slice(&d[slot * s.len()..(slot + 1) * s.len()]);
            }
        }
        out
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
        for (shape, d) in self.shapes.iter().zip(&mut self.data) {
            if let Some(s) = shape {
                let n = s.len();
                d[slot * n..(slot + 1) * n].copy_from_slice(&values[at..at + n]);
                at += n;
            }
        }
        self.pos[slot] = pos;
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
        let saved = p.save(1);
        p.load(0, &saved, 5).unwrap();
        assert_eq!(p.layer_slot(2, 0).unwrap().1[0], 7.0);
        p.begin_step(0, 0, 2).unwrap();
        assert_eq!(p.layer_slot(2, 0).unwrap().1[0], 0.0, "position 0 starts from zero");
        assert!(p.begin_step(3, 0, 1).is_err());
    }
}
