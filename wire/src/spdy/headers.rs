//! SPDY/3 header blocks: name/value pairs, compressed by one zlib stream per direction that
//! starts from a dictionary the protocol fixes (SPDY/3 section 2.6.10.1).

use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress, Status};

/// The protocol's zlib dictionary.
const DICTIONARY: &[u8] = include_bytes!("dictionary.bin");
/// The largest decompressed header block accepted. Kubernetes' blocks are a few hundred bytes.
pub const MAX_BLOCK_BYTES: usize = 16 * 1024;
/// The most pairs in one block.
pub const MAX_PAIRS: usize = 64;

/// Header pairs, names lowercase as the protocol requires.
pub type Headers = Vec<(String, String)>;

/// The first value of `name` (case-insensitive), if present.
pub fn get<'a>(headers: &'a Headers, name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.split('\0').next().unwrap_or_default())
}

/// Why a header block could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum HeaderCodecError {
    /// zlib failed.
    #[error("header block compression: {0}")]
    Zlib(String),
    /// The block decompresses to more than [`MAX_BLOCK_BYTES`].
    #[error("header block over {MAX_BLOCK_BYTES} bytes")]
    TooLarge,
    /// The block's structure is wrong.
    #[error("malformed header block: {0}")]
    Malformed(&'static str),
}

/// Decompresses the header blocks of one direction of a session.
pub struct HeaderDecoder {
    zlib: Decompress,
}

impl Default for HeaderDecoder {
    fn default() -> Self {
        Self::new()
    }
}

impl HeaderDecoder {
    /// A decoder at the start of a session.
    pub fn new() -> Self {
        Self {
            zlib: Decompress::new(true),
        }
    }

    /// Decodes one compressed block.
    pub fn decode(&mut self, compressed: &[u8]) -> Result<Headers, HeaderCodecError> {
        let mut plain = Vec::with_capacity(1024);
        let mut input = compressed;
        loop {
            if plain.len() > MAX_BLOCK_BYTES {
                return Err(HeaderCodecError::TooLarge);
            }
            plain.reserve(4096);
            let (before_in, before_out) = (self.zlib.total_in(), plain.len());
            let result = self
                .zlib
                .decompress_vec(input, &mut plain, FlushDecompress::Sync);
            let consumed = (self.zlib.total_in() - before_in) as usize;
            input = &input[consumed..];
            match result {
                Err(e) if e.needs_dictionary().is_some() => self
                    .zlib
                    .set_dictionary(DICTIONARY)
                    .map(|_| ())
                    .map_err(|e| HeaderCodecError::Zlib(e.to_string()))?,
                Err(e) => return Err(HeaderCodecError::Zlib(e.to_string())),
                Ok(Status::StreamEnd) => break,
                // Done once the input is used and zlib had room to spare for its output.
                Ok(_) if input.is_empty() && plain.len() < plain.capacity() => break,
                Ok(_) if consumed == 0 && plain.len() == before_out => {
                    return Err(HeaderCodecError::Malformed("zlib made no progress"))
                }
                Ok(_) => {}
            }
        }
        if plain.len() > MAX_BLOCK_BYTES {
            return Err(HeaderCodecError::TooLarge);
        }
        parse_pairs(&plain)
    }
}

fn parse_pairs(block: &[u8]) -> Result<Headers, HeaderCodecError> {
    let mut block = Block(block);
    let count = block.length()?;
    if count > MAX_PAIRS {
        return Err(HeaderCodecError::Malformed("too many header pairs"));
    }
    let mut pairs = Vec::with_capacity(count);
    for _ in 0..count {
        let name = block.string()?;
        let value = block.string()?;
        pairs.push((name.to_ascii_lowercase(), value));
    }
    Ok(pairs)
}

/// What is left of a decompressed header block.
struct Block<'a>(&'a [u8]);

impl Block<'_> {
    const SHORT: HeaderCodecError = HeaderCodecError::Malformed("block shorter than its lengths");

    /// A 32-bit big-endian length.
    fn length(&mut self) -> Result<usize, HeaderCodecError> {
        let (bytes, rest) = self.0.split_first_chunk::<4>().ok_or(Self::SHORT)?;
        self.0 = rest;
        Ok(u32::from_be_bytes(*bytes) as usize)
    }

    /// A length, then that many bytes of UTF-8.
    fn string(&mut self) -> Result<String, HeaderCodecError> {
        let len = self.length()?;
        let (text, rest) = self.0.split_at_checked(len).ok_or(Self::SHORT)?;
        self.0 = rest;
        String::from_utf8(text.to_vec())
            .map_err(|_| HeaderCodecError::Malformed("header is not UTF-8"))
    }
}

/// Compresses the header blocks of one direction of a session.
pub struct HeaderEncoder {
    zlib: Compress,
    started: bool,
}

impl Default for HeaderEncoder {
    fn default() -> Self {
        Self::new()
    }
}

impl HeaderEncoder {
    /// An encoder at the start of a session.
    pub fn new() -> Self {
        Self {
            zlib: Compress::new(Compression::default(), true),
            started: false,
        }
    }

    /// Encodes one block (names are lowercased).
    pub fn encode(&mut self, headers: &Headers) -> Result<Vec<u8>, HeaderCodecError> {
        if !self.started {
            self.zlib
                .set_dictionary(DICTIONARY)
                .map_err(|e| HeaderCodecError::Zlib(e.to_string()))?;
            self.started = true;
        }
        let mut plain = Vec::new();
        plain.extend_from_slice(&(headers.len() as u32).to_be_bytes());
        for (name, value) in headers {
            let name = name.to_ascii_lowercase();
            plain.extend_from_slice(&(name.len() as u32).to_be_bytes());
            plain.extend_from_slice(name.as_bytes());
            plain.extend_from_slice(&(value.len() as u32).to_be_bytes());
            plain.extend_from_slice(value.as_bytes());
        }
        let mut out = Vec::with_capacity(plain.len() + 64);
        let mut input = &plain[..];
        loop {
            let before = self.zlib.total_in();
            out.reserve(256);
            self.zlib
                .compress_vec(input, &mut out, FlushCompress::Sync)
                .map_err(|e| HeaderCodecError::Zlib(e.to_string()))?;
            input = &input[(self.zlib.total_in() - before) as usize..];
            // A sync flush is complete once the input is used and zlib left spare room.
            if input.is_empty() && out.len() < out.capacity() {
                return Ok(out);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_share_one_compression_context() {
        let (mut enc, mut dec) = (HeaderEncoder::new(), HeaderDecoder::new());
        for i in 0..5 {
            let headers = vec![
                ("streamType".to_string(), "stdout".to_string()),
                ("port".to_string(), format!("{i}")),
            ];
            let block = enc.encode(&headers).unwrap();
            let decoded = dec.decode(&block).unwrap();
            assert_eq!(get(&decoded, "streamtype"), Some("stdout"));
            assert_eq!(get(&decoded, "port"), Some(i.to_string().as_str()));
        }
    }

    #[test]
    fn a_bomb_is_refused() {
        let mut enc = HeaderEncoder::new();
        let big = vec![("x".to_string(), "a".repeat(MAX_BLOCK_BYTES * 4))];
        let block = enc.encode(&big).unwrap();
        assert!(block.len() < 2048, "compresses well");
        assert!(matches!(
            HeaderDecoder::new().decode(&block),
            Err(HeaderCodecError::TooLarge)
        ));
    }

    #[test]
    fn garbage_is_an_error() {
        assert!(HeaderDecoder::new().decode(b"not zlib at all").is_err());
    }
}
