//! DeepSeek: V3/R1 write a typed header and a fenced JSON block, V3.1+ the name
//! and the JSON; one parser reads both.
//!
//! ```text
//! <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather
//! ```json
//! {"city": "Paris"}
//! ```<｜tool▁call▁end｜><｜tool▁calls▁end｜>                      (V3, R1)
//! <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Paris"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>  (V3.1+)
//! ```

use super::{ArgSyntax, Sectioned, Syntax, Tools};

pub const CALLS_BEGIN: &str = "<｜tool▁calls▁begin｜>";
pub const CALLS_END: &str = "<｜tool▁calls▁end｜>";
pub const CALL_BEGIN: &str = "<｜tool▁call▁begin｜>";
pub const CALL_END: &str = "<｜tool▁call▁end｜>";
pub const SEP: &str = "<｜tool▁sep｜>";

pub const SYNTAX: Syntax = Syntax {
    open: CALLS_BEGIN,
    close: CALLS_END,
    call_open: CALL_BEGIN,
    name_end: &[(SEP, true)],
    call_close: CALL_END,
    args: ArgSyntax::Json { end: "" },
    name_prefix: "",
    name_cut: None,
    typed_header: Some(("function", "```json", "```")),
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

    const MARKUP: &[&str] = &["<｜tool", "tool▁", "```"];

    #[test]
    fn v3_fenced_and_v31_plain_forms() {
        let v3 = "Sure<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Paris\"}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>search\n```json\n{\"q\": \"a\"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
        let o = every_split(&make, v3, MARKUP);
        assert_eq!(o.text, "Sure");
        assert_eq!(o.calls.len(), 2);
        assert_eq!(o.calls[0], ("get_weather".into(), r#"{"city": "Paris"}"#.into(), true));
        let v31 = "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \"Oslo\", \"days\": 1}<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
        let o = every_split(&make, v31, MARKUP);
        assert_eq!(o.calls, vec![("get_weather".into(), r#"{"city": "Oslo", "days": 1}"#.into(), true)]);
    }

    #[test]
    fn invalid_json_fails_the_call() {
        let o = every_split(
            &make,
            "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>search<｜tool▁sep｜>{q: 1}<｜tool▁call▁end｜>",
            &[],
        );
        assert_eq!(o.calls.len(), 1);
        assert!(!o.calls[0].2);
    }
}
