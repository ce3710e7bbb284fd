//! Qwen3-Coder and Qwen3.5/3.6: XML calls, values as raw text typed by the schema.
//!
//! ```text
//! <tool_call>
//! <function=get_weather>
//! <parameter=city>
//! Paris
//! </parameter>
//! </function>
//! </tool_call>
//! ```

use super::{ArgSyntax, Sectioned, Syntax, Tools};

pub const SYNTAX: Syntax = Syntax {
    open: "<tool_call>",
    close: "</tool_call>",
    call_open: "<function=",
    name_end: &[(">", true)],
    call_close: "</function>",
    args: ArgSyntax::Xml { open: "<parameter=", name_end: ">", value_open: "", close: "</parameter>" },
    name_prefix: "",
    name_cut: None,
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

    const MARKUP: &[&str] = &["<tool_call>", "<function", "<parameter", "</parameter>", "</tool_call>"];

    fn make() -> Box<dyn CallParser> {
        Box::new(parser(weather_tools()))
    }

    #[test]
    fn text_then_two_calls_split_everywhere() {
        let out = "Let me check.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nSan Francisco, \"CA\"\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=search>\n<parameter=q>\na < b\nand more\n</parameter>\n</function>\n</tool_call>";
        let o = every_split(&make, out, MARKUP);
        assert_eq!(o.text, "Let me check.\n\n");
        assert_eq!(o.calls.len(), 2);
        assert_eq!(o.calls[0].0, "get_weather");
        let args: serde_json::Value = serde_json::from_str(&o.calls[0].1).expect("json");
        assert_eq!(args, serde_json::json!({"city": "San Francisco, \"CA\"", "days": 3}));
        let args: serde_json::Value = serde_json::from_str(&o.calls[1].1).expect("json");
        assert_eq!(args, serde_json::json!({"q": "a < b\nand more"}));
        assert!(o.calls.iter().all(|c| c.2));
    }

    #[test]
    fn a_negative_zero_integer_stays_an_integer() {
        // serde_json reads "-0" as the float -0.0; the argument keeps the text.
        let out = "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n-0\n</parameter>\n</function>\n</tool_call>";
        let o = every_split(&make, out, MARKUP);
        assert_eq!(o.calls.len(), 1);
        assert!(o.calls[0].1.contains("\"days\": -0}"), "{}", o.calls[0].1);
        assert!(!o.calls[0].1.contains("-0.0"), "{}", o.calls[0].1);
    }

    #[test]
    fn unknown_function_and_unclosed_markup_are_text() {
        let out = "<tool_call>\n<function=rm_rf>\n</function>\n</tool_call>";
        let o = every_split(&make, out, &[]);
        assert!(o.calls.is_empty());
        assert!(o.text.contains("<function=rm_rf>"));
        let o = every_split(&make, "<tool_call>\n<function=search>\n<parameter=q>\nab", &[]);
        assert_eq!(o.calls.len(), 1);
        assert!(!o.calls[0].2, "an unclosed value fails the call");
    }

    #[test]
    fn call_without_parameters() {
        let o = every_split(&make, "<tool_call><function=search></function></tool_call>", MARKUP);
        assert_eq!(o.calls, vec![("search".to_string(), "{}".to_string(), true)]);
    }
}
