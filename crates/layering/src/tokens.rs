//! A small Rust tokenizer for the layering reader: identifiers and punctuation, with
//! comments, strings and character literals left out (their text is no code), and what a
//! file says about other modules read from the tokens: `super::` paths that leave the
//! top-level module, the types it defines, and the self types of its `impl` blocks.

/// A token: an identifier (keywords included) or one punctuation mark (`::` and `->` are
/// one token each).
pub(crate) fn tokenize(code: &str) -> Vec<String> {
    let chars: Vec<char> = code.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c.is_whitespace() {
            i += 1;
        } else if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < chars.len() {
                if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        } else if c == '"' {
            i = skip_string(&chars, i + 1);
        } else if (c == 'r' || c == 'b') && raw_string_start(&chars, i).is_some() {
            let (hashes, open) = raw_string_start(&chars, i).unwrap_or_default();
            i = open + 1;
            while i < chars.len() {
                if chars[i] == '"' && (1..=hashes).all(|h| chars.get(i + h) == Some(&'#')) {
                    i += hashes + 1;
                    break;
                }
                i += 1;
            }
        } else if c == '\'' {
            // A character literal ('x', '\n', '\u{7f}'), or a lifetime ('a).
            if next == Some('\\') {
                i += 2;
                while i < chars.len() && chars[i] != '\'' {
                    i += 1;
                }
                i += 1;
            } else if chars.get(i + 2) == Some(&'\'') {
                i += 3;
            } else {
                i += 1;
            }
        } else if c.is_alphanumeric() || c == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            out.push(chars[start..i].iter().collect());
        } else if (c == ':' && next == Some(':')) || (c == '-' && next == Some('>')) {
            out.push(format!("{c}{}", next.unwrap_or_default()));
            i += 2;
        } else {
            out.push(c.to_string());
            i += 1;
        }
    }
    out
}

/// The index after the string whose body starts at `i` (escapes skipped).
fn skip_string(chars: &[char], mut i: usize) -> usize {
    while i < chars.len() {
        match chars[i] {
            '\\' => i += 2,
            '"' => return i + 1,
            _ => i += 1,
        }
    }
    i
}

/// `r"`, `r#"`, `br#"`...: the number of `#` and the index of the opening quote.
fn raw_string_start(chars: &[char], i: usize) -> Option<(usize, usize)> {
    if i > 0 && (chars[i - 1].is_alphanumeric() || chars[i - 1] == '_') {
        return None;
    }
    let mut j = i;
    if chars[j] == 'b' {
        j += 1;
    }
    if chars.get(j) != Some(&'r') {
        return None;
    }
    j += 1;
    let mut hashes = 0;
    while chars.get(j) == Some(&'#') {
        hashes += 1;
        j += 1;
    }
    (chars.get(j) == Some(&'"')).then_some((hashes, j))
}

/// What one file says about other modules.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct FileFacts {
    /// Names taken from the crate root through `super::` paths.
    pub supers: Vec<String>,
    /// Types the file defines (`struct`, `enum`, `union`, `trait`).
    pub defines: Vec<String>,
    /// The self types of its `impl` blocks (the last path segment: `Agent` for
    /// `impl crate::agent::Agent`, `Store` for `impl Drop for Store`).
    pub impls: Vec<String>,
}

fn is_ident(t: &str) -> bool {
    t.chars()
        .next()
        .is_some_and(|c| c.is_alphabetic() || c == '_')
}

/// Reads a file whose module sits `depth` levels below the crate root (`a.rs` and
/// `a/mod.rs`: 1, `a/b.rs`: 2).
pub(crate) fn facts(code: &str, depth: usize) -> FileFacts {
    let tokens = tokenize(code);
    let mut facts = FileFacts::default();
    // The brace depths at which inline `mod name { ... }` blocks were opened.
    let mut inline: Vec<usize> = Vec::new();
    let mut braces = 0usize;
    for (at, token) in tokens.iter().enumerate() {
        let prev = at.checked_sub(1).map(|p| tokens[p].as_str());
        let next = tokens.get(at + 1).map(String::as_str);
        match token.as_str() {
            "{" => {
                if at >= 2 && tokens[at - 2] == "mod" && is_ident(&tokens[at - 1]) {
                    inline.push(braces);
                }
                braces += 1;
            }
            "}" => {
                braces = braces.saturating_sub(1);
                if inline.last() == Some(&braces) {
                    inline.pop();
                }
            }
            "super" if prev != Some("::") && next == Some("::") => {
                let mut k = 0;
                let mut j = at;
                while tokens.get(j).map(String::as_str) == Some("super")
                    && tokens.get(j + 1).map(String::as_str) == Some("::")
                {
                    k += 1;
                    j += 2;
                }
                if k >= depth + inline.len() {
                    facts.supers.extend(path_names(&tokens[j..]));
                }
            }
            "struct" | "enum" | "union" | "trait"
                if next.is_some_and(is_ident) && prev != Some("::") =>
            {
                facts.defines.extend(next.map(str::to_string));
            }
            "impl" if matches!(prev, None | Some("}" | ";" | "{" | "]" | "unsafe")) => {
                facts.impls.extend(self_type(&tokens[at + 1..]));
            }
            _ => {}
        }
    }
    facts
}

/// The first names of a path's rest: `a::b` gives `a`, `{a, b::c}` gives `a` and `b`.
pub(crate) fn path_names(rest: &[String]) -> Vec<String> {
    match rest.first().map(String::as_str) {
        Some("{") => {
            let mut names = Vec::new();
            let mut depth = 0;
            let mut first = true;
            for t in &rest[1..] {
                match t.as_str() {
                    "{" => depth += 1,
                    "}" if depth == 0 => break,
                    "}" => depth -= 1,
                    "," if depth == 0 => first = true,
                    t if first && depth == 0 && is_ident(t) => {
                        names.push(t.to_string());
                        first = false;
                    }
                    _ => first = false,
                }
            }
            names
        }
        Some(t) if is_ident(t) => vec![t.to_string()],
        _ => Vec::new(),
    }
}

/// The name of an `impl` block's self type, from the tokens after `impl`.
fn self_type(rest: &[String]) -> Option<String> {
    let mut i = 0;
    // Generic parameters right after `impl` belong to no type.
    if rest.first().map(String::as_str) == Some("<") {
        let mut angle = 0usize;
        for t in rest {
            i += 1;
            match t.as_str() {
                "<" => angle += 1,
                ">" => {
                    angle = angle.saturating_sub(1);
                    if angle == 0 {
                        break;
                    }
                }
                _ => {}
            }
        }
    }
    let mut angle = 0usize;
    let mut start = i;
    let mut end = rest.len();
    for (j, t) in rest.iter().enumerate().skip(i) {
        match t.as_str() {
            "<" => angle += 1,
            ">" => angle = angle.saturating_sub(1),
            "{" | "where" | ";" if angle == 0 => {
                end = j;
                break;
            }
            "for" if angle == 0 && rest.get(j + 1).map(String::as_str) != Some("<") => {
                start = j + 1;
            }
            _ => {}
        }
    }
    rest[start..end]
        .iter()
        .take_while(|t| *t != "<")
        .filter(|t| is_ident(t) && !matches!(t.as_str(), "dyn" | "mut" | "const"))
        .last()
        .cloned()
}
