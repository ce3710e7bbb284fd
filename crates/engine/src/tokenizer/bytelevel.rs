//! GPT-2 byte-level alphabet: every byte has a printable stand-in character, so a
//! byte-level BPE vocabulary can store arbitrary byte strings as text.

use std::collections::HashMap;
use std::sync::OnceLock;

/// The character that stands for each byte (`bytes_to_unicode` in GPT-2's encoder.py).
pub(crate) fn byte_to_char() -> &'static [char; 256] {
    static TABLE: OnceLock<[char; 256]> = OnceLock::new();
    TABLE.get_or_init(|| {
        let mut table = ['\0'; 256];
        let printable = |b: u32| (0x21..=0x7E).contains(&b) || (0xA1..=0xAC).contains(&b) || (0xAE..=0xFF).contains(&b);
        let mut next = 256u32;
        for b in 0..256u32 {
            let cp = if printable(b) {
                b
            } else {
                let cp = next;
                next += 1;
                cp
            };
            table[b as usize] = char::from_u32(cp).expect("valid code point");
        }
        table
    })
}

/// Inverse of [`byte_to_char`].
pub(crate) fn char_to_byte() -> &'static HashMap<char, u8> {
    static MAP: OnceLock<HashMap<char, u8>> = OnceLock::new();
    MAP.get_or_init(|| byte_to_char().iter().enumerate().map(|(b, &c)| (c, b as u8)).collect())
}

/// The bytes a byte-level token stands for. Characters outside the alphabet (which a
/// well-formed vocabulary does not have) are kept as their UTF-8 encoding.
pub(crate) fn token_to_bytes(token: &str) -> Vec<u8> {
    let map = char_to_byte();
    let mut out = Vec::with_capacity(token.len());
    for c in token.chars() {
        match map.get(&c) {
            Some(&b) => out.push(b),
            None => {
                let mut buf = [0u8; 4];
                out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
            }
        }
    }
    out
}

/// The bytes of a SentencePiece piece: `<0xNN>` is one raw byte, `▁` is a space.
pub(crate) fn sentencepiece_to_bytes(piece: &str) -> Vec<u8> {
    if let Some(b) = parse_byte_token(piece) {
        return vec![b];
    }
    piece.replace('\u{2581}', " ").into_bytes()
}

/// Parses a `<0xNN>` byte token.
pub(crate) fn parse_byte_token(piece: &str) -> Option<u8> {
    let hex = piece.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alphabet_round_trips() {
        let table = byte_to_char();
        assert_eq!(table[b' ' as usize], 'Ġ');
        assert_eq!(table[b'\n' as usize], 'Ċ');
        assert_eq!(table[b'A' as usize], 'A');
        let all: String = table.iter().collect();
        assert_eq!(token_to_bytes(&all), (0..=255u8).collect::<Vec<_>>());
    }

    #[test]
    fn sentencepiece_pieces() {
        assert_eq!(sentencepiece_to_bytes("▁Hello"), b" Hello");
        assert_eq!(sentencepiece_to_bytes("<0x0A>"), b"\n");
        assert_eq!(sentencepiece_to_bytes("<0xe2>"), vec![0xE2]);
        assert_eq!(parse_byte_token("<0x1>"), None);
    }
}
