//! Splitting text around special-token strings, as llama.cpp's
//! `tokenizer_st_partition` does: the longest special tokens are cut out first,
//! each one at every non-overlapping occurrence, left to right.

/// A run of plain text or a special token found in the input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Fragment<'a> {
    Text(&'a str),
    Token(u32),
}

/// Special token strings in the order llama.cpp tries them (longest first).
#[derive(Debug, Clone, Default)]
pub(crate) struct SpecialMatcher {
    tokens: Vec<(String, u32)>,
}

impl SpecialMatcher {
    pub(crate) fn new(mut tokens: Vec<(String, u32)>) -> Self {
        tokens.retain(|(text, _)| !text.is_empty());
        tokens.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then(a.1.cmp(&b.1)));
        SpecialMatcher { tokens }
    }

    pub(crate) fn split<'a>(&self, text: &'a str) -> Vec<Fragment<'a>> {
        if text.is_empty() {
            return Vec::new();
        }
        let mut frags = vec![Fragment::Text(text)];
        for (special, id) in &self.tokens {
            if !frags.iter().any(|f| matches!(f, Fragment::Text(t) if t.contains(special.as_str()))) {
                continue;
            }
            let mut next = Vec::with_capacity(frags.len() + 2);
            for frag in frags {
                let Fragment::Text(mut rest) = frag else {
                    next.push(frag);
                    continue;
                };
                while let Some(pos) = rest.find(special.as_str()) {
                    if pos > 0 {
                        next.push(Fragment::Text(&rest[..pos]));
                    }
                    next.push(Fragment::Token(*id));
                    rest = &rest[pos + special.len()..];
                }
                if !rest.is_empty() {
                    next.push(Fragment::Text(rest));
                }
            }
            frags = next;
        }
        frags
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Fragment::*;

    #[test]
    fn longest_first() {
        let m = SpecialMatcher::new(vec![("<s>".into(), 1), ("</s>".into(), 2), ("<s><s>".into(), 9)]);
        assert_eq!(m.split("a<s><s>b</s><s>"), vec![Text("a"), Token(9), Text("b"), Token(2), Token(1)]);
        assert_eq!(m.split(""), vec![]);
        assert_eq!(m.split("plain"), vec![Text("plain")]);
    }
}
