//! GLM-4.5/4.6/4.7: the name right after `<tool_call>`, then key/value pairs.
//!
//! ```text
//! <tool_call>get_weather
//! <arg_key>city</arg_key>
//! <arg_value>Paris</arg_value>
//! </tool_call>
//! ```

use super::{ArgSyntax, Sectioned, Syntax, Tools};

pub const SYNTAX: Syntax = Syntax {
    open: "<tool_call>",
    close: "</tool_call>",
    call_open: "",
    name_end: &[("\n", true), ("<arg_key>", false), ("</tool_call>", false)],
    call_close: "",
    args: ArgSyntax::Xml {
        open: "<arg_key>",
        name_end: "</arg_key>",
        value_open: "<arg_value>",
        close: "</arg_value>",
    },
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

    fn make() -> Box<dyn CallParser> {
        Box::new(parser(weather_tools()))
    }

    #[test]
    fn calls_split_everywhere() {
        let out = "ok <tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n<arg_key>days</arg_key>\n<arg_value>2</arg_value>\n</tool_call><tool_call>search<arg_key>q</arg_key><arg_value>x</arg_value></tool_call>";
        let o = every_split(&make, out, &["<tool_call>", "<arg_", "</arg", "</tool_call>"]);
        assert_eq!(o.text, "ok ");
        assert_eq!(o.calls.len(), 2);
        let a: serde_json::Value = serde_json::from_str(&o.calls[0].1).expect("json");
        assert_eq!(a, serde_json::json!({"city": "Paris", "days": 2}));
        assert_eq!(o.calls[1].1, r#"{"q": "x"}"#);
        let o = every_split(&make, "<tool_call>search</tool_call>", &[]);
        assert_eq!(o.calls, vec![("search".into(), "{}".into(), true)]);
    }

    #[test]
    fn garbage_between_parameters_is_text() {
        let o = every_split(&make, "<tool_call>search\nhello</tool_call>", &[]);
        assert_eq!(o.calls.len(), 1);
        assert!(!o.calls[0].2);
    }
}
