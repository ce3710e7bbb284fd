//! Kimi K2: `functions.NAME:IDX` then the JSON arguments, inside a section.
//!
//! ```text
//! <|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{"city": "Paris"}<|tool_call_end|><|tool_calls_section_end|>
//! ```

use super::{ArgSyntax, Sectioned, Syntax, Tools};

pub const SYNTAX: Syntax = Syntax {
    open: "<|tool_calls_section_begin|>",
    close: "<|tool_calls_section_end|>",
    call_open: "<|tool_call_begin|>",
    name_end: &[("<|tool_call_argument_begin|>", true)],
    call_close: "<|tool_call_end|>",
    args: ArgSyntax::Json { end: "" },
    name_prefix: "functions.",
    name_cut: Some(':'),
    typed_header: None,
};

pub fn parser(tools: Tools) -> Sectioned {
    Sectioned::new(SYNTAX, tools)
}

#[cfg(test)]
mod tests {
    use super::super::testing::{every_split, weather_tools};
    use super::super::CallParser;
    use super::*;

    fn make() -> Box<dyn CallParser> {
        Box::new(parser(weather_tools()))
    }

    #[test]
    fn two_calls_split_everywhere() {
        let out = "On it. <|tool_calls_section_begin|> <|tool_call_begin|>functions.get_weather:0 <|tool_call_argument_begin|> {\"city\": \"Paris\"} <|tool_call_end|> <|tool_call_begin|>functions.search:1<|tool_call_argument_begin|>{\"q\": \"}\"}<|tool_call_end|> <|tool_calls_section_end|>";
        let o = every_split(&make, out, &["<|tool", "|>"]);
        assert_eq!(o.text, "On it. ");
        assert_eq!(
            o.calls,
            vec![
                ("get_weather".into(), r#"{"city": "Paris"}"#.into(), true),
                ("search".into(), r#"{"q": "}"}"#.into(), true)
            ]
        );
    }
}
