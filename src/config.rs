//! Helpers shared by every TOML file the project reads (policies, cost models, workloads).

use crate::error::ConfigError;

/// Converts a TOML error into a [`ConfigError::Parse`] naming the file, line, column and key.
pub fn toml_error(file: &str, text: &str, err: &toml::de::Error) -> ConfigError {
    let (line, column) = match err.span() {
        Some(span) => line_column(text, span.start),
        None => (0, 0),
    };
    let message = err.message().trim().to_string();
    ConfigError::Parse {
        file: file.to_string(),
        line,
        column,
        key: key_at_line(text, line).or_else(|| key_in_message(&message)),
        message,
    }
}

/// 1-based line and column of a byte offset.
fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let column = before.len() - before.rfind('\n').map(|i| i + 1).unwrap_or(0) + 1;
    (line, column)
}

/// The dotted key defined on 1-based `line` (`table.key` for `key = value` under `[table]`,
/// `table` for a header line), if the line defines one.
fn key_at_line(text: &str, line: usize) -> Option<String> {
    let lines: Vec<&str> = text.lines().collect();
    let here = lines.get(line.checked_sub(1)?)?.trim();
    let header = |l: &str| {
        l.strip_prefix('[').map(|h| {
            h.trim_start_matches('[')
                .split(']')
                .next()
                .unwrap_or("")
                .trim()
                .to_string()
        })
    };
    if let Some(h) = header(here) {
        return (!h.is_empty()).then_some(h);
    }
    let (lhs, _) = here.split_once('=')?;
    let name = lhs.trim().trim_matches('"');
    if name.is_empty() || name.starts_with('#') {
        return None;
    }
    let table = lines[..line - 1].iter().rev().find_map(|l| header(l.trim()));
    Some(match table {
        Some(t) if !t.is_empty() => format!("{t}.{name}"),
        _ => name.to_string(),
    })
}

/// serde names a key in backticks ("unknown field `speed`, expected ..."): take the first.
fn key_in_message(message: &str) -> Option<String> {
    let start = message.find('`')? + 1;
    let len = message[start..].find('`')?;
    Some(message[start..start + len].to_string())
}

/// Reads a config file as text; returns its display name (for errors) and its contents.
pub fn read_file(path: &std::path::Path) -> Result<(String, String), ConfigError> {
    let file = path.display().to_string();
    match std::fs::read_to_string(path) {
        Ok(text) => Ok((file, text)),
        Err(e) => Err(ConfigError::Read {
            file,
            reason: e.to_string(),
        }),
    }
}

/// Parses TOML text into `T`; errors name `file`, line, column and key.
pub fn parse<T: serde::de::DeserializeOwned>(text: &str, file: &str) -> Result<T, ConfigError> {
    toml::from_str(text).map_err(|e| toml_error(file, text, &e))
}
