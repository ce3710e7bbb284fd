//! MiniMax-M2: `<invoke>` elements inside one `<minimax:tool_call>` group.
//!
//! ```text
//! <minimax:tool_call>
//! <invoke name="get_weather">
//! <parameter name="city">Paris</parameter>
//! </invoke>
//! </minimax:tool_call>
//! ```

use super::{ArgSyntax, Sectioned, Syntax, Tools};

pub const SYNTAX: Syntax = Syntax {
    open: "<minimax:tool_call>",
    close: "</minimax:tool_call>",
    call_open: "<invoke name=\"",
    name_end: &[("\">", true)],
    call_close: "</invoke>",
    args: ArgSyntax::Xml { open: "<parameter name=\"", name_end: "\">", value_open: "", close: "</parameter>" },
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
    fn two_invokes_in_one_group_split_everywhere() {
        let out = "Checking.\n<minimax:tool_call>\n<invoke name=\"get_weather\">\n<parameter name=\"city\">Paris</parameter>\n<parameter name=\"unit\">c</parameter>\n</invoke>\n<invoke name=\"search\">\n<parameter name=\"q\">café</parameter>\n</invoke>\n</minimax:tool_call>";
        let o = every_split(&make, out, &["<minimax", "<invoke", "<parameter", "</invoke>"]);
        assert_eq!(o.text, "Checking.\n");
        assert_eq!(o.calls.len(), 2);
        assert_eq!(o.calls[0].1, r#"{"city": "Paris", "unit": "c"}"#);
        assert_eq!(o.calls[1].1, r#"{"q": "café"}"#);
    }
}
