//! Ingest wire codec: `Batch` messages encoded once, straight from borrowed records, and
//! decoded into reused buffers.
//!
//! The bytes are the protobuf encoding of `ccld.v1.Batch` exactly as prost writes it
//! (records, field 1, in order, then heartbeats, field 2), so the wire format is unchanged:
//! a client using the generated prost client and a server using the generated prost server
//! interoperate with the ones here in both directions.
//!
//! - [`encode_batch`] writes a `Batch` holding borrowed records and heartbeats into a
//!   buffer without building (cloning into) a `Batch`; [`PreEncodedCodec`] is the client
//!   side tonic codec that sends such bytes as they are.
//! - [`BatchScratch`] decodes a `Batch` into records and heartbeats kept from one message
//!   to the next, so that the strings and vectors of a record are reused instead of
//!   allocated per record; [`RawBatchCodec`] is the server side tonic codec that hands the
//!   message bytes over without decoding them.
//! - [`IngestFastPath`] routes the two ingest methods of the `Analyzer` service to handlers
//!   taking those raw bytes ([`RawIngest`]) and every other method to the generated server.

use std::convert::Infallible;
use std::sync::Arc;

use bytes::{Buf, BufMut, Bytes};
use prost::encoding::{decode_key, message, skip_field, DecodeContext};
use prost::Message;
use tonic::body::Body;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::codegen::{http, BoxFuture, Context, Poll, Service};
use tonic::server::NamedService;
use tonic::{Request, Response, Status, Streaming};

use ccld_wire::{Heartbeat, IngestReply, OpRecord};

/// Field number of `Batch.records`.
pub const BATCH_RECORDS_FIELD: u32 = 1;
/// Field number of `Batch.heartbeats`.
pub const BATCH_HEARTBEATS_FIELD: u32 = 2;
/// gRPC path of the client-streaming ingest method.
pub const INGEST_PATH: &str = "/ccld.v1.Analyzer/Ingest";
/// gRPC path of the unary ingest method.
pub const INGEST_ONE_PATH: &str = "/ccld.v1.Analyzer/IngestOne";

/// Records kept decoded between messages by a [`BatchScratch`] at most (a larger message
/// is decoded, then the surplus is freed).
pub const SCRATCH_KEEP_RECORDS: usize = 16 * 1024;

/// Appends the protobuf encoding of `Batch { records, heartbeats }` to `buf`: the same
/// bytes as `Batch::encode`, without cloning the records into a `Batch`.
pub fn encode_batch<'a>(
    records: impl IntoIterator<Item = &'a OpRecord>,
    heartbeats: impl IntoIterator<Item = &'a Heartbeat>,
    buf: &mut impl BufMut,
) {
    for r in records {
        message::encode(BATCH_RECORDS_FIELD, r, buf);
    }
    for h in heartbeats {
        message::encode(BATCH_HEARTBEATS_FIELD, h, buf);
    }
}

/// Length in bytes of the encoding [`encode_batch`] writes for the same arguments.
pub fn encoded_batch_len<'a>(
    records: impl IntoIterator<Item = &'a OpRecord>,
    heartbeats: impl IntoIterator<Item = &'a Heartbeat>,
) -> usize {
    records
        .into_iter()
        .map(|r| message::encoded_len(BATCH_RECORDS_FIELD, r))
        .sum::<usize>()
        + heartbeats
            .into_iter()
            .map(|h| message::encoded_len(BATCH_HEARTBEATS_FIELD, h))
            .sum::<usize>()
}

/// A `Batch` message that could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed Batch message at byte {offset} of {len} ({what}): {reason}")]
pub struct BatchDecodeError {
    /// Offset of the field that failed, from the start of the message.
    pub offset: usize,
    /// Message length.
    pub len: usize,
    /// Which field: `"record 12"`, `"heartbeat 0"`, `"field key"`, `"unknown field 7"`.
    pub what: String,
    /// prost's description.
    pub reason: String,
}

impl From<BatchDecodeError> for Status {
    fn from(e: BatchDecodeError) -> Status {
        Status::invalid_argument(e.to_string())
    }
}

/// Decoded records and heartbeats of one `Batch` message, kept for the next message: a
/// record's strings and vectors keep their capacity, so decoding a stream of similar
/// batches allocates almost nothing once warm.
#[derive(Debug, Default)]
pub struct BatchScratch {
    records: Vec<OpRecord>,
    used: usize,
    heartbeats: Vec<Heartbeat>,
}

impl BatchScratch {
    /// An empty scratch.
    pub fn new() -> Self {
        Self::default()
    }

    /// Decodes one `Batch` message (protobuf bytes, the gRPC frame's payload), replacing
    /// what the scratch held. Decodes to the same records and heartbeats as
    /// `Batch::decode`; unknown fields are skipped as prost skips them. On error the
    /// scratch holds nothing (a batch is taken whole or not at all).
    pub fn decode(&mut self, bytes: &[u8]) -> Result<(), BatchDecodeError> {
        self.used = 0;
        self.heartbeats.clear();
        let r = self.decode_inner(bytes);
        if r.is_err() {
            self.used = 0;
            self.heartbeats.clear();
        }
        r
    }

    fn decode_inner(&mut self, bytes: &[u8]) -> Result<(), BatchDecodeError> {
        let len = bytes.len();
        let mut buf = bytes;
        while buf.has_remaining() {
            let offset = len - buf.remaining();
            let fail = |what: String, e: prost::DecodeError| BatchDecodeError {
                offset,
                len,
                what,
                reason: e.to_string(),
            };
            let (tag, wire_type) = decode_key(&mut buf).map_err(|e| fail("field key".into(), e))?;
            match tag {
                BATCH_RECORDS_FIELD => {
                    let i = self.used;
                    if i == self.records.len() {
                        self.records.push(OpRecord::default());
                    } else {
                        self.records[i].clear();
                    }
                    message::merge(
                        wire_type,
                        &mut self.records[i],
                        &mut buf,
                        DecodeContext::default(),
                    )
                    .map_err(|e| fail(format!("record {i}"), e))?;
                    self.used += 1;
                }
                BATCH_HEARTBEATS_FIELD => {
                    let i = self.heartbeats.len();
                    let mut h = Heartbeat::default();
                    message::merge(wire_type, &mut h, &mut buf, DecodeContext::default())
                        .map_err(|e| fail(format!("heartbeat {i}"), e))?;
                    self.heartbeats.push(h);
                }
                _ => skip_field(wire_type, tag, &mut buf, DecodeContext::default())
                    .map_err(|e| fail(format!("unknown field {tag}"), e))?,
            }
        }
        Ok(())
    }

    /// Records of the last decoded message.
    pub fn records(&self) -> &[OpRecord] {
        &self.records[..self.used]
    }

    /// Heartbeats of the last decoded message.
    pub fn heartbeats(&self) -> &[Heartbeat] {
        &self.heartbeats
    }

    /// Frees records beyond [`SCRATCH_KEEP_RECORDS`] (after an unusually large message).
    pub fn trim(&mut self) {
        if self.records.len() > SCRATCH_KEEP_RECORDS {
            self.records.truncate(SCRATCH_KEEP_RECORDS);
            self.records.shrink_to_fit();
            self.used = self.used.min(SCRATCH_KEEP_RECORDS);
        }
    }
}

/// Client codec of the ingest methods: sends already-encoded `Batch` bytes as they are
/// (see [`encode_batch`]) and decodes the `IngestReply`.
#[derive(Debug, Clone, Copy, Default)]
pub struct PreEncodedCodec;

/// Encoder of [`PreEncodedCodec`]: copies the bytes into the frame.
#[derive(Debug, Clone, Copy, Default)]
pub struct BytesEncoder;

impl Encoder for BytesEncoder {
    type Item = Bytes;
    type Error = Status;

    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.reserve(item.len());
        dst.put(item);
        Ok(())
    }
}

/// Decoder of a prost message `M` (the reply of [`PreEncodedCodec`], the request of
/// nothing here); a decode error is an `Internal` status, as tonic-prost reports it.
#[derive(Debug)]
pub struct ProstDecoder<M>(std::marker::PhantomData<M>);

impl<M> Default for ProstDecoder<M> {
    fn default() -> Self {
        Self(std::marker::PhantomData)
    }
}

impl<M: Message + Default> Decoder for ProstDecoder<M> {
    type Item = M;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<M>, Status> {
        M::decode(src)
            .map(Some)
            .map_err(|e| Status::internal(e.to_string()))
    }
}

/// Encoder of a prost message `M` (the reply of [`RawBatchCodec`]).
#[derive(Debug)]
pub struct ProstEncoder<M>(std::marker::PhantomData<M>);

impl<M> Default for ProstEncoder<M> {
    fn default() -> Self {
        Self(std::marker::PhantomData)
    }
}

impl<M: Message> Encoder for ProstEncoder<M> {
    type Item = M;
    type Error = Status;

    fn encode(&mut self, item: M, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        item.encode(dst)
            .map_err(|e| Status::internal(format!("encoding the reply: {e}")))
    }
}

impl Codec for PreEncodedCodec {
    type Encode = Bytes;
    type Decode = IngestReply;
    type Encoder = BytesEncoder;
    type Decoder = ProstDecoder<IngestReply>;

    fn encoder(&mut self) -> BytesEncoder {
        BytesEncoder
    }

    fn decoder(&mut self) -> ProstDecoder<IngestReply> {
        ProstDecoder::default()
    }
}

/// Server codec of the ingest methods: hands each request message's bytes over undecoded
/// (zero-copy out of tonic's receive buffer) and encodes the `IngestReply`.
#[derive(Debug, Clone, Copy, Default)]
pub struct RawBatchCodec;

/// Decoder of [`RawBatchCodec`].
#[derive(Debug, Clone, Copy, Default)]
pub struct BytesDecoder;

impl Decoder for BytesDecoder {
    type Item = Bytes;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, Status> {
        let n = src.remaining();
        Ok(Some(src.copy_to_bytes(n)))
    }
}

impl Codec for RawBatchCodec {
    type Encode = IngestReply;
    type Decode = Bytes;
    type Encoder = ProstEncoder<IngestReply>;
    type Decoder = BytesDecoder;

    fn encoder(&mut self) -> ProstEncoder<IngestReply> {
        ProstEncoder::default()
    }

    fn decoder(&mut self) -> BytesDecoder {
        BytesDecoder
    }
}

/// Handlers of the two ingest methods taking the raw `Batch` bytes.
#[tonic::async_trait]
pub trait RawIngest: Send + Sync + 'static {
    /// `Ingest` (client streaming).
    async fn ingest_raw(
        &self,
        request: Request<Streaming<Bytes>>,
    ) -> Result<Response<IngestReply>, Status>;
    /// `IngestOne` (unary).
    async fn ingest_one_raw(
        &self,
        request: Request<Bytes>,
    ) -> Result<Response<IngestReply>, Status>;
}

/// The `Analyzer` service with its ingest methods served by a [`RawIngest`] (decoding
/// with [`BatchScratch`]) and every other method by `inner` (the generated server).
#[derive(Debug)]
pub struct IngestFastPath<S, H> {
    inner: S,
    handler: Arc<H>,
    max_decoding_message_size: usize,
}

impl<S: Clone, H> Clone for IngestFastPath<S, H> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            handler: self.handler.clone(),
            max_decoding_message_size: self.max_decoding_message_size,
        }
    }
}

impl<S, H> IngestFastPath<S, H> {
    /// Wraps `inner`; ingest messages larger than `max_decoding_message_size` are refused
    /// (as the generated server refuses them).
    pub fn new(inner: S, handler: Arc<H>, max_decoding_message_size: usize) -> Self {
        Self {
            inner,
            handler,
            max_decoding_message_size,
        }
    }
}

impl<S, H> NamedService for IngestFastPath<S, H> {
    const NAME: &'static str = crate::grpc::analyzer_server::SERVICE_NAME;
}

struct OneSvc<H>(Arc<H>);

impl<H: RawIngest> tonic::server::UnaryService<Bytes> for OneSvc<H> {
    type Response = IngestReply;
    type Future = BoxFuture<Response<IngestReply>, Status>;

    fn call(&mut self, request: Request<Bytes>) -> Self::Future {
        let h = self.0.clone();
        Box::pin(async move { h.ingest_one_raw(request).await })
    }
}

struct StreamSvc<H>(Arc<H>);

impl<H: RawIngest> tonic::server::ClientStreamingService<Bytes> for StreamSvc<H> {
    type Response = IngestReply;
    type Future = BoxFuture<Response<IngestReply>, Status>;

    fn call(&mut self, request: Request<Streaming<Bytes>>) -> Self::Future {
        let h = self.0.clone();
        Box::pin(async move { h.ingest_raw(request).await })
    }
}

impl<S, H> Service<http::Request<Body>> for IngestFastPath<S, H>
where
    S: Service<http::Request<Body>, Response = http::Response<Body>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    H: RawIngest,
{
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<http::Response<Body>, Infallible>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        let max = self.max_decoding_message_size;
        match req.uri().path() {
            INGEST_ONE_PATH => {
                let svc = OneSvc(self.handler.clone());
                Box::pin(async move {
                    let mut g =
                        tonic::server::Grpc::new(RawBatchCodec).max_decoding_message_size(max);
                    Ok(g.unary(svc, req).await)
                })
            }
            INGEST_PATH => {
                let svc = StreamSvc(self.handler.clone());
                Box::pin(async move {
                    let mut g =
                        tonic::server::Grpc::new(RawBatchCodec).max_decoding_message_size(max);
                    Ok(g.client_streaming(svc, req).await)
                })
            }
            _ => {
                let fut = self.inner.call(req);
                Box::pin(fut)
            }
        }
    }
}

#[cfg(test)]
mod tests;
