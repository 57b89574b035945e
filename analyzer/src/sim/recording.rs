//! The recording file format: what the simulator writes and [`crate::calibrate`] reads.
//!
//! A recording is the 8 bytes `CCLDREC1` followed by any number of
//! `TimedBatch` messages (proto `ccld.v1.TimedBatch`: the analyzer time at which a batch was
//! received and the batch), each preceded by its length as a protobuf varint (prost's
//! length-delimited encoding). A recording can therefore be replayed into an [`Engine`]
//! exactly as the analyzer saw it.
//!
//! [`Engine`]: crate::engine::Engine

use std::io::{self, Read, Write};

use prost::Message;

use crate::wire::TimedBatch;

/// File magic.
pub const MAGIC: &[u8; 8] = b"CCLDREC1";
/// Largest accepted message (256 MiB): a length above it is treated as corruption.
pub const MAX_MESSAGE: u64 = 256 << 20;

/// Errors reading a recording.
#[derive(Debug, thiserror::Error)]
pub enum RecordingError {
    /// I/O failure.
    #[error("recording I/O: {0}")]
    Io(#[from] io::Error),
    /// The file does not start with `CCLDREC1`.
    #[error("not a CCL-D recording (bad magic)")]
    BadMagic,
    /// A length prefix is malformed or too large.
    #[error("corrupt recording: bad length prefix at message {index}")]
    BadLength {
        /// Message index.
        index: u64,
    },
    /// The file ends inside a message.
    #[error("truncated recording at message {index}")]
    Truncated {
        /// Message index.
        index: u64,
    },
    /// A message does not decode.
    #[error("corrupt message {index}: {source}")]
    Decode {
        /// Message index.
        index: u64,
        /// Decoder error.
        source: prost::DecodeError,
    },
}

/// Writes the magic and every batch; returns the number of batches written.
pub fn write_recording<W: Write>(
    w: &mut W,
    batches: impl IntoIterator<Item = TimedBatch>,
) -> io::Result<u64> {
    w.write_all(MAGIC)?;
    let mut n = 0;
    let mut buf = Vec::new();
    for b in batches {
        buf.clear();
        b.encode_length_delimited(&mut buf)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        w.write_all(&buf)?;
        n += 1;
    }
    w.flush()?;
    Ok(n)
}

/// Iterator over the batches of a recording.
#[derive(Debug)]
pub struct RecordingReader<R> {
    r: R,
    index: u64,
    failed: bool,
}

/// Checks the magic and returns a reader over the batches.
pub fn read_recording<R: Read>(mut r: R) -> Result<RecordingReader<R>, RecordingError> {
    let mut m = [0u8; 8];
    match r.read_exact(&mut m) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Err(RecordingError::BadMagic),
        Err(e) => return Err(RecordingError::Io(e)),
    }
    if &m != MAGIC {
        return Err(RecordingError::BadMagic);
    }
    Ok(RecordingReader {
        r,
        index: 0,
        failed: false,
    })
}

impl<R: Read> RecordingReader<R> {
    /// Reads a varint; Ok(None) at a clean end of file.
    fn varint(&mut self) -> Result<Option<u64>, RecordingError> {
        let mut v: u64 = 0;
        for i in 0..10 {
            let mut b = [0u8; 1];
            match self.r.read(&mut b) {
                Ok(0) if i == 0 => return Ok(None),
                Ok(0) => return Err(RecordingError::Truncated { index: self.index }),
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {
                    return Err(RecordingError::Io(e))
                }
                Err(e) => return Err(RecordingError::Io(e)),
            }
            v |= u64::from(b[0] & 0x7f) << (7 * i);
            if b[0] & 0x80 == 0 {
                return Ok(Some(v));
            }
        }
        Err(RecordingError::BadLength { index: self.index })
    }

    fn next_batch(&mut self) -> Result<Option<TimedBatch>, RecordingError> {
        let Some(len) = self.varint()? else {
            return Ok(None);
        };
        if len > MAX_MESSAGE {
            return Err(RecordingError::BadLength { index: self.index });
        }
        let mut buf = vec![0u8; len as usize];
        self.r.read_exact(&mut buf).map_err(|e| {
            if e.kind() == io::ErrorKind::UnexpectedEof {
                RecordingError::Truncated { index: self.index }
            } else {
                RecordingError::Io(e)
            }
        })?;
        let tb = TimedBatch::decode(buf.as_slice()).map_err(|source| RecordingError::Decode {
            index: self.index,
            source,
        })?;
        self.index += 1;
        Ok(Some(tb))
    }
}

impl<R: Read> Iterator for RecordingReader<R> {
    type Item = Result<TimedBatch, RecordingError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed {
            return None;
        }
        match self.next_batch() {
            Ok(Some(b)) => Some(Ok(b)),
            Ok(None) => None,
            Err(e) => {
                self.failed = true;
                Some(Err(e))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::{Sim, SimConfig};

    #[test]
    fn sim_output_round_trips_and_damage_is_reported() {
        let cfg = SimConfig {
            duration_ns: 30_000_000_000,
            ..SimConfig::default()
        };
        let batches: Vec<TimedBatch> = Sim::new(cfg).unwrap().collect();
        let mut file = Vec::new();
        let n = write_recording(&mut file, batches.clone()).unwrap();
        assert_eq!(n, batches.len() as u64);
        let back: Vec<TimedBatch> = read_recording(file.as_slice())
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(back, batches);
        // Bad magic, truncation, junk length.
        assert!(matches!(
            read_recording(&b"NOTCCLD!"[..]),
            Err(RecordingError::BadMagic)
        ));
        assert!(matches!(
            read_recording(&b"CCL"[..]),
            Err(RecordingError::BadMagic)
        ));
        let cut = &file[..file.len() - 3];
        let res: Result<Vec<_>, _> = read_recording(cut).unwrap().collect();
        assert!(matches!(res, Err(RecordingError::Truncated { .. })));
        let mut junk = MAGIC.to_vec();
        junk.extend_from_slice(&[0xff; 11]);
        let res: Result<Vec<_>, _> = read_recording(junk.as_slice()).unwrap().collect();
        assert!(matches!(res, Err(RecordingError::BadLength { index: 0 })));
        let mut garbage = MAGIC.to_vec();
        garbage.extend_from_slice(&[3, 0xff, 0xff, 0xff]);
        let res: Result<Vec<_>, _> = read_recording(garbage.as_slice()).unwrap().collect();
        assert!(matches!(res, Err(RecordingError::Decode { .. })));
    }
}
