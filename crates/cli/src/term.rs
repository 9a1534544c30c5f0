//! What the CLI prints of text it did not write (a workload's log lines): on a terminal,
//! control characters are shown escaped (`\x1b`, `\r`, `\u{9b}`), as journalctl does, so a
//! workload cannot move the cursor, retitle the window, rewrite earlier lines or send the
//! terminal any other command. Into a pipe or file the text goes as it came.

use std::borrow::Cow;
use std::io::IsTerminal;

/// `text` as it may be printed to this process's stdout: escaped when stdout is a terminal.
pub fn for_stdout(text: &str) -> Cow<'_, str> {
    if std::io::stdout().is_terminal() {
        escape_controls(text)
    } else {
        Cow::Borrowed(text)
    }
}

/// A JSON text as it may be printed to stdout: on a terminal, DEL and C1 characters (which
/// JSON lets a string carry raw) are written as `\u00NN` escapes, which JSON reads back as
/// the same characters; C0 ones cannot be raw in valid JSON but are escaped the same way.
pub fn json_for_stdout(json: &str) -> Cow<'_, str> {
    if std::io::stdout().is_terminal() {
        escape_json_controls(json)
    } else {
        Cow::Borrowed(json)
    }
}

/// `json` with its control characters but the whitespace JSON allows written as `\u00NN`.
pub fn escape_json_controls(json: &str) -> Cow<'_, str> {
    let raw = |c: char| c.is_control() && !matches!(c, '\t' | '\n' | '\r');
    if !json.chars().any(raw) {
        return Cow::Borrowed(json);
    }
    let mut out = String::with_capacity(json.len() + 16);
    for c in json.chars() {
        if raw(c) {
            out.push_str(&format!("\\u{:04x}", c as u32));
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// `text` with every control character but tab written as an escape: C0 and DEL as
/// `\xNN` (`\r` and `\n` as themselves escaped), C1 (which some terminals take as ESC [ and
/// the like) as `\u{NN}`.
pub fn escape_controls(text: &str) -> Cow<'_, str> {
    if !text.chars().any(|c| c != '\t' && c.is_control()) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        match c {
            '\t' => out.push(c),
            '\r' => out.push_str("\\r"),
            '\n' => out.push_str("\\n"),
            c if (c as u32) < 0x80 && c.is_control() => {
                out.push_str(&format!("\\x{:02x}", c as u32));
            }
            c if c.is_control() => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn terminal_commands_are_shown_not_obeyed() {
        // Clear the screen, set the window title, a CSI in its one-byte C1 form, a carriage
        // return that would overwrite the line, a bell and DEL.
        let hostile = "ok\x1b[2J\x1b]0;owned\x07\u{9b}31m\rfake\x7f";
        let shown = escape_controls(hostile);
        assert_eq!(shown, "ok\\x1b[2J\\x1b]0;owned\\x07\\u{9b}31m\\rfake\\x7f");
        assert!(!shown.chars().any(char::is_control));
    }

    #[test]
    fn json_keeps_its_meaning_with_its_controls_escaped() {
        let line = serde_json::json!({"line": "a\u{9b}2J\x7fb"}).to_string();
        assert!(line.contains('\u{9b}'), "serde_json leaves C1 raw: {line}");
        let shown = escape_json_controls(&line);
        assert_eq!(shown, r#"{"line":"a\u009b2J\u007fb"}"#);
        let back: serde_json::Value = serde_json::from_str(&shown).unwrap();
        assert_eq!(back["line"], "a\u{9b}2J\x7fb");
    }

    #[test]
    fn plain_text_is_left_alone() {
        for text in ["", "hello world", "tab\tseparated", "naïve café ✓ 日本"] {
            assert!(matches!(escape_controls(text), Cow::Borrowed(t) if t == text));
        }
    }
}
