//! SPDY/3.1 frames: what Kubernetes' streaming protocols (exec, attach, port-forward) ride on.
//!
//! Only the frames those protocols use are modelled; the rest are read and skipped. Every
//! length is bounded before anything is allocated.

use bytes::{Buf, BufMut, Bytes, BytesMut};

use super::headers::{HeaderCodecError, HeaderDecoder, HeaderEncoder, Headers};

/// The protocol version in every control frame.
const VERSION: u16 = 3;
/// Control frame header + data frame header size.
pub const FRAME_HEADER_BYTES: usize = 8;
/// The largest frame payload read. Kubernetes' clients write at most 32 KiB at once; the
/// protocol allows 16 MiB, which would let a peer make us buffer that much per frame.
pub const MAX_PAYLOAD_BYTES: usize = 1024 * 1024;
/// The largest data payload written in one frame.
pub const MAX_DATA_CHUNK: usize = 32 * 1024;

const FLAG_FIN: u8 = 0x01;

const TYPE_SYN_STREAM: u16 = 1;
const TYPE_SYN_REPLY: u16 = 2;
const TYPE_RST_STREAM: u16 = 3;
const TYPE_SETTINGS: u16 = 4;
const TYPE_PING: u16 = 6;
const TYPE_GOAWAY: u16 = 7;
const TYPE_HEADERS: u16 = 8;
const TYPE_WINDOW_UPDATE: u16 = 9;

/// RST_STREAM status: the receiver refused a new stream (too many open).
pub const RST_REFUSED_STREAM: u32 = 3;
/// RST_STREAM status: the sender no longer wants the stream.
pub const RST_CANCEL: u32 = 5;
/// RST_STREAM status: a protocol error on the stream.
pub const RST_PROTOCOL_ERROR: u32 = 1;

/// One frame, decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    /// A peer opens a stream.
    SynStream {
        /// Odd from clients, even from servers.
        stream_id: u32,
        /// The opener will send nothing more.
        fin: bool,
        /// The stream's headers.
        headers: Headers,
    },
    /// The receiver of a SynStream accepts it.
    SynReply {
        /// The stream.
        stream_id: u32,
        /// The replier will send nothing more.
        fin: bool,
        /// Reply headers.
        headers: Headers,
    },
    /// A stream ends abnormally.
    RstStream {
        /// The stream.
        stream_id: u32,
        /// Why (one of the `RST_*` constants, or another the peer chose).
        status: u32,
    },
    /// A liveness probe, answered by echoing it.
    Ping {
        /// Odd from clients, even from servers.
        id: u32,
    },
    /// The sender accepts no new streams.
    GoAway {
        /// The last stream the sender accepted.
        last_good_stream_id: u32,
    },
    /// Stream data.
    Data {
        /// The stream.
        stream_id: u32,
        /// The sender will send nothing more on this stream.
        fin: bool,
        /// The bytes.
        data: Bytes,
    },
    /// SETTINGS, HEADERS and WINDOW_UPDATE: read and ignored (Kubernetes' SPDY peers do no
    /// flow control of their own; TCP and the gRPC link behind it do).
    Ignored,
}

/// Why a frame could not be read.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// The payload is larger than [`MAX_PAYLOAD_BYTES`].
    #[error("frame payload of {0} bytes is over the {MAX_PAYLOAD_BYTES}-byte limit")]
    TooLarge(usize),
    /// The control frame names another protocol version.
    #[error("SPDY version {0} is not supported (only 3)")]
    Version(u16),
    /// A frame is shorter than its fields.
    #[error("truncated {0} frame")]
    Truncated(&'static str),
    /// A stream id of 0 where one is required.
    #[error("stream id 0 in a {0} frame")]
    ZeroStream(&'static str),
    /// The header block is unreadable.
    #[error(transparent)]
    Headers(#[from] HeaderCodecError),
}

/// Splits a frame's first 8 bytes: is it a control frame, and how long is its payload.
pub fn payload_len(head: &[u8; FRAME_HEADER_BYTES]) -> Result<usize, FrameError> {
    let len = u32::from_be_bytes([0, head[5], head[6], head[7]]) as usize;
    if len > MAX_PAYLOAD_BYTES {
        return Err(FrameError::TooLarge(len));
    }
    Ok(len)
}

/// Decodes one frame from its 8-byte head and its payload.
pub fn decode(
    head: &[u8; FRAME_HEADER_BYTES],
    mut payload: Bytes,
    headers: &mut HeaderDecoder,
) -> Result<Frame, FrameError> {
    let first = u32::from_be_bytes([head[0], head[1], head[2], head[3]]);
    let flags = head[4];
    let fin = flags & FLAG_FIN != 0;
    if first & 0x8000_0000 == 0 {
        let stream_id = first & 0x7fff_ffff;
        if stream_id == 0 {
            return Err(FrameError::ZeroStream("DATA"));
        }
        return Ok(Frame::Data {
            stream_id,
            fin,
            data: payload,
        });
    }
    let version = ((first >> 16) & 0x7fff) as u16;
    if version != VERSION {
        return Err(FrameError::Version(version));
    }
    let need = |p: &Bytes, n: usize, what: &'static str| {
        if p.len() < n {
            Err(FrameError::Truncated(what))
        } else {
            Ok(())
        }
    };
    match (first & 0xffff) as u16 {
        TYPE_SYN_STREAM => {
            need(&payload, 10, "SYN_STREAM")?;
            let stream_id = payload.get_u32() & 0x7fff_ffff;
            let _associated = payload.get_u32();
            let _priority_and_slot = payload.get_u16();
            if stream_id == 0 {
                return Err(FrameError::ZeroStream("SYN_STREAM"));
            }
            Ok(Frame::SynStream {
                stream_id,
                fin,
                headers: headers.decode(&payload)?,
            })
        }
        TYPE_SYN_REPLY => {
            need(&payload, 4, "SYN_REPLY")?;
            let stream_id = payload.get_u32() & 0x7fff_ffff;
            Ok(Frame::SynReply {
                stream_id,
                fin,
                headers: headers.decode(&payload)?,
            })
        }
        TYPE_RST_STREAM => {
            need(&payload, 8, "RST_STREAM")?;
            Ok(Frame::RstStream {
                stream_id: payload.get_u32() & 0x7fff_ffff,
                status: payload.get_u32(),
            })
        }
        TYPE_PING => {
            need(&payload, 4, "PING")?;
            Ok(Frame::Ping {
                id: payload.get_u32(),
            })
        }
        TYPE_GOAWAY => {
            need(&payload, 4, "GOAWAY")?;
            Ok(Frame::GoAway {
                last_good_stream_id: payload.get_u32() & 0x7fff_ffff,
            })
        }
        TYPE_HEADERS => {
            // Still fed through the decoder: the compression context spans every block.
            need(&payload, 4, "HEADERS")?;
            payload.advance(4);
            headers.decode(&payload)?;
            Ok(Frame::Ignored)
        }
        TYPE_SETTINGS | TYPE_WINDOW_UPDATE => Ok(Frame::Ignored),
        _ => Ok(Frame::Ignored),
    }
}

/// Encodes one frame, appending to `out`.
pub fn encode(
    frame: &Frame,
    headers: &mut HeaderEncoder,
    out: &mut BytesMut,
) -> Result<(), HeaderCodecError> {
    match frame {
        Frame::SynStream {
            stream_id,
            fin,
            headers: h,
        } => {
            let block = headers.encode(h)?;
            control(out, TYPE_SYN_STREAM, flag(*fin), 10 + block.len());
            out.put_u32(*stream_id);
            out.put_u32(0);
            out.put_u16(0);
            out.put_slice(&block);
        }
        Frame::SynReply {
            stream_id,
            fin,
            headers: h,
        } => {
            let block = headers.encode(h)?;
            control(out, TYPE_SYN_REPLY, flag(*fin), 4 + block.len());
            out.put_u32(*stream_id);
            out.put_slice(&block);
        }
        Frame::RstStream { stream_id, status } => {
            control(out, TYPE_RST_STREAM, 0, 8);
            out.put_u32(*stream_id);
            out.put_u32(*status);
        }
        Frame::Ping { id } => {
            control(out, TYPE_PING, 0, 4);
            out.put_u32(*id);
        }
        Frame::GoAway {
            last_good_stream_id,
        } => {
            control(out, TYPE_GOAWAY, 0, 8);
            out.put_u32(*last_good_stream_id);
            out.put_u32(0);
        }
        Frame::Data {
            stream_id,
            fin,
            data,
        } => {
            out.put_u32(stream_id & 0x7fff_ffff);
            out.put_u32((u32::from(flag(*fin)) << 24) | data.len() as u32);
            out.put_slice(data);
        }
        Frame::Ignored => {}
    }
    Ok(())
}

fn flag(fin: bool) -> u8 {
    if fin {
        FLAG_FIN
    } else {
        0
    }
}

fn control(out: &mut BytesMut, kind: u16, flags: u8, len: usize) {
    out.put_u16(0x8000 | VERSION);
    out.put_u16(kind);
    out.put_u32((u32::from(flags) << 24) | len as u32);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(frame: Frame) -> Frame {
        let (mut enc, mut dec) = (HeaderEncoder::new(), HeaderDecoder::new());
        let mut out = BytesMut::new();
        encode(&frame, &mut enc, &mut out).unwrap();
        let head: [u8; 8] = out[..8].try_into().unwrap();
        assert_eq!(payload_len(&head).unwrap(), out.len() - 8);
        decode(&head, out.freeze().slice(8..), &mut dec).unwrap()
    }

    #[test]
    fn frames_survive_a_round_trip() {
        let headers = vec![("streamtype".to_string(), "stdout".to_string())];
        for frame in [
            Frame::SynStream {
                stream_id: 1,
                fin: false,
                headers: headers.clone(),
            },
            Frame::SynReply {
                stream_id: 3,
                fin: true,
                headers: vec![],
            },
            Frame::RstStream {
                stream_id: 5,
                status: RST_CANCEL,
            },
            Frame::Ping { id: 7 },
            Frame::GoAway {
                last_good_stream_id: 9,
            },
            Frame::Data {
                stream_id: 11,
                fin: true,
                data: Bytes::from_static(b"hello"),
            },
        ] {
            assert_eq!(round_trip(frame.clone()), frame);
        }
    }

    #[test]
    fn an_oversize_frame_is_refused_before_reading_it() {
        let head = [0, 0, 0, 1, 0, 0xff, 0xff, 0xff];
        assert!(matches!(payload_len(&head), Err(FrameError::TooLarge(_))));
    }

    #[test]
    fn truncated_and_zero_stream_frames_are_errors() {
        let mut dec = HeaderDecoder::new();
        let rst = [0x80, 3, 0, 3, 0, 0, 0, 2];
        assert!(matches!(
            decode(&rst, Bytes::from_static(&[0, 0]), &mut dec),
            Err(FrameError::Truncated(_))
        ));
        let data = [0, 0, 0, 0, 0, 0, 0, 1];
        assert!(matches!(
            decode(&data, Bytes::from_static(&[1]), &mut dec),
            Err(FrameError::ZeroStream(_))
        ));
    }
}
