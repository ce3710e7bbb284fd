//! Reasoning text of models whose template has `<think>…</think>` (Qwen3,
//! DeepSeek-R1 distills): split from the answer so that APIs can return it as
//! `reasoning_content` (OpenAI) or `thinking` blocks (Anthropic).

const OPEN: &str = "<think>";
const CLOSE: &str = "</think>";

pub enum Part {
    Reasoning(String),
    Text(String),
}

pub struct ThinkSplitter {
    pending: String,
    in_think: bool,
    /// Only leading reasoning counts: after the first answer text, `<think>` is text.
    answered: bool,
}

impl ThinkSplitter {
    /// `in_think`: the prompt already opened the block (the template ends the
    /// generation prompt with `<think>`).
    pub fn new(in_think: bool) -> ThinkSplitter {
        ThinkSplitter { pending: String::new(), in_think, answered: false }
    }

    pub fn push(&mut self, text: &str, out: &mut Vec<Part>) {
        self.pending.push_str(text);
        loop {
            if self.in_think {
                if let Some(p) = self.pending.find(CLOSE) {
                    let r: String = self.pending.drain(..p + CLOSE.len()).take(p).collect();
                    push_part(out, Part::Reasoning(r));
                    self.in_think = false;
                    // The answer usually starts after a blank line.
                    self.pending = self.pending.trim_start().to_string();
                    continue;
                }
                let keep = held_back(&self.pending, CLOSE);
                let r: String = self.pending.drain(..self.pending.len() - keep).collect();
                push_part(out, Part::Reasoning(r));
                return;
            }
            if self.answered {
                let t = std::mem::take(&mut self.pending);
                push_part(out, Part::Text(t));
                return;
            }
            let trimmed = self.pending.trim_start();
            if let Some(rest) = trimmed.strip_prefix(OPEN) {
                self.pending = rest.to_string();
                self.in_think = true;
                continue;
            }
            if trimmed.is_empty() || OPEN.starts_with(trimmed) {
                return; // may still become `<think>`
            }
            self.answered = true;
        }
    }

    pub fn finish(&mut self, out: &mut Vec<Part>) {
        let rest = std::mem::take(&mut self.pending);
        if self.in_think {
            push_part(out, Part::Reasoning(rest));
        } else {
            push_part(out, Part::Text(rest));
        }
    }
}

fn push_part(out: &mut Vec<Part>, p: Part) {
    let empty = match &p {
        Part::Reasoning(s) | Part::Text(s) => s.is_empty(),
    };
    if !empty {
        out.push(p);
    }
}

/// Length of the longest suffix of `s` that starts `marker`.
fn held_back(s: &str, marker: &str) -> usize {
    (1..marker.len()).rev().find(|&k| s.ends_with(&marker[..k])).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(in_think: bool, chunks: &[&str]) -> (String, String) {
        let mut s = ThinkSplitter::new(in_think);
        let mut out = Vec::new();
        for c in chunks {
            s.push(c, &mut out);
        }
        s.finish(&mut out);
        let (mut r, mut t) = (String::new(), String::new());
        for p in out {
            match p {
                Part::Reasoning(x) => r.push_str(&x),
                Part::Text(x) => t.push_str(&x),
            }
        }
        (r, t)
    }

    #[test]
    fn splits_leading_think_block_across_chunks() {
        assert_eq!(run(false, &["<thi", "nk>hmm, 2+2", "</th", "ink>\n\n4"]), ("hmm, 2+2".into(), "4".into()));
        assert_eq!(run(true, &["so 4", "</think>", "Four."]), ("so 4".into(), "Four.".into()));
        assert_eq!(run(false, &["No thinking <think> here"]), (String::new(), "No thinking <think> here".into()));
    }
}
