//! Record values in the formats connectors speak, so an operator does not hand-parse: JSON
//! (into and from any serde type), CSV lines (RFC 4180 quoting, any one-byte delimiter) and raw
//! bytes (a record's value as it is).
//!
//! The PostgreSQL sink reads the same formats: emit `to_json(&row)` for `format = "json"`, or
//! `csv_line(&fields, b',')` for `format = "csv"` with the table's columns in field order.
//!
//! Errors say what the value is and what was expected, so the host's report of a failing
//! record (which names the record) reads as a sentence.

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::{Error, Result};

/// The value parsed as JSON into `T` (an object into a struct, an array into a `Vec`, ...).
pub fn json<T: DeserializeOwned>(value: &[u8]) -> Result<T> {
    serde_json::from_slice(value).map_err(|e| Error::msg(format!("the value is not the JSON expected: {e}")))
}

/// `v` as JSON bytes (a struct as an object).
pub fn to_json<T: Serialize>(v: &T) -> Vec<u8> {
    // Serializing plain data to a Vec cannot fail; a type whose Serialize fails on purpose
    // gets `null`.
    serde_json::to_vec(v).unwrap_or_else(|_| b"null".to_vec())
}

/// The fields of one CSV line: fields separated by `delimiter`, a field in double quotes may
/// hold the delimiter, newlines and `""` (one quote). A trailing newline is ignored.
pub fn csv_fields(value: &[u8], delimiter: u8) -> Result<Vec<String>> {
    let line = value.strip_suffix(b"\n").unwrap_or(value);
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let mut fields = Vec::new();
    let mut field = Vec::new();
    let mut i = 0;
    let mut quoted_field = false;
    while i <= line.len() {
        if i == line.len() || line[i] == delimiter {
            fields.push(utf8(std::mem::take(&mut field), fields.len())?);
            quoted_field = false;
            i += 1;
            continue;
        }
        if line[i] == b'"' && field.is_empty() && !quoted_field {
            // A quoted field runs to the next lone quote.
            quoted_field = true;
            i += 1;
            loop {
                match line.get(i) {
                    None => return Err(Error::msg(format!("CSV field {} has no closing quote", fields.len() + 1))),
                    Some(b'"') if line.get(i + 1) == Some(&b'"') => {
                        field.push(b'"');
                        i += 2;
                    }
                    Some(b'"') => {
                        i += 1;
                        break;
                    }
                    Some(&c) => {
                        field.push(c);
                        i += 1;
                    }
                }
            }
            if i < line.len() && line[i] != delimiter {
                return Err(Error::msg(format!("CSV field {} has text after its closing quote", fields.len() + 1)));
            }
            continue;
        }
        field.push(line[i]);
        i += 1;
    }
    Ok(fields)
}

fn utf8(bytes: Vec<u8>, index: usize) -> Result<String> {
    String::from_utf8(bytes).map_err(|_| Error::msg(format!("CSV field {} is not UTF-8", index + 1)))
}

/// One CSV line of `fields` (no trailing newline), quoting a field that holds the delimiter, a
/// quote, a newline, or leading/trailing spaces.
pub fn csv_line<S: AsRef<str>>(fields: &[S], delimiter: u8) -> Vec<u8> {
    let mut out = Vec::new();
    for (i, f) in fields.iter().enumerate() {
        if i > 0 {
            out.push(delimiter);
        }
        let f = f.as_ref().as_bytes();
        let needs = f.iter().any(|&c| c == delimiter || c == b'"' || c == b'\n' || c == b'\r')
            || f.first() == Some(&b' ')
            || f.last() == Some(&b' ');
        if needs {
            out.push(b'"');
            for &c in f {
                if c == b'"' {
                    out.push(b'"');
                }
                out.push(c);
            }
            out.push(b'"');
        } else {
            out.extend_from_slice(f);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Deserialize, serde::Serialize, Debug, PartialEq)]
    struct Row {
        word: String,
        n: u64,
    }

    #[test]
    fn json_round_trips_and_names_the_problem() {
        let r = Row { word: "a\"b".into(), n: 3 };
        assert_eq!(json::<Row>(&to_json(&r)).unwrap(), r);
        let e = json::<Row>(br#"{"word": "x"}"#).unwrap_err();
        assert!(e.message().contains("not the JSON expected") && e.message().contains("missing field `n`"), "{e}");
    }

    #[test]
    fn csv_lines_round_trip_through_quoting() {
        for fields in
            [vec!["a", "b", "c"], vec!["", "x y", ""], vec!["with,comma", "with \"quote\"", "new\nline", " padded "]]
        {
            for d in [b',', b' ', b'\t', b';'] {
                let line = csv_line(&fields, d);
                assert_eq!(csv_fields(&line, d).unwrap(), fields, "{}", String::from_utf8_lossy(&line));
            }
        }
        assert_eq!(csv_fields(b"a,b\r\n", b',').unwrap(), vec!["a", "b"]);
        assert_eq!(csv_fields(b"", b',').unwrap(), vec![""]);
        assert!(csv_fields(b"\"open,b", b',').unwrap_err().message().contains("field 1 has no closing quote"));
        assert!(csv_fields(b"a,\"b\"c", b',').unwrap_err().message().contains("field 2 has text after"));
        assert!(csv_fields(b"a,\xff", b',').unwrap_err().message().contains("field 2 is not UTF-8"));
    }
}
