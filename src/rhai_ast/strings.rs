//! Backtick strings as models mean them: `\n`, `\t`, `\r`, `\\`, `` \` ``, `\$`, `\"`, `\'`,
//! `\0` and `\u{…}` mean in a backtick string what they mean in a double-quoted one. Rhai keeps
//! a backtick string's text verbatim (`` `a\nb` `` is a backslash and an `n`), which a model
//! writing JavaScript never means; an escape with no meaning (`\d` in a regular expression)
//! stays as written, so scripts that worked keep working.
//!
//! Two steps, neither of which moves a character, so that every line and column Rhai reports is
//! the one the script was written with:
//!
//! 1. [`mark_escapes`], over the text before Rhai reads it, finds the backtick strings (not in
//!    comments, other strings or characters; inside `${…}` too) and writes each escape as
//!    [`MARK`] and a letter, two characters for two characters; `` \` `` becomes Rhai's own
//!    doubled backtick, which ends the string where the escape says it does not.
//! 2. The token mapper [`decode_marked_strings`] installs turns every marked pair in a string
//!    token into the character it stands for.
//!
//! [`MARK`] is a Unicode noncharacter, never in text: a script that has one anyway is left as
//! it is (its backtick strings verbatim, as Rhai reads them).

use std::borrow::Cow;

use rhai::{Engine, Token};

/// Marks an escape in a backtick string: the character after it says which.
const MARK: char = '\u{FDD0}';

/// The escapes a backtick string has, by their letter: the letter [`mark_escapes`] writes after
/// [`MARK`], and the character it stands for. A backslash is marked `B`: marked with itself,
/// Rhai would read `\${` as an escaped `${` in `` `\\${x}` ``.
const ESCAPES: &[(char, char, char)] = &[
    // (written after `\`, written after MARK, meaning)
    ('n', 'n', '\n'),
    ('t', 't', '\t'),
    ('r', 'r', '\r'),
    ('0', '0', '\0'),
    ('"', '"', '"'),
    ('\'', '\'', '\''),
    ('$', '$', '$'),
    ('\\', 'B', '\\'),
];

/// `source` with the escapes of its backtick strings marked (see the module's docs); the text
/// itself when it has none, or has a [`MARK`] of its own.
pub(crate) fn mark_escapes(source: &str) -> Cow<'_, str> {
    if !source.contains('`') || !source.contains('\\') || source.contains(MARK) {
        return Cow::Borrowed(source);
    }
    let chars: Vec<char> = source.chars().collect();
    let mut out = String::with_capacity(source.len() + 16);
    let mut changed = false;
    // Open `${` of the backtick strings we are in, each with the depth of `{` inside it.
    let mut interpolations: Vec<usize> = Vec::new();
    let mut in_text = false;
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if in_text {
            match (c, next) {
                ('`', Some('`')) => {
                    out.push_str("``");
                    i += 2;
                }
                ('`', _) => {
                    out.push('`');
                    in_text = false;
                    i += 1;
                }
                ('$', Some('{')) => {
                    out.push_str("${");
                    interpolations.push(0);
                    in_text = false;
                    i += 2;
                }
                ('\\', Some('`')) => {
                    out.push_str("``");
                    changed = true;
                    i += 2;
                }
                // Rhai's own: `\${` is the text `${`.
                ('\\', Some('$')) if chars.get(i + 2) == Some(&'{') => {
                    out.push_str("\\${");
                    i += 3;
                }
                ('\\', Some(e)) => {
                    if let Some(&(_, letter, _)) = ESCAPES.iter().find(|(w, _, _)| *w == e) {
                        out.push(MARK);
                        out.push(letter);
                        changed = true;
                        i += 2;
                    } else if let Some(len) = unicode_escape(&chars[i + 1..]) {
                        // `\u{1F600}`: the mark, then `u{1F600}` as written.
                        out.push(MARK);
                        out.extend(&chars[i + 1..i + 1 + len]);
                        changed = true;
                        i += 1 + len;
                    } else {
                        out.push('\\');
                        i += 1;
                    }
                }
                _ => {
                    out.push(c);
                    i += 1;
                }
            }
            continue;
        }
        // Code: find where the next string, character, comment or backtick string starts.
        let skip = match (c, next) {
            ('/', Some('/')) => line_comment(&chars[i..]),
            ('/', Some('*')) => block_comment(&chars[i..]),
            ('"', _) => quoted(&chars[i..], '"'),
            ('\'', _) => quoted(&chars[i..], '\''),
            ('#', Some('#' | '"')) => raw_string(&chars[i..]),
            ('`', _) => {
                in_text = true;
                1
            }
            ('{', _) => {
                if let Some(depth) = interpolations.last_mut() {
                    *depth += 1;
                }
                1
            }
            ('}', _) => {
                match interpolations.last_mut() {
                    Some(0) => {
                        interpolations.pop();
                        in_text = true;
                    }
                    Some(depth) => *depth -= 1,
                    None => {}
                }
                1
            }
            _ => 1,
        };
        out.extend(&chars[i..(i + skip).min(chars.len())]);
        i += skip;
    }
    if changed {
        Cow::Owned(out)
    } else {
        Cow::Borrowed(source)
    }
}

/// The length of `u{…}` at the start of `rest` when it is a character's code (one to six hex
/// digits).
fn unicode_escape(rest: &[char]) -> Option<usize> {
    if rest.first() != Some(&'u') || rest.get(1) != Some(&'{') {
        return None;
    }
    let close = rest.iter().take(9).position(|&c| c == '}')?;
    let hex: String = rest[2..close].iter().collect();
    let code = u32::from_str_radix(&hex, 16)
        .ok()
        .filter(|_| !hex.is_empty())?;
    char::from_u32(code)?;
    Some(close + 1)
}

/// The length of a `//` comment, to the end of its line.
fn line_comment(rest: &[char]) -> usize {
    rest.iter().position(|&c| c == '\n').unwrap_or(rest.len())
}

/// The length of a `/* */` comment; Rhai's nest.
fn block_comment(rest: &[char]) -> usize {
    let mut depth = 0usize;
    let mut i = 0;
    while i < rest.len() {
        match (rest[i], rest.get(i + 1)) {
            ('/', Some('*')) => {
                depth += 1;
                i += 2;
            }
            ('*', Some('/')) => {
                depth -= 1;
                i += 2;
                if depth == 0 {
                    return i;
                }
            }
            _ => i += 1,
        }
    }
    rest.len()
}

/// The length of a double-quoted string or a character, escapes and all, to its closing quote
/// (or the end of its line, where Rhai reports the error).
fn quoted(rest: &[char], quote: char) -> usize {
    let mut i = 1;
    while i < rest.len() {
        match rest[i] {
            '\\' => i += 2,
            c if c == quote => return i + 1,
            '\n' => return i,
            _ => i += 1,
        }
    }
    rest.len()
}

/// The length of a raw string, `#"…"#` with as many `#` on both sides.
fn raw_string(rest: &[char]) -> usize {
    let hashes = rest.iter().take_while(|&&c| c == '#').count();
    if rest.get(hashes) != Some(&'"') {
        return hashes;
    }
    let mut i = hashes + 1;
    while i < rest.len() {
        if rest[i] == '"'
            && rest[i + 1..]
                .iter()
                .take(hashes)
                .filter(|&&c| c == '#')
                .count()
                == hashes
        {
            return i + 1 + hashes;
        }
        i += 1;
    }
    rest.len()
}

/// The text of a string token with its marked escapes decoded.
fn decode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c != MARK {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('u') => {
                // `u{…}`, checked when it was marked.
                let code: String = chars.by_ref().skip(1).take_while(|&c| c != '}').collect();
                if let Some(c) = u32::from_str_radix(&code, 16).ok().and_then(char::from_u32) {
                    out.push(c);
                }
            }
            Some(letter) => {
                if let Some(&(_, _, meaning)) = ESCAPES.iter().find(|(_, l, _)| *l == letter) {
                    out.push(meaning);
                }
            }
            None => {}
        }
    }
    out
}

/// Installs the token mapper that decodes what [`mark_escapes`] marked.
pub(crate) fn decode_marked_strings(engine: &mut Engine) {
    #[allow(deprecated)] // Volatile, not deprecated: the one hook on Rhai's tokens.
    engine.on_parse_token(|token, _, _| match token {
        Token::StringConstant(s) if s.contains(MARK) => {
            Token::StringConstant(Box::new(decode(&s).into()))
        }
        Token::InterpolatedString(s) if s.contains(MARK) => {
            Token::InterpolatedString(Box::new(decode(&s).into()))
        }
        other => other,
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn eval(source: &str) -> String {
        let mut engine = Engine::new();
        decode_marked_strings(&mut engine);
        engine
            .eval::<String>(&mark_escapes(source))
            .unwrap_or_else(|e| panic!("{source}: {e}"))
    }

    #[test]
    fn backtick_escapes_mean_what_they_mean_in_double_quotes() {
        for (script, expected) in [
            (r"`a\nb`", "a\nb"),
            (r"`a\tb\rc`", "a\tb\rc"),
            (r"`a\\nb`", "a\\nb"),
            (r"`say \`hi\``", "say `hi`"),
            (r#"`a\"b\'c`"#, "a\"b'c"),
            (r"`\u{1F600}!`", "\u{1F600}!"),
            (r"`cost: \$5`", "cost: $5"),
            // Rhai's own `\${`: the text `${`.
            (r"`\${x}`", "${x}"),
            // A backslash, then an interpolation.
            (r"let x = 1; `\\${x}`", "\\1"),
            (r"let n = `Ann`; `Hi ${n},\n\nSorry`", "Hi Ann,\n\nSorry"),
            // Inside an interpolation: code, with its own strings.
            (
                r#"let x = 2; `a${ `[\n]` + "\\n" + x }b\n`"#,
                "a[\n]\\n2b\n",
            ),
            (r#"`${ #{a: `\t`}.a }`"#, "\t"),
            // Escapes with no meaning stay as written; doubled backticks stay Rhai's.
            (r"`\d+\.\w`", "\\d+\\.\\w"),
            (r"`\u{110000}\u{zz}`", "\\u{110000}\\u{zz}"),
            ("`a``b`", "a`b"),
            // Double-quoted strings, characters, raw strings and comments are not touched.
            (r#""a\\nb""#, "a\\nb"),
            (r#"let c = '`'; "x" + c + `\n`"#, "x`\n"),
            (r##"#"`\n`"# + `\n`"##, "`\\n`\n"),
            ("// `\\n`\n`\\t`", "\t"),
            ("/* `\\n` /* ` */ */ `\\t`", "\t"),
        ] {
            assert_eq!(eval(script), expected, "{script}");
        }
    }

    /// Nothing moves: an error after an escape is where it was written.
    #[test]
    fn positions_do_not_move() {
        let mut engine = Engine::new();
        decode_marked_strings(&mut engine);
        let source = "let s = `a\\n\\t\\u{41}`; let t = s +;";
        let marked = mark_escapes(source);
        assert_eq!(marked.chars().count(), source.chars().count());
        let e = engine.compile(&*marked).unwrap_err();
        let plain = Engine::new()
            .compile("let s = `a_n_t_u{41}`; let t = s +;")
            .unwrap_err();
        assert_eq!(e.position(), plain.position());
    }

    #[test]
    fn a_script_without_escapes_is_not_copied() {
        for source in ["`a`", "\"\\n\"", "let x = 1;", "`\\d`", "`a\u{FDD0}\\n`"] {
            assert!(matches!(mark_escapes(source), Cow::Borrowed(_)), "{source}");
        }
    }

    /// Unterminated or malformed text is left for Rhai to report.
    #[test]
    fn broken_text_never_panics() {
        for source in [
            "`\\", "`${", "`${ \"", "\"\\", "'", "#", "##\"", "/*", "`\\u{", "}}}`\\n",
        ] {
            let _ = mark_escapes(source);
        }
    }
}
