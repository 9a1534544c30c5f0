//! The machine log: the workload's stdout and stderr, split into lines and appended to
//! `log_path` as JSON lines `{"ts":<unix ms>,"stream":"stdout","line":"..."}`, with size-based
//! rotation to `<log_path>.1` (one old file kept).
//!
//! Write errors (a full disk) are ignored: losing log lines must never stop supervision.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::sys;

/// A line longer than this is written out in pieces of this size, so that a workload that
/// never writes '\n' cannot grow the shim's memory.
pub(crate) const MAX_LINE: usize = 16 * 1024;

/// Which output stream a line came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stream {
    Stdout,
    Stderr,
}

impl Stream {
    fn name(self) -> &'static str {
        match self {
            Stream::Stdout => "stdout",
            Stream::Stderr => "stderr",
        }
    }
}

#[derive(Serialize)]
struct LogLine<'a> {
    ts: u64,
    stream: &'static str,
    line: &'a str,
}

/// Appends JSON lines to the log file and rotates it.
pub(crate) struct LogWriter {
    path: PathBuf,
    file: File,
    /// Current size of the file, to decide on rotation without a `stat` per write.
    size: u64,
    /// Rotate before the file would exceed this (0 = never).
    max_bytes: u64,
    /// Partial lines, one per stream.
    pending: [Vec<u8>; 2],
    /// Encoded lines waiting for the next `flush`; reused to avoid allocating per read.
    out: Vec<u8>,
}

impl LogWriter {
    /// Opens (creating it and its directory if needed) the log file for appending.
    pub(crate) fn open(path: &Path, max_bytes: u64) -> io::Result<LogWriter> {
        if let Some(dir) = path.parent() {
            fs::create_dir_all(dir)?;
        }
        let file = open_append(path)?;
        let size = file.metadata()?.len();
        Ok(LogWriter {
            path: path.to_path_buf(),
            file,
            size,
            max_bytes,
            pending: [Vec::new(), Vec::new()],
            out: Vec::new(),
        })
    }

    /// Feeds bytes read from `stream`; complete lines are encoded for the next [`flush`].
    ///
    /// [`flush`]: LogWriter::flush
    pub(crate) fn feed(&mut self, stream: Stream, mut bytes: &[u8]) {
        let ts = sys::now_ms();
        let idx = stream as usize;
        while !bytes.is_empty() {
            let room = MAX_LINE - self.pending[idx].len();
            // A '\n' right after `room` bytes still ends this line, not the next one.
            match bytes[..bytes.len().min(room + 1)]
                .iter()
                .position(|&b| b == b'\n')
            {
                Some(nl) => {
                    self.pending[idx].extend_from_slice(&bytes[..nl]);
                    bytes = &bytes[nl + 1..];
                    self.emit(stream, ts);
                }
                None => {
                    let take = bytes.len().min(room);
                    self.pending[idx].extend_from_slice(&bytes[..take]);
                    bytes = &bytes[take..];
                    if self.pending[idx].len() == MAX_LINE {
                        self.emit(stream, ts);
                    }
                }
            }
        }
    }

    /// Encodes what is left of a stream's last line (at end of stream).
    pub(crate) fn finish(&mut self, stream: Stream) {
        if !self.pending[stream as usize].is_empty() {
            self.emit(stream, sys::now_ms());
        }
    }

    fn emit(&mut self, stream: Stream, ts: u64) {
        let idx = stream as usize;
        let line = String::from_utf8_lossy(&self.pending[idx]);
        let record = LogLine {
            ts,
            stream: stream.name(),
            line: &line,
        };
        // Serialising a struct of a number and strings into a Vec cannot fail.
        let _ = serde_json::to_writer(&mut self.out, &record);
        self.out.push(b'\n');
        self.pending[idx].clear();
    }

    /// Writes the encoded lines to the file, rotating it first if they would not fit.
    pub(crate) fn flush(&mut self) {
        if self.out.is_empty() {
            return;
        }
        let len = self.out.len() as u64;
        if self.max_bytes > 0 && self.size > 0 && self.size + len > self.max_bytes {
            self.rotate();
        }
        if self.file.write_all(&self.out).is_ok() {
            self.size += len;
        }
        self.out.clear();
        // Keep the shim small after a burst of output.
        if self.out.capacity() > 4 * MAX_LINE {
            self.out.shrink_to(MAX_LINE);
        }
    }

    /// Renames the log to `<log>.1` (replacing the old one) and starts a new file.
    fn rotate(&mut self) {
        let mut old = self.path.clone().into_os_string();
        old.push(".1");
        if fs::rename(&self.path, &old).is_err() {
            return;
        }
        if let Ok(file) = open_append(&self.path) {
            self.file = file;
            self.size = 0;
        }
    }
}

fn open_append(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o640)
        .open(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(path: &Path) -> Vec<(String, String)> {
        fs::read_to_string(path)
            .unwrap_or_default()
            .lines()
            .map(|l| {
                let v: serde_json::Value = serde_json::from_str(l).unwrap();
                (
                    v["stream"].as_str().unwrap().to_owned(),
                    v["line"].as_str().unwrap().to_owned(),
                )
            })
            .collect()
    }

    #[test]
    fn splits_lines_per_stream_and_keeps_partials() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/m.log");
        let mut log = LogWriter::open(&path, 0).unwrap();
        log.feed(Stream::Stdout, b"one\ntw");
        log.feed(Stream::Stderr, b"err\n");
        log.feed(Stream::Stdout, b"o\n\nthree");
        log.flush();
        log.finish(Stream::Stdout);
        log.finish(Stream::Stderr);
        log.flush();
        let got = lines(&path);
        let want = [
            ("stdout", "one"),
            ("stderr", "err"),
            ("stdout", "two"),
            ("stdout", ""),
            ("stdout", "three"),
        ];
        assert_eq!(got, want.map(|(s, l)| (s.to_owned(), l.to_owned())));
    }

    #[test]
    fn long_lines_are_cut_and_invalid_utf8_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.log");
        let mut log = LogWriter::open(&path, 0).unwrap();
        log.feed(Stream::Stdout, &vec![b'x'; MAX_LINE * 2 + 5]);
        log.feed(Stream::Stdout, b"\xff\n");
        log.flush();
        let got = lines(&path);
        assert_eq!(got.len(), 3);
        assert_eq!(got[0].1.len(), MAX_LINE);
        assert_eq!(got[1].1.len(), MAX_LINE);
        assert_eq!(got[2].1, "xxxxx\u{fffd}");
    }

    #[test]
    fn a_newline_right_after_a_full_line_ends_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.log");
        let mut log = LogWriter::open(&path, 0).unwrap();
        let mut bytes = vec![b'y'; MAX_LINE];
        bytes.extend_from_slice(b"\nnext\n");
        log.feed(Stream::Stderr, &bytes);
        log.flush();
        let got = lines(&path);
        assert_eq!(got.len(), 2);
        assert_eq!((got[0].1.len(), got[1].1.as_str()), (MAX_LINE, "next"));
    }

    #[test]
    fn rotates_keeping_one_old_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.log");
        let mut log = LogWriter::open(&path, 200).unwrap();
        for i in 0..20 {
            log.feed(Stream::Stdout, format!("line {i}\n").as_bytes());
            log.flush();
        }
        let size = fs::metadata(&path).unwrap().len();
        assert!(size <= 200, "{size}");
        let old = dir.path().join("m.log.1");
        assert!(fs::metadata(&old).unwrap().len() <= 200);
        let all: Vec<_> = [lines(&old), lines(&path)].concat();
        assert_eq!(all.last().unwrap().1, "line 19");
        assert!(!dir.path().join("m.log.2").exists());
    }
}
