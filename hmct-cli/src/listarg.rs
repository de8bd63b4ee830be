//! List arguments as the seeds write them on the command line.
//!
//! Accepted forms (whitespace is allowed around every item and bracket):
//! - `['Conv_2','Conv_90']`, `["a", "b"]`: Python-style lists of quoted names;
//! - `[Conv_2,Conv_90]`: the same list after the shell ate the quotes;
//! - `[['Conv_2'],['Conv_2','Conv_90']]`: a list of groups;
//! - `[a,[b,c]]`: a mixed list, read as groups where each bare element is a group of
//!   one (`[[a],[b,c]]`);
//! - `Conv_2` or `'Conv_2'`: a single name, read as a one-element list;
//! - `[]`: an empty list. A trailing comma (`[a,b,]`) is accepted, as Python does.
//!
//! An unquoted name runs up to whitespace or one of `[ ] , ' "`, so names such as
//! `/encoder/_blocks.0/Mul`, `a:0` or `x-y` need no quotes. Any other name can be
//! quoted with `'` or `"`; inside quotes a backslash makes the next character literal
//! (`'it\'s'`, `'a\\b'`). Empty names, unbalanced brackets, unterminated quotes, a
//! third level of brackets and anything after the value are errors that carry the
//! input and the position. The parser never panics.

use std::fmt;

/// A parsed list argument.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ListArg {
    /// A plain list of names (also a single bare name, and `[]`).
    Flat(Vec<String>),
    /// A list of groups of names; bare elements of a mixed list became groups of one.
    Nested(Vec<Vec<String>>),
}

impl ListArg {
    /// True for the list-of-groups form.
    pub fn is_nested(&self) -> bool {
        matches!(self, ListArg::Nested(_))
    }

    /// Every name in order of appearance (for checking them against the model).
    pub fn names(&self) -> Vec<&str> {
        match self {
            ListArg::Flat(names) => names.iter().map(String::as_str).collect(),
            ListArg::Nested(groups) => groups.iter().flatten().map(String::as_str).collect(),
        }
    }

    /// The names of a flat list; `None` for the nested form.
    pub fn as_flat(&self) -> Option<&[String]> {
        match self {
            ListArg::Flat(names) => Some(names),
            ListArg::Nested(_) => None,
        }
    }

    /// The groups, a flat list giving one group per name.
    pub fn into_groups(self) -> Vec<Vec<String>> {
        match self {
            ListArg::Flat(names) => names.into_iter().map(|n| vec![n]).collect(),
            ListArg::Nested(groups) => groups,
        }
    }
}

/// Writes a name in single quotes with `\` and `'` escaped.
fn write_quoted(f: &mut fmt::Formatter<'_>, name: &str) -> fmt::Result {
    f.write_str("'")?;
    for c in name.chars() {
        if c == '\\' || c == '\'' {
            f.write_str("\\")?;
        }
        write!(f, "{c}")?;
    }
    f.write_str("'")
}

fn write_names(f: &mut fmt::Formatter<'_>, names: &[String]) -> fmt::Result {
    f.write_str("[")?;
    for (i, name) in names.iter().enumerate() {
        if i > 0 {
            f.write_str(",")?;
        }
        write_quoted(f, name)?;
    }
    f.write_str("]")
}

/// The canonical form: every name single-quoted, no spaces (`['a','b']`,
/// `[['a'],['a','b']]`). `parse_list` gives back the same value for any list whose
/// names are non-empty, except `Nested(vec![])`, which prints as `[]` like an empty
/// flat list (parsing never produces it).
impl fmt::Display for ListArg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ListArg::Flat(names) => write_names(f, names),
            ListArg::Nested(groups) => {
                f.write_str("[")?;
                for (i, group) in groups.iter().enumerate() {
                    if i > 0 {
                        f.write_str(",")?;
                    }
                    write_names(f, group)?;
                }
                f.write_str("]")
            }
        }
    }
}

/// What is wrong with a list argument.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ListArgErrorKind {
    #[error("the value is empty")]
    Empty,
    #[error("this '[' is never closed")]
    Unclosed,
    #[error("']' without a matching '['")]
    UnexpectedClose,
    #[error("this quote is never closed")]
    UnterminatedQuote,
    #[error("empty name")]
    EmptyName,
    #[error("expected a name, found {}", describe(*.0))]
    ExpectedName(Option<char>),
    #[error("expected ',' or ']', found {}", describe(*.0))]
    ExpectedSeparator(Option<char>),
    #[error("lists nest at most two levels deep")]
    TooDeep,
    #[error("unexpected {} after the value (put several names in [ ])", describe(Some(*.0)))]
    TrailingInput(char),
}

fn describe(c: Option<char>) -> String {
    match c {
        Some(c) => format!("{c:?}"),
        None => "the end of the value".to_string(),
    }
}

/// A malformed list argument: the input, the 0-based character position of the
/// problem, and what the problem is.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid list argument `{input}`: {kind} (at character {})", .position + 1)]
pub struct ListArgError {
    pub input: String,
    /// 0-based index in characters (not bytes) into `input`; may equal its length
    /// when the input ended too early.
    pub position: usize,
    pub kind: ListArgErrorKind,
}

impl ListArgError {
    /// The input and a `^` under the offending character, for the terminal.
    pub fn caret_lines(&self) -> String {
        format!("{}\n{}^", self.input, " ".repeat(self.position))
    }
}

/// A boolean argument that is none of the accepted spellings.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid boolean `{input}`: expected True, False, true, false, 1 or 0")]
pub struct BoolArgError {
    pub input: String,
}

/// Parses `True`/`False`/`true`/`false`/`1`/`0` (surrounding whitespace and other
/// letter cases such as `TRUE` are tolerated).
pub fn parse_bool(input: &str) -> Result<bool, BoolArgError> {
    let value = input.trim();
    if value == "1" || value.eq_ignore_ascii_case("true") {
        Ok(true)
    } else if value == "0" || value.eq_ignore_ascii_case("false") {
        Ok(false)
    } else {
        Err(BoolArgError {
            input: input.to_string(),
        })
    }
}

/// Parses one list argument (see the module docs for the accepted forms).
pub fn parse_list(input: &str) -> Result<ListArg, ListArgError> {
    let mut parser = Parser {
        input,
        chars: input.chars().collect(),
        pos: 0,
    };
    parser.skip_whitespace();
    let value = match parser.peek() {
        None => return Err(parser.error(ListArgErrorKind::Empty)),
        Some(']') => return Err(parser.error(ListArgErrorKind::UnexpectedClose)),
        Some('[') => parser.outer_list()?,
        Some(_) => ListArg::Flat(vec![parser.name()?]),
    };
    parser.skip_whitespace();
    match parser.peek() {
        None => Ok(value),
        Some(']') => Err(parser.error(ListArgErrorKind::UnexpectedClose)),
        Some(c) => Err(parser.error(ListArgErrorKind::TrailingInput(c))),
    }
}

/// An element of the outer list before we know whether the list is nested.
enum Element {
    Name(String),
    Group(Vec<String>),
}

struct Parser<'a> {
    input: &'a str,
    chars: Vec<char>,
    pos: usize,
}

impl Parser<'_> {
    fn peek(&self) -> Option<char> {
        self.chars.get(self.pos).copied()
    }

    fn skip_whitespace(&mut self) {
        while self.peek().is_some_and(char::is_whitespace) {
            self.pos += 1;
        }
    }

    fn error(&self, kind: ListArgErrorKind) -> ListArgError {
        self.error_at(self.pos, kind)
    }

    fn error_at(&self, position: usize, kind: ListArgErrorKind) -> ListArgError {
        ListArgError {
            input: self.input.to_string(),
            position,
            kind,
        }
    }

    /// `[` elements `]` where an element is a name or a group.
    fn outer_list(&mut self) -> Result<ListArg, ListArgError> {
        let elements = self.bracketed(|p| match p.peek() {
            Some('[') => Ok(Element::Group(p.bracketed(|p| match p.peek() {
                Some('[') => Err(p.error(ListArgErrorKind::TooDeep)),
                _ => p.name(),
            })?)),
            _ => p.name().map(Element::Name),
        })?;
        if elements.iter().all(|e| matches!(e, Element::Name(_))) {
            let names = elements
                .into_iter()
                .filter_map(|e| match e {
                    Element::Name(n) => Some(n),
                    Element::Group(_) => None,
                })
                .collect();
            return Ok(ListArg::Flat(names));
        }
        let groups = elements
            .into_iter()
            .map(|e| match e {
                Element::Name(n) => vec![n],
                Element::Group(g) => g,
            })
            .collect();
        Ok(ListArg::Nested(groups))
    }

    /// `[` item (`,` item)* `,`? `]`, the current character being `[`.
    fn bracketed<T>(
        &mut self,
        mut item: impl FnMut(&mut Self) -> Result<T, ListArgError>,
    ) -> Result<Vec<T>, ListArgError> {
        let open = self.pos;
        self.pos += 1;
        let mut items = Vec::new();
        self.skip_whitespace();
        if self.peek() == Some(']') {
            self.pos += 1;
            return Ok(items);
        }
        loop {
            if self.peek().is_none() {
                return Err(self.error_at(open, ListArgErrorKind::Unclosed));
            }
            items.push(item(self)?);
            self.skip_whitespace();
            match self.peek() {
                Some(']') => {
                    self.pos += 1;
                    return Ok(items);
                }
                Some(',') => {
                    self.pos += 1;
                    self.skip_whitespace();
                    if self.peek() == Some(']') {
                        self.pos += 1;
                        return Ok(items);
                    }
                }
                None => return Err(self.error_at(open, ListArgErrorKind::Unclosed)),
                found => return Err(self.error(ListArgErrorKind::ExpectedSeparator(found))),
            }
        }
    }

    /// A quoted or bare name.
    fn name(&mut self) -> Result<String, ListArgError> {
        match self.peek() {
            Some(quote @ ('\'' | '"')) => self.quoted(quote),
            _ => self.bare(),
        }
    }

    fn quoted(&mut self, quote: char) -> Result<String, ListArgError> {
        let open = self.pos;
        self.pos += 1;
        let mut name = String::new();
        loop {
            match self.peek() {
                None => return Err(self.error_at(open, ListArgErrorKind::UnterminatedQuote)),
                Some(c) if c == quote => {
                    self.pos += 1;
                    break;
                }
                Some('\\') => {
                    let Some(&escaped) = self.chars.get(self.pos + 1) else {
                        return Err(self.error_at(open, ListArgErrorKind::UnterminatedQuote));
                    };
                    name.push(escaped);
                    self.pos += 2;
                }
                Some(c) => {
                    name.push(c);
                    self.pos += 1;
                }
            }
        }
        if name.is_empty() {
            return Err(self.error_at(open, ListArgErrorKind::EmptyName));
        }
        Ok(name)
    }

    fn bare(&mut self) -> Result<String, ListArgError> {
        let start = self.pos;
        while let Some(c) = self.peek() {
            if c.is_whitespace() || matches!(c, '[' | ']' | ',' | '\'' | '"') {
                break;
            }
            self.pos += 1;
        }
        if self.pos == start {
            return Err(self.error(ListArgErrorKind::ExpectedName(self.peek())));
        }
        Ok(self.chars[start..self.pos].iter().collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn flat(names: &[&str]) -> ListArg {
        ListArg::Flat(names.iter().map(|n| n.to_string()).collect())
    }

    fn nested(groups: &[&[&str]]) -> ListArg {
        ListArg::Nested(
            groups
                .iter()
                .map(|g| g.iter().map(|n| n.to_string()).collect())
                .collect(),
        )
    }

    fn kind_at(input: &str) -> (ListArgErrorKind, usize) {
        let err = parse_list(input).unwrap_err();
        assert_eq!(err.input, input);
        (err.kind, err.position)
    }

    #[test]
    fn seed_forms() {
        let both = flat(&["Conv_2", "Conv_90"]);
        assert_eq!(parse_list("['Conv_2','Conv_90']").unwrap(), both);
        assert_eq!(parse_list("[Conv_2,Conv_90]").unwrap(), both);
        assert_eq!(parse_list(r#"["Conv_2", "Conv_90"]"#).unwrap(), both);
        assert_eq!(parse_list("  [ 'Conv_2' ,\tConv_90 ]  ").unwrap(), both);
        assert_eq!(
            parse_list("[['Conv_2'],['Conv_2','Conv_90']]").unwrap(),
            nested(&[&["Conv_2"], &["Conv_2", "Conv_90"]])
        );
        assert_eq!(
            parse_list("[[Conv_2], [Conv_9, Conv_2]]").unwrap(),
            nested(&[&["Conv_2"], &["Conv_9", "Conv_2"]])
        );
        assert_eq!(
            parse_list("['weight','activation']").unwrap(),
            flat(&["weight", "activation"])
        );
        assert_eq!(
            parse_list("['cosine-similarity','mse']").unwrap(),
            flat(&["cosine-similarity", "mse"])
        );
    }

    #[test]
    fn single_names() {
        assert_eq!(parse_list("Conv_2").unwrap(), flat(&["Conv_2"]));
        assert_eq!(parse_list(" 'Conv_2' ").unwrap(), flat(&["Conv_2"]));
        assert_eq!(parse_list("\"a b\"").unwrap(), flat(&["a b"]));
    }

    #[test]
    fn names_with_path_characters_need_no_quotes() {
        assert_eq!(
            parse_list("[/encoder/_blocks.0/Mul, 471_HzCalibration, a:0, x-y]").unwrap(),
            flat(&["/encoder/_blocks.0/Mul", "471_HzCalibration", "a:0", "x-y"])
        );
        assert_eq!(
            parse_list("/encoder/_blocks.0/Mul").unwrap(),
            flat(&["/encoder/_blocks.0/Mul"])
        );
    }

    #[test]
    fn quoting_and_escapes() {
        assert_eq!(
            parse_list(r"['it\'s', 'a\\b', 'x,y]', '[z']").unwrap(),
            flat(&["it's", r"a\b", "x,y]", "[z"])
        );
        assert_eq!(
            parse_list(r#"["say 'hi'", 'say "hi"']"#).unwrap(),
            flat(&["say 'hi'", "say \"hi\""])
        );
        // Quotes keep whitespace exactly.
        assert_eq!(parse_list("[' a ']").unwrap(), flat(&[" a "]));
    }

    #[test]
    fn empty_lists_and_trailing_commas() {
        assert_eq!(parse_list("[]").unwrap(), flat(&[]));
        assert_eq!(parse_list("[ ]").unwrap(), flat(&[]));
        assert_eq!(parse_list("[a,b,]").unwrap(), flat(&["a", "b"]));
        assert_eq!(parse_list("[[a],]").unwrap(), nested(&[&["a"]]));
        assert_eq!(parse_list("[[]]").unwrap(), nested(&[&[]]));
    }

    #[test]
    fn mixed_lists_make_singleton_groups() {
        assert_eq!(
            parse_list("[a,[b,c]]").unwrap(),
            nested(&[&["a"], &["b", "c"]])
        );
        assert_eq!(
            parse_list("[[b,c], 'a']").unwrap(),
            nested(&[&["b", "c"], &["a"]])
        );
    }

    #[test]
    fn errors_name_the_problem_and_its_position() {
        use ListArgErrorKind::*;
        assert_eq!(kind_at(""), (Empty, 0));
        assert_eq!(kind_at("   "), (Empty, 3));
        assert_eq!(kind_at("[a,b"), (Unclosed, 0));
        assert_eq!(kind_at("[[a],[b"), (Unclosed, 5));
        assert_eq!(kind_at("["), (Unclosed, 0));
        assert_eq!(kind_at("[a]]"), (UnexpectedClose, 3));
        assert_eq!(kind_at("]"), (UnexpectedClose, 0));
        assert_eq!(kind_at("['a"), (UnterminatedQuote, 1));
        assert_eq!(kind_at(r"['a\"), (UnterminatedQuote, 1));
        assert_eq!(kind_at("['a',\"b]"), (UnterminatedQuote, 5));
        assert_eq!(kind_at("['']"), (EmptyName, 1));
        assert_eq!(kind_at("[a,,b]"), (ExpectedName(Some(',')), 3));
        assert_eq!(kind_at("[,]"), (ExpectedName(Some(',')), 1));
        assert_eq!(kind_at(","), (ExpectedName(Some(',')), 0));
        assert_eq!(kind_at("[a b]"), (ExpectedSeparator(Some('b')), 3));
        assert_eq!(kind_at("['a''b']"), (ExpectedSeparator(Some('\'')), 4));
        assert_eq!(kind_at("[[[a]]]"), (TooDeep, 2));
        assert_eq!(kind_at("[a] x"), (TrailingInput('x'), 4));
        assert_eq!(kind_at("Conv_2,Conv_90"), (TrailingInput(','), 6));
        assert_eq!(kind_at("Conv_2 Conv_90"), (TrailingInput('C'), 7));
    }

    #[test]
    fn positions_count_characters_not_bytes() {
        let err = parse_list("['é', ,]").unwrap_err();
        assert_eq!(err.position, 6);
        assert_eq!(err.caret_lines(), "['é', ,]\n      ^");
    }

    #[test]
    fn error_message_shows_input_and_position() {
        let msg = parse_list("[a,,b]").unwrap_err().to_string();
        assert_eq!(
            msg,
            "invalid list argument `[a,,b]`: expected a name, found ',' (at character 4)"
        );
        let msg = parse_list("[a").unwrap_err().to_string();
        assert!(
            msg.contains("`[a`") && msg.contains("never closed"),
            "{msg}"
        );
    }

    #[test]
    fn canonical_display() {
        assert_eq!(
            flat(&["Conv_2", "Conv_90"]).to_string(),
            "['Conv_2','Conv_90']"
        );
        assert_eq!(
            nested(&[&["a"], &["a", "b"]]).to_string(),
            "[['a'],['a','b']]"
        );
        assert_eq!(flat(&[]).to_string(), "[]");
        assert_eq!(flat(&["it's", r"a\b"]).to_string(), r"['it\'s','a\\b']");
    }

    #[test]
    fn accessors() {
        let n = parse_list("[a,[b,c]]").unwrap();
        assert!(n.is_nested());
        assert_eq!(n.names(), ["a", "b", "c"]);
        assert_eq!(n.as_flat(), None);
        let f = parse_list("[a,b]").unwrap();
        assert_eq!(f.as_flat().unwrap(), ["a", "b"]);
        assert_eq!(
            f.into_groups(),
            vec![vec!["a".to_string()], vec!["b".to_string()]]
        );
    }

    #[test]
    fn booleans() {
        for s in ["True", "true", "1", " TRUE "] {
            assert_eq!(parse_bool(s), Ok(true), "{s}");
        }
        for s in ["False", "false", "0", "FALSE"] {
            assert_eq!(parse_bool(s), Ok(false), "{s}");
        }
        for s in ["", "yes", "2", "Tru", "10"] {
            assert_eq!(parse_bool(s), Err(BoolArgError { input: s.into() }), "{s}");
        }
    }

    /// Names with every character the syntax treats specially, plus arbitrary text.
    fn any_name() -> impl Strategy<Value = String> {
        prop_oneof![
            "[A-Za-z0-9_/.:\\- '\",\\[\\]\\\\é\t]{1,12}",
            any::<String>().prop_filter("names are non-empty", |s| !s.is_empty()),
        ]
    }

    fn any_list() -> impl Strategy<Value = ListArg> {
        let names = || prop::collection::vec(any_name(), 0..5);
        prop_oneof![
            names().prop_map(ListArg::Flat),
            prop::collection::vec(names(), 1..4).prop_map(ListArg::Nested),
        ]
    }

    proptest! {
        #[test]
        fn display_round_trips(value in any_list()) {
            let text = value.to_string();
            prop_assert_eq!(parse_list(&text), Ok(value), "{}", text);
        }

        #[test]
        fn unquoted_names_round_trip(names in prop::collection::vec("[A-Za-z0-9_/.:\\-]{1,10}", 1..6)) {
            let text = format!("[ {} ]", names.join(" , "));
            prop_assert_eq!(parse_list(&text), Ok(ListArg::Flat(names)));
        }

        #[test]
        fn arbitrary_strings_never_panic(input in any::<String>()) {
            if let Err(e) = parse_list(&input) {
                prop_assert!(e.position <= input.chars().count());
                let _ = e.to_string();
                let _ = e.caret_lines();
            }
            let _ = parse_bool(&input);
        }

        #[test]
        fn syntax_soup_never_panics(input in "[\\[\\],'\"\\\\ ab]{0,24}") {
            match parse_list(&input) {
                Ok(value) => prop_assert_eq!(parse_list(&value.to_string()), Ok(value)),
                Err(e) => prop_assert!(e.position <= input.chars().count()),
            }
        }
    }
}
